package fanout

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"

	"herald.dev/libs/cacheclient"
	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// hub is the one upstream a fanout replica holds per resource, shared by all
// its watchers of that resource: one following cache watch, which the cache
// client merges by revision over the shards serving the resource (see
// libs/cacheclient: events come in revision order, each once, and a broken
// shard stream is resumed there).
//
// Invariants (under mu):
//   - ring holds, oldest first, every event of the resource with revision
//     > ringStart, up to head; head only grows.
//   - a registered watcher has been handed every event after the revision
//     it joined at, in order, by dispatch (or was closed).
type hub struct {
	res    *kube.Resource
	cache  heraldv1.CacheClient
	tracer trace.Tracer // nil: tracing off
	log    *slog.Logger
	m      *metrics
	clock  clock.Clock
	limits ringLimits
	synced chan struct{} // closed once the upstream stream has started
	// stop ends run. gone (custom resources only) retires the hub when
	// the registry no longer serves its resource as it does (Server.retire).
	stop func()
	gone func() bool

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

func newHub(res *kube.Resource, cache heraldv1.CacheClient, limits ringLimits, log *slog.Logger, m *metrics, clk clock.Clock) *hub {
	return &hub{res: res, cache: cache, limits: limits, log: log.With("resource", res.ID()), m: m, clock: clk,
		synced: make(chan struct{}), watchers: newWatcherIndex()}
}

// run keeps the upstreams open until ctx ends.
func (h *hub) run(ctx context.Context) {
	for ctx.Err() == nil {
		err := h.runOnce(ctx)
		if ctx.Err() != nil || h.gone != nil && h.gone() {
			return
		}
		h.m.upstreamRestarts.WithLabelValues(h.res.ID()).Inc()
		reason := reasonUpstreamReset
		if lag := (*cacheclient.LagError)(nil); errors.As(err, &lag) {
			// A shard lags too far behind the others: the merge would
			// hold their events without bound. The watchers resume from
			// their resourceVersions (from the ring of a replica that
			// keeps up, or the caches).
			reason = reasonUpstreamLagging
			h.m.upstreamLagging.WithLabelValues(h.res.ID()).Inc()
		}
		h.log.Warn("upstream lost continuity; resetting", "err", err, "reason", reason)
		h.reset(reason)
		select {
		case <-ctx.Done():
		case <-h.clock.After(200 * time.Millisecond):
		}
	}
}

// runOnce follows the upstream until continuity is lost (the cache client
// resumes what it can; what it returns is an OutOfRange, or the end of ctx).
func (h *hub) runOnce(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Wait for a ready connection: a replica may be restarting, and the
	// stream is long-lived anyway.
	st, err := h.cache.Watch(ctx, &heraldv1.WatchRequest{Resource: h.res.ID(), Follow: true, OmitUnchangedPrev: true}, grpc.WaitForReady(true))
	if err != nil {
		return err
	}
	resp, err := st.Recv()
	if err != nil {
		return err
	}
	if len(resp.Events) == 0 {
		return status.Error(codes.Internal, "upstream stream opened without a bookmark")
	}
	// The opening bookmark: the stream is complete after it.
	start := resp.Events[0].Revision
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
	h.flush(resp.Events[1:])
	for {
		if resp, err = st.Recv(); err != nil {
			return err
		}
		h.flush(resp.Events)
	}
}

// flush dispatches evs (in revision order), and moves head to the revision
// the upstream is complete through. head passes a revision only once all of
// its events are queued to every watcher they concern: a bookmark at head
// (serve reads it without the lock) must never go out before an event it
// covers, or a client whose stream ends between the two resumes past that
// event.
func (h *hub) flush(evs []*heraldv1.Event) {
	if len(evs) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var through int64
	for i, ev := range evs {
		through = max(through, ev.Revision)
		if ev.Type != heraldv1.EventType_BOOKMARK {
			it := newItem(ev)
			it.shared = true
			h.dispatchTraced(it)
		}
		if last := i == len(evs)-1; (last || evs[i+1].Revision != ev.Revision) && through > h.head.Load() {
			h.head.Store(through)
		}
	}
}

// reset closes every watcher (for reason) and forgets the ring.
func (h *hub) reset(reason string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.watchers.every(func(w *watcher) { w.close(reason) })
	h.watchers = newWatcherIndex()
	h.ring, h.ringBytes = nil, 0
	h.head.Store(0)
	h.isSynced = false
}

// dispatch appends it to the ring and hands it to every watcher it
// concerns, and returns how many it was queued to. Called with mu held; the
// caller moves head once the revision is whole (flush).
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
	t := h.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-h.synced:
		return true
	case <-t.C():
	case <-ctx.Done():
	}
	return false
}
