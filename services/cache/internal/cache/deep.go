package cache

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/stream"
	"herald.dev/services/cache/internal/watchevent"
)

// deepReplay sends the events of rs (in namespace, or all) with revisions in
// (after, upTo], read from the stream's retained history: a resume slightly
// older than the memory window is served instead of answered 410, as long as
// the stream still holds that history. The previous state of a modified
// object, needed for selector transitions, comes from an earlier record of
// the same replay or from etcd's history at the revision before.
//
// Memory is bounded per replay: records are read from the stream and sent
// as they come (send blocks on the gRPC stream's flow control, so a slow
// reader slows the replay, it does not buffer it), and only the last state
// of each object met on the way is kept. The caller holds a deep-replay slot
// (see deepSlot); the replay stops as soon as ctx ends (its client went
// away).
func (s *Shard) deepReplay(ctx context.Context, rs *resourceState, namespace string, after, upTo int64, send func(*event) error) error {
	tooOld := func() error {
		return status.Error(codes.OutOfRange, fmt.Sprintf("too old resource version: %d (%d)", after, upTo+1))
	}
	s.m.deepReplays.Inc()
	// Everything a replay asks of NATS (the stream's bounds, the binary
	// search for its start, its consumer) happens inside the slot: a wave
	// of resumes costs the server at most --deep-replay.concurrency readers
	// at a time, however many wait.
	st, err := s.js.Stream(ctx, s.cfg.Stream)
	if err != nil {
		return status.Errorf(codes.Unavailable, "stream: %v", err)
	}
	if start, err := stream.HistoryStart(ctx, st); err != nil || after < start {
		return tooOld()
	}
	seq, err := stream.SeqAfter(ctx, st, after)
	if err != nil {
		return status.Errorf(codes.Unavailable, "stream: %v", err)
	}
	subjects := []string{stream.SubjectMulti, stream.SubjectProgress}
	switch {
	case namespace != "":
		subjects = append(subjects, stream.Subject(rs.res, namespace))
	case rs.parts != nil:
		// Only the owned partitions: a shard of a split resource reads
		// its share of the history, not all of it.
		for p := range kube.Partitions {
			if rs.parts[p] {
				subjects = append(subjects, stream.PartitionSubject(rs.res, p))
			}
		}
	default:
		subjects = append(subjects, stream.Filter(rs.res))
	}
	it, err := stream.Consume(ctx, st, subjects, seq)
	if err != nil {
		return status.Errorf(codes.Unavailable, "%v", err)
	}
	defer it.Stop()
	seen := map[string]*kube.Object{}
	var asm stream.Assembler
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return status.Errorf(codes.Unavailable, "reading the stream: %v", err)
		}
		rec, err := stream.Decode(msg.Data())
		if err != nil {
			continue
		}
		if rec.Revision > upTo {
			return nil
		}
		if rec.Resync {
			return tooOld() // the history has a gap
		}
		if rec.Progress {
			if rec.Revision >= upTo {
				return nil
			}
			continue
		}
		changes, complete := asm.Add(rec)
		if !complete {
			continue
		}
		for _, c := range changes {
			ev, err := s.historicEvent(ctx, rs, namespace, rec.Revision, c, seen)
			if err != nil {
				return err
			}
			if ev != nil {
				if err := send(ev); err != nil {
					return err
				}
			}
		}
		if rec.Revision == upTo {
			return nil
		}
	}
}

// deepSlot waits for one of the --deep-replay.concurrency slots of deep
// replays and then calls started, which sends what the watch has so far: a
// client merging several shards (libs/cacheclient) learns from that first
// response that this shard's replay runs before it asks the next shard.
//
// A watch holds its slot until its replay has reached the window, however
// many rounds that takes (the window moves on while a long replay runs):
// released between rounds, the watch would queue for this shard again while
// it may hold the next shard's slot, and two such watches, each holding what
// the other waits for, would wait forever. Taken once per shard, in the
// shards' order, the slots cannot form such a cycle.
func (s *Shard) deepSlot(ctx context.Context, started func() error) (release func(), err error) {
	release, err = s.deep.Acquire(ctx)
	if err != nil {
		return nil, status.FromContextError(err).Err()
	}
	if err := started(); err != nil {
		release()
		return nil, err
	}
	return release, nil
}

// historicEvent rebuilds the event of one change read from the stream.
func (s *Shard) historicEvent(ctx context.Context, rs *resourceState, namespace string, rev int64, c *heraldv1.Change, seen map[string]*kube.Object) (*event, error) {
	r, ns, name, ok := s.reg.ParseKey(c.Key)
	if !ok || !slices.Contains(r.Readers(), rs.res) || (namespace != "" && ns != namespace) {
		return nil, nil
	}
	r = rs.res
	if _, owned := s.owns(r, ns); !owned {
		return nil, nil
	}
	var prev *kube.Object
	ev, obj, err := watchevent.FromChange(ctx, s.history, r, ns, name, rev, c, func() (o *kube.Object, err error) {
		switch {
		case c.Kind == heraldv1.Change_DELETE:
			prev = seen[c.Key]
		case c.CreateRevision == rev:
			// created at rev: there was nothing before
		default:
			prev, err = s.previous(ctx, r, ns, name, c.Key, rev, seen)
		}
		return prev, err
	})
	if errors.Is(err, kube.ErrInvalidObject) {
		return nil, nil // skipped when it was applied, too
	}
	if err != nil {
		return nil, err
	}
	switch {
	case obj != nil:
		seen[c.Key] = obj
	case c.Kind == heraldv1.Change_DELETE:
		delete(seen, c.Key)
	}
	if ev == nil {
		return nil, nil
	}
	return prepared(ev, prev), nil
}

// previous returns the object's state just before rev.
func (s *Shard) previous(ctx context.Context, r *kube.Resource, ns, name, key string, rev int64, seen map[string]*kube.Object) (*kube.Object, error) {
	if o, ok := seen[key]; ok {
		return o, nil
	}
	resp, err := s.etcd.Get(ctx, key, clientv3.WithRev(rev-1))
	if errors.Is(err, rpctypes.ErrCompacted) {
		return nil, status.Error(codes.OutOfRange, fmt.Sprintf("too old resource version: %d (etcd compacted the history needed to replay it)", rev-1))
	}
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "etcd: %v", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	o, err := s.history.Decode(ctx, r, key, ns, name, resp.Kvs[0].Value, resp.Kvs[0].ModRevision)
	if err != nil {
		return nil, nil // skipped when it was applied, too
	}
	return o, nil
}
