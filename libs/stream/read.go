package stream

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	clientv3 "go.etcd.io/etcd/client/v3"

	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// Reader is the part of a jetstream.Stream the read functions use.
type Reader interface {
	Info(ctx context.Context, opts ...jetstream.StreamInfoOpt) (*jetstream.StreamInfo, error)
	GetMsg(ctx context.Context, seq uint64, opts ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error)
}

var _ Reader = jetstream.Stream(nil)

// ErrEmpty: the stream holds no message.
var ErrEmpty = errors.New("the stream is empty")

// ReadAt reads the record at stream sequence seq. The error wraps
// jetstream.ErrMsgNotFound when the stream does not hold seq (never did, or
// it aged out).
func ReadAt(ctx context.Context, s Reader, seq uint64) (*heraldv1.Record, error) {
	msg, err := s.GetMsg(ctx, seq)
	if err != nil {
		return nil, fmt.Errorf("reading stream message %d: %w", seq, err)
	}
	rec, err := Decode(msg.Data)
	if err != nil {
		return nil, fmt.Errorf("stream message %d: %w", seq, err)
	}
	return rec, nil
}

// Last returns the stream's last sequence and its record; rec is nil when
// the stream is empty (lastSeq is then the sequence the next append
// follows, 0 for a new stream).
func Last(ctx context.Context, s Reader) (lastSeq uint64, rec *heraldv1.Record, err error) {
	info, err := s.Info(ctx)
	if err != nil {
		return 0, nil, fmt.Errorf("stream info: %w", err)
	}
	lastSeq = info.State.LastSeq
	if info.State.Msgs == 0 {
		return lastSeq, nil, nil
	}
	rec, err = ReadAt(ctx, s, lastSeq)
	if err != nil {
		return 0, nil, err
	}
	return lastSeq, rec, nil
}

// SeqAfter finds the first stream sequence holding a revision after rev
// (binary search: revisions never decrease along the stream), or the
// sequence after the last when there is none. A split revision is found at
// its part 0, if the stream still holds it.
func SeqAfter(ctx context.Context, s Reader, rev int64) (uint64, error) {
	info, err := s.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("stream info: %w", err)
	}
	lo, hi := info.State.FirstSeq, info.State.LastSeq+1
	if info.State.Msgs == 0 {
		return hi, nil
	}
	for lo < hi {
		mid := lo + (hi-lo)/2
		rec, err := ReadAt(ctx, s, mid)
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				lo = mid + 1 // aged out meanwhile
				continue
			}
			return 0, err
		}
		if rec.Revision > rev {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo, nil
}

// HistoryStart returns the revision after which the stream's history is
// complete: every revision after it that changed anything is in the stream.
// The first record tells: a marker at R says everything up to R was
// appended (R itself included); a revision's part 0 says the revisions before
// it had nothing to append (or aged out before it); a later part says its
// revision is incomplete, so only what follows it is whole.
func HistoryStart(ctx context.Context, s Reader) (int64, error) {
	info, err := s.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("stream info: %w", err)
	}
	if info.State.Msgs == 0 {
		return 0, ErrEmpty
	}
	return RevisionBefore(ctx, s, info.State.FirstSeq)
}

// RevisionBefore returns the revision after which the stream, read from
// sequence seq on, is complete: the state at that revision plus every
// record from seq is the state at the stream's head. The record at seq
// tells, as for HistoryStart (which is RevisionBefore the first sequence).
func RevisionBefore(ctx context.Context, s Reader, seq uint64) (int64, error) {
	rec, err := ReadAt(ctx, s, seq)
	if err != nil {
		return 0, err
	}
	if !IsMarker(rec) && rec.Part == 0 {
		return rec.Revision - 1, nil
	}
	return rec.Revision, nil
}

// RevProbeKey is the key read to learn etcd's current revision: a
// linearizable read of one key outside the object prefix, whose response
// header carries the revision. The key itself need not exist.
const RevProbeKey = "/herald/rev-probe"

// CurrentRevision reads etcd's current revision (a linearizable read).
func CurrentRevision(ctx context.Context, kv clientv3.KV) (int64, error) {
	resp, err := kv.Get(ctx, RevProbeKey)
	if err != nil {
		return 0, fmt.Errorf("reading etcd's revision: %w", err)
	}
	return resp.Header.Revision, nil
}
