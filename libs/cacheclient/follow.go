package cacheclient

import (
	"errors"
	"fmt"
	"io"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// shardBatch is what one shard's following stream delivered: its events
// (never splitting a revision) and the revision it has now sent everything
// up to.
type shardBatch struct {
	shard   int
	events  []*heraldv1.Event
	through int64
	start   bool // the stream's opening bookmark
	err     error
}

// follower merges the shards' following streams (see the package comment).
// Its state is the Recv caller's: only the shard goroutines' batches cross
// goroutines, over batches.
type follower struct {
	s       *stream
	batches chan shardBatch
	m       *merge
	started []bool
	// start: the merged stream is complete after it (the latest of the
	// shards' starts); head: the revision it has been delivered through.
	start, head int64
	opening     bool // the opening bookmark is due
}

// follow merges the shards' streams after `after` (0: from each shard's
// current revision, the merged stream starting after the latest of them).
func (s *stream) follow(after int64) func() (*heraldv1.WatchResponse, error) {
	n := len(s.clients)
	f := &follower{s: s, batches: make(chan shardBatch, 4*n), m: newMerge(n), started: make([]bool, n)}
	if after > 0 {
		f.start, f.head, f.opening = after, after, true
		for i := range f.started {
			f.started[i], f.m.through[i] = true, after
		}
	}
	for i := range s.clients {
		go f.follow(i, after)
	}
	return f.next
}

func (f *follower) next() (*heraldv1.WatchResponse, error) {
	if f.opening {
		f.opening = false
		return &heraldv1.WatchResponse{Events: []*heraldv1.Event{bookmark(f.start)}}, nil
	}
	ctx := f.s.ctx
	for {
		var b shardBatch
		select {
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		case b = <-f.batches:
		}
		if b.err != nil {
			if status.Code(b.err) == codes.OutOfRange {
				return nil, b.err
			}
			f.s.c.log.Info("upstream watch ended; resuming", "resource", f.s.req.Resource, "shard", b.shard, "after", f.m.through[b.shard], "err", b.err)
			go f.resume(b.shard, f.m.through[b.shard])
			continue
		}
		if b.start && !f.started[b.shard] {
			f.started[b.shard] = true
			f.m.through[b.shard] = b.through
			if all(f.started) {
				for _, t := range f.m.through {
					f.start = max(f.start, t)
				}
				f.head = f.start
				return &heraldv1.WatchResponse{Events: []*heraldv1.Event{bookmark(f.start)}}, nil
			}
			continue
		}
		f.m.add(b.shard, b.events, b.through)
		var evs []*heraldv1.Event
		if all(f.started) {
			for _, ev := range f.m.release(nil) {
				if ev.Revision <= f.start || ev.Revision < f.head {
					continue // before the merged start, or already delivered
				}
				evs = append(evs, ev)
				f.head = ev.Revision
			}
			if safe := f.m.safe(); safe > f.head {
				f.head = safe
				evs = append(evs, bookmark(safe))
			}
		}
		// Held back: what waits for a lagging shard, or for one that has not
		// started yet.
		if lim := f.s.c.limits; f.m.held > lim.Events || f.m.heldBytes > lim.Bytes {
			lag := f.m.lagging()
			return nil, &LagError{Resource: f.s.req.Resource, Shard: lag, Through: f.m.through[lag], Head: slices.Max(f.m.through),
				Events: f.m.held, Bytes: f.m.heldBytes}
		}
		if len(evs) > 0 {
			return &heraldv1.WatchResponse{Events: evs}, nil
		}
	}
}

// LagError ends a following watch over several shards when the events the
// merge holds back, waiting for a shard that lags behind the others, pass
// its limits (MergeLimits): holding them longer would grow without bound.
// Nothing is lost: the caller starts over (its watchers resume from their
// resourceVersions). It is a gRPC ResourceExhausted.
type LagError struct {
	Resource string
	Shard    int   // the lagging shard, in the order of the shard map
	Through  int64 // the revision it has sent everything up to
	Head     int64 // the furthest any shard has got
	Events   int   // held back
	Bytes    int64 // of their objects
}

func (e *LagError) Error() string {
	return fmt.Sprintf("cache shard %d of %s lags at revision %d (others at %d): %d events (%d bytes) held back, past the merge limits",
		e.Shard, e.Resource, e.Through, e.Head, e.Events, e.Bytes)
}

// GRPCStatus makes a LagError a ResourceExhausted status.
func (e *LagError) GRPCStatus() *status.Status { return status.New(codes.ResourceExhausted, e.Error()) }

func all(bs []bool) bool {
	for _, b := range bs {
		if !b {
			return false
		}
	}
	return true
}

// follow streams one shard from after (0: from its current revision, its
// opening bookmark sent as the start) into batches until the stream fails.
func (f *follower) follow(shard int, after int64) {
	ctx := f.s.ctx
	send := func(b shardBatch) bool {
		select {
		case f.batches <- b:
			return true
		case <-ctx.Done():
			return false
		}
	}
	req := &heraldv1.WatchRequest{Resource: f.s.req.Resource, Namespace: f.s.req.Namespace, AfterRevision: after, Follow: true,
		OmitUnchangedPrev: f.s.req.OmitUnchangedPrev, WithProtobuf: f.s.req.WithProtobuf}
	st, err := f.s.clients[shard].Watch(ctx, req, f.s.opts...)
	if err != nil {
		send(shardBatch{shard: shard, err: err})
		return
	}
	f.s.noteExpiredThrough(st)
	first := true
	for {
		resp, err := st.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = status.Error(codes.Unavailable, "upstream stream ended")
			}
			send(shardBatch{shard: shard, err: err})
			return
		}
		b := shardBatch{shard: shard}
		for _, ev := range resp.Events {
			if first {
				// The opening bookmark: at the shard's current revision
				// (the start), or at after.
				first = false
				if after == 0 && !send(shardBatch{shard: shard, start: true, through: ev.Revision}) {
					return
				}
				continue
			}
			b.through = max(b.through, ev.Revision)
			if ev.Type != heraldv1.EventType_BOOKMARK {
				b.events = append(b.events, ev)
			}
		}
		if b.through > 0 && !send(b) {
			return
		}
	}
}

// resume reopens a broken shard stream after a short pause.
func (f *follower) resume(shard int, after int64) {
	select {
	case <-f.s.ctx.Done():
		return
	case <-f.s.c.clock.After(resumePause):
	}
	f.follow(shard, after)
}
