package fanout

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// hub is the one upstream a fanout replica holds per resource, shared by all
// its watchers of that resource: one following cache watch per shard serving
// the resource (one for an unsplit resource), merged by revision.
//
// Invariants (under mu):
//   - ring holds, oldest first, every event of the resource with revision
//     > ringStart, up to head; head only grows.
//   - an event is dispatched only once every shard has sent everything up
//     to its revision (each shard's "through"), so the merged order is the
//     revision order.
//   - a registered watcher has been handed every event after the revision
//     it joined at, in order, by dispatch (or was closed).
type hub struct {
	res    *kube.Resource
	shards []heraldv1.CacheClient
	tracer trace.Tracer // nil: tracing off
	log    *slog.Logger
	m      *metrics
	limits ringLimits
	synced chan struct{} // closed once every shard's stream has started

	mu        sync.Mutex
	ring      []*item
	ringBytes int // sum of the ring's items' cost
	ringStart int64
	head      atomic.Int64
	watchers  watcherIndex
	// isSynced: ringStart and head are known (the upstreams started and
	// have not lost continuity since).
	isSynced bool
}

// ringLimits bound a hub's ring of recent events: at most events items and
// about bytes of event data. A watcher that resumes or joins within the ring
// is caught up from it, with the events already encoded; one that is further
// behind costs a replay from the cache, encoded for it alone.
type ringLimits struct{ events, bytes int }

func newHub(res *kube.Resource, shards []heraldv1.CacheClient, limits ringLimits, log *slog.Logger, m *metrics) *hub {
	return &hub{res: res, shards: shards, limits: limits, log: log.With("resource", res.ID()), m: m,
		synced: make(chan struct{}), watchers: newWatcherIndex()}
}

// shardBatch is what one shard's stream delivered: its events (never
// splitting a revision) and the revision it has now sent everything up to.
type shardBatch struct {
	shard   int
	events  []*heraldv1.Event
	through int64
	start   bool // the stream's opening bookmark
	err     error
}

