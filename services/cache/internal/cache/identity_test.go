package cache

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// readingStream is a stream whose consumer goes on reading while its info is
// asked for: every Info reports the sequences read so far (LastSeq, or
// behind by back) and then lets the consumer read five more.
type readingStream struct {
	created time.Time
	reading *atomic.Uint64
	back    uint64
	calls   atomic.Int32
	done    func()
}

func (r *readingStream) Info(context.Context, ...jetstream.StreamInfoOpt) (*jetstream.StreamInfo, error) {
	last := r.reading.Load() - 1 - r.back
	r.reading.Add(5)
	if r.calls.Add(1) == 3 {
		r.done()
	}
	return &jetstream.StreamInfo{Created: r.created, State: jetstream.StreamState{LastSeq: last}}, nil
}

func (r *readingStream) GetMsg(context.Context, uint64, ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
	return nil, jetstream.ErrMsgNotFound
}

// A stream that grows while the shard reads it is the same stream: only one
// whose last sequence went back below what the shard read (or whose creation
// time changed) was deleted and created again.
func TestWatchIdentityWhileReading(t *testing.T) {
	for _, tc := range []struct {
		name     string
		back     uint64
		wantLost bool
	}{
		{"the stream grows while its info is asked for", 0, false},
		{"the stream went back", 3, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Shard{log: slog.New(slog.DiscardHandler)}
			s.cfg.Stream = "HERALD"
			created := time.Unix(1700000000, 0)
			var reading atomic.Uint64
			reading.Store(100)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			st := &readingStream{created: created, reading: &reading, back: tc.back, done: cancel}
			var lost atomic.Bool
			s.watchIdentity(ctx, st, created, &reading, func() { lost.Store(true) })
			if lost.Load() != tc.wantLost {
				t.Fatalf("lost = %v after %d checks, want %v", lost.Load(), st.calls.Load(), tc.wantLost)
			}
		})
	}
}
