package cache

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// streamState is a stream.Reader that only answers Info.
type streamState struct {
	first, last uint64
	err         error
}

func (s streamState) Info(context.Context, ...jetstream.StreamInfoOpt) (*jetstream.StreamInfo, error) {
	if s.err != nil {
		return nil, s.err
	}
	return &jetstream.StreamInfo{State: jetstream.StreamState{FirstSeq: s.first, LastSeq: s.last}}, nil
}

func (s streamState) GetMsg(context.Context, uint64, ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
	return nil, jetstream.ErrMsgNotFound
}

// TestGap: the shard's next sequence is either still in the stream (what
// the consumer skipped was other subjects') or it is not (lost messages,
// the shard must rebuild).
func TestGap(t *testing.T) {
	var s Shard
	for _, tc := range []struct {
		name  string
		st    streamState
		next  uint64
		lost  bool
		isErr bool
	}{
		{"next still held", streamState{first: 10, last: 100}, 50, false, false},
		{"next is the first", streamState{first: 50, last: 100}, 50, false, false},
		{"next is the one after the last", streamState{first: 10, last: 49}, 50, false, false},
		{"aged out or purged past next", streamState{first: 51, last: 100}, 50, true, false},
		{"purged empty past next", streamState{first: 101, last: 100}, 50, true, false},
		{"stream created again", streamState{first: 1, last: 3}, 50, true, false},
		{"stream info fails", streamState{err: errors.New("timeout")}, 50, false, true},
	} {
		lost, err := s.gap(context.Background(), tc.st, tc.next)
		if lost != tc.lost || (err != nil) != tc.isErr {
			t.Errorf("%s: gap = %v, %v; want %v, error %v", tc.name, lost, err, tc.lost, tc.isErr)
		}
	}
}