// run keeps the upstreams open until ctx ends.
func (h *hub) run(ctx context.Context) {
	for ctx.Err() == nil {
		err := h.runOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		h.m.upstreamRestarts.WithLabelValues(h.res.ID()).Inc()
		h.log.Warn("upstream lost continuity; resetting", "err", err)
		h.reset()
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// runOnce merges the shards' streams until continuity is lost. A shard
// stream that breaks is resumed after its own "through", so no event is
// lost; only a shard that cannot resume (OutOfRange) ends the merge.
func (h *hub) runOnce(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n := len(h.shards)
	batches := make(chan shardBatch, 4*n)
	through := make([]int64, n)
	started := make([]bool, n)
	pending := make([][]*heraldv1.Event, n)
	for i := range h.shards {
		go h.follow(ctx, i, 0, batches)
	}
	for {
		var b shardBatch
		select {
		case <-ctx.Done():
			return ctx.Err()
		case b = <-batches:
		}
		if b.err != nil {
			if status.Code(b.err) == codes.OutOfRange {
				return b.err
			}
			h.log.Info("upstream watch ended; resuming", "shard", b.shard, "after", through[b.shard], "err", b.err)
			go h.resume(ctx, b.shard, through[b.shard], batches)
			continue
		}
		if b.start && !started[b.shard] {
			started[b.shard] = true
			through[b.shard] = b.through
			if all(started) {
				// The merged stream is complete after the latest start:
				// every shard sends everything after its own start.
				var start int64
				for _, t := range through {
					start = max(start, t)
				}
				h.mu.Lock()
				h.ringStart = start
				h.head.Store(start)
				h.isSynced = true
				h.mu.Unlock()
				select {
				case <-h.synced:
				default:
					close(h.synced)
				}
			}
			continue
		}
		pending[b.shard] = append(pending[b.shard], b.events...)
		through[b.shard] = max(through[b.shard], b.through)
		if !all(started) {
			continue
		}
		h.flush(pending, through)
	}
}

func all(bs []bool) bool {
	for _, b := range bs {
		if !b {
			return false
		}
	}
	return true
}

// flush dispatches, in revision order, every pending event that all shards
// have passed.
func (h *hub) flush(pending [][]*heraldv1.Event, through []int64) {
	safe := through[0]
	for _, t := range through[1:] {
		safe = min(safe, t)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for {
		best := -1
		for i, p := range pending {
			if len(p) > 0 && p[0].Revision <= safe && (best < 0 || p[0].Revision < pending[best][0].Revision) {
				best = i
			}
		}
		if best < 0 {
			break
		}
		ev := pending[best][0]
		pending[best][0] = nil
		pending[best] = pending[best][1:]
		if ev.Revision <= h.ringStart || ev.Revision < h.head.Load() {
			continue // before the merged start, or already dispatched
		}
		h.dispatchTraced(newItem(ev))
	}
	if safe > h.head.Load() {
		h.head.Store(safe)
	}
}

// follow streams one shard from after (0: from its current revision) into
// batches until the stream fails.
func (h *hub) follow(ctx context.Context, shard int, after int64, out chan<- shardBatch) {
	send := func(b shardBatch) bool {
		select {
		case out <- b:
			return true
		case <-ctx.Done():
			return false
		}
	}
	// Wait for a ready connection: a replica may be restarting, and the
	// stream is long-lived anyway.
	st, err := h.shards[shard].Watch(ctx, &heraldv1.WatchRequest{Resource: h.res.ID(), AfterRevision: after, Follow: true}, grpc.WaitForReady(true))
	if err != nil {
		send(shardBatch{shard: shard, err: err})
		return
	}
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
				first = false
				if after == 0 {
					if !send(shardBatch{shard: shard, start: true, through: ev.Revision}) {
						return
					}
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
func (h *hub) resume(ctx context.Context, shard int, after int64, out chan<- shardBatch) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(100 * time.Millisecond):
	}
	h.follow(ctx, shard, after, out)
}

func (h *hub) reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.watchers.every(func(w *watcher) { w.close(reasonUpstreamReset) })
	h.watchers = newWatcherIndex()
	h.ring, h.ringBytes = nil, 0
	h.head.Store(0)
	h.isSynced = false
}

// dispatch appends it to the ring and hands it to every watcher it
// concerns, and returns how many it was queued to. Called with mu held.
func (h *hub) dispatch(it *item) (queued int) {
	cost := it.cost()
	for len(h.ring) > 0 && (len(h.ring) >= h.limits.events || h.ringBytes+cost > h.limits.bytes) {
		h.ringStart = h.ring[0].ev.Revision
		h.ringBytes -= h.ring[0].cost()
		h.ring[0] = nil
		h.ring = h.ring[1:]
	}
	h.ring = append(h.ring, it)
	h.ringBytes += cost
	h.head.Store(it.ev.Revision)
	h.m.events.WithLabelValues(h.res.ID()).Inc()
	var closed []*watcher
	h.watchers.each(it.ev, func(w *watcher) {
		if it.ev.Revision <= w.after {
			return
		}
		t := it.transition(w.sel)
		if t == kube.Skip {
			return
		}
		if !w.enqueue(it, t) {
			closed = append(closed, w)
			return
		}
		queued++
	})
	for _, w := range closed {
		h.watchers.remove(w)
	}
	return queued
}

// join registers w for every event after rev. If the ring covers rev it
// returns the ring's events after rev (which the caller writes first) and
// ok; otherwise the caller must catch up from the cache first.
func (h *hub) join(w *watcher, rev int64) (backlog []*item, head int64, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.isSynced || rev < h.ringStart {
		return nil, 0, false
	}
	for i := len(h.ring) - 1; i >= 0 && h.ring[i].ev.Revision > rev; i-- {
		backlog = append(backlog, h.ring[i])
	}
	for i, j := 0, len(backlog)-1; i < j; i, j = i+1, j-1 {
		backlog[i], backlog[j] = backlog[j], backlog[i]
	}
	h.watchers.add(w)
	return backlog, h.head.Load(), true
}

func (h *hub) leave(w *watcher) {
	h.mu.Lock()
	h.watchers.remove(w)
	h.mu.Unlock()
}

// waitSynced waits until the upstream stream has started.
func (h *hub) waitSynced(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-h.synced:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}
