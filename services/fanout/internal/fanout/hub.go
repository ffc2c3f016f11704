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
	"herald.dev/libs/kube/request"
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
//     it joined at, in order, by dispatch (or was closed); or it is behind,
//     and has been handed them through the item numbered its cursor, the
//     rest being in the ring (see fallBehind).
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
	// seq numbers the items dispatched (item.seq): the last one's.
	seq int64
	// behind: the registered watchers that are behind.
	behind map[*watcher]struct{}
	// isSynced: ringStart and head are known (the upstreams started and
	// have not lost continuity since).
	isSynced bool

	// expiredThrough: the upstream's generation floor (generation.go);
	// a watcher from a revision up to it never joins.
	expiredThrough int64

	// protobuf: a watcher of the hub writes the cache's protobuf of the
	// objects (askProtobuf). The upstream asks the cache for it
	// (with_protobuf) only from then on: the cache encodes it only while
	// a stream asks, and sends it only to those that do. Never cleared.
	protobuf atomic.Bool
}

// askProtobuf tells the hub that a watcher writes the protobuf the cache
// makes of each object: the upstream follows on with it from the next
// response on (runOnce); until then, such a watcher's frames are made from
// the JSON, once per event (encoding.go).
func (h *hub) askProtobuf() { h.protobuf.Store(true) }

// ringLimits bound a hub's ring of recent events: at most events items and
// about bytes of event data. A watcher that resumes or joins within the ring
// is caught up from it, with the events already encoded; one that is further
// behind costs a replay from the cache, encoded for it alone.
type ringLimits struct{ events, bytes int }

func newHub(res *kube.Resource, cache heraldv1.CacheClient, limits ringLimits, log *slog.Logger, m *metrics, clk clock.Clock) *hub {
	return &hub{res: res, cache: cache, limits: limits, log: log.With("resource", res.ID()), m: m, clock: clk,
		synced: make(chan struct{}), watchers: newWatcherIndex(), behind: map[*watcher]struct{}{}}
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
	withProtobuf := h.protobuf.Load()
	up, err := h.open(ctx, 0, withProtobuf)
	if err != nil {
		return err
	}
	defer func() { up.cancel() }()
	start, floor := up.start, up.floor
	h.mu.Lock()
	h.ringStart = start
	h.expiredThrough = floor
	h.head.Store(start)
	h.isSynced = true
	h.mu.Unlock()
	select {
	case <-h.synced:
	default:
		close(h.synced)
	}
	h.flush(up.rest)
	for {
		resp, err := up.st.Recv()
		if err != nil {
			return err
		}
		h.flush(resp.Events)
		if withProtobuf || !h.protobuf.Load() {
			continue
		}
		// A watcher writes protobuf now: follow on with the cache's
		// protobuf from where this stream is complete (head, at a
		// response's end, covers whole revisions), as a watch from a
		// revision does, with no gap and no duplicate.
		up.cancel()
		withProtobuf = true
		if up, err = h.open(ctx, h.head.Load(), true); err != nil {
			return err
		}
		// (A merged stream from a revision may not know its shards'
		// floor yet: the one known stays.)
		h.mu.Lock()
		h.expiredThrough = max(h.expiredThrough, up.floor)
		h.mu.Unlock()
		h.flush(up.rest)
	}
}

// upstream is an open upstream stream.
type upstream struct {
	st     grpc.ServerStreamingClient[heraldv1.WatchResponse]
	cancel context.CancelFunc
	start  int64             // its opening bookmark's revision: it is complete after it
	floor  int64             // its generation floor (expiredThrough)
	rest   []*heraldv1.Event // what its first response carried after the bookmark
}

// open starts the upstream after revision after (0: the caches' head),
// asking for the cache's protobuf of the objects when withProtobuf.
func (h *hub) open(ctx context.Context, after int64, withProtobuf bool) (*upstream, error) {
	ctx, cancel := context.WithCancel(ctx)
	// Wait for a ready connection: a replica may be restarting, and the
	// stream is long-lived anyway.
	st, err := h.cache.Watch(ctx, &heraldv1.WatchRequest{Resource: h.res.ID(), Follow: true, AfterRevision: after,
		OmitUnchangedPrev: true, WithProtobuf: withProtobuf}, grpc.WaitForReady(true))
	if err != nil {
		cancel()
		return nil, err
	}
	resp, err := st.Recv()
	if err == nil && len(resp.Events) == 0 {
		err = status.Error(codes.Internal, "upstream stream opened without a bookmark")
	}
	if err != nil {
		cancel()
		return nil, err
	}
	return &upstream{st: st, cancel: cancel, start: resp.Events[0].Revision, floor: expiredThrough(st), rest: resp.Events[1:]}, nil
}

// flush dispatches evs (in revision order), and moves head to the revision
// the upstream is complete through. head passes a revision only once all of
// its events are queued to every watcher they concern (or are in the ring
// for those behind, which get no bookmark at head: bookmarkTick): a
// bookmark at head (serve reads it without the lock) must never go out
// before an event it covers, or a client whose stream ends between the two
// resumes past that event.
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
	for w := range h.behind {
		h.release(w)
	}
	h.ring, h.ringBytes = nil, 0
	h.head.Store(0)
	h.isSynced = false
}

// dispatch appends it to the ring and hands it to every watcher it
// concerns, and returns how many it was queued to. Called with mu held; the
// caller moves head once the revision is whole (flush).
func (h *hub) dispatch(it *item) (queued int) {
	h.seq++
	it.seq = h.seq
	cost := it.cost()
	evicted := false
	for len(h.ring) > 0 && (len(h.ring) >= h.limits.events || h.ringBytes+cost > h.limits.bytes) {
		h.ringStart = h.ring[0].ev.Revision
		h.ringBytes -= h.ring[0].cost()
		h.ring[0] = nil
		h.ring = h.ring[1:]
		evicted = true
	}
	h.ring = append(h.ring, it)
	h.ringBytes += cost
	if evicted && len(h.behind) > 0 {
		h.dropPassed() // (after the append: an oversized item may have emptied the ring)
	}
	h.m.events.WithLabelValues(h.res.ID()).Inc()
	h.watchers.each(it.ev, func(w *watcher) {
		if it.ev.Revision <= w.after || w.behind.Load() {
			return
		}
		t := it.transition(w.sel)
		if t == request.Skip {
			return
		}
		if !w.enqueue(it, t) {
			h.fallBehind(w, it.seq-1)
			return
		}
		queued++
	})
	return queued
}

// fallBehind: w's queue is full, and it has been handed the events through
// the one numbered cursor. The hub stops queueing to it; its writer tops
// its queue up from the ring as it drains it (catchUp), until it has caught
// up. A watcher that cannot keep up for a while (a slow client, or a
// replica short of CPU for a moment, when every watcher of a broadcast
// falls behind at once) costs no memory of its own meanwhile, and nothing
// more to resume: the ring holds the events, already encoded. Only once
// the ring drops an event w has not been handed is w closed (dropPassed),
// and its client resumes, from the caches. Called with mu held.
func (h *hub) fallBehind(w *watcher, cursor int64) {
	w.cursor = cursor
	w.behind.Store(true)
	h.behind[w] = struct{}{}
	w.urge()
}

// catchUp queues to w, if it is behind, the ring's events it has not been
// handed, as many as its queue takes; if that is all of them, w has caught
// up, and dispatch queues to it again. If not, w's writer is told to come
// back for the rest.
func (h *hub) catchUp(w *watcher) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !w.behind.Load() || w.closedReason() != "" {
		return // caught up meanwhile, or closed (no longer registered)
	}
	first := h.seq + 1 - int64(len(h.ring)) // the ring's first item's seq
	if w.cursor+1 < first {
		h.drop(w) // dropPassed closes it first: never here
		return
	}
	if !h.refill(w, w.cursor+1-first) {
		w.urge()
		return
	}
	w.cursor = h.seq
	h.release(w)
}

// refill queues to w the ring's events from the i-th on that it sees, until
// its queue is full (then it returns false, w's cursor at the last one
// queued). Called with mu held.
func (h *hub) refill(w *watcher, i int64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ; i < int64(len(h.ring)); i++ {
		it := h.ring[i]
		t := request.Skip
		if it.ev.Revision > w.after {
			t = it.transition(w.sel)
		}
		if t == request.Skip {
			continue
		}
		if _, _, ok := w.push(it, t, int64(len(it.object(t)))); !ok {
			w.cursor = it.seq - 1
			return false
		}
	}
	return true
}

// dropPassed closes the watchers that are behind an event the ring no
// longer holds. Called with mu held.
func (h *hub) dropPassed() {
	first := h.ring[0].seq
	for w := range h.behind {
		if w.cursor+1 < first {
			h.drop(w)
		}
	}
}

// drop closes w, which is behind, as too slow: the client resumes, from
// the caches. Called with mu held.
func (h *hub) drop(w *watcher) {
	w.close(reasonQueueFull)
	h.watchers.remove(w)
	h.release(w)
}

// release ends w's being behind, if it is: it has caught up, or it is
// closed or gone. Called with mu held.
func (h *hub) release(w *watcher) {
	w.behind.Store(false)
	delete(h.behind, w)
}

// join registers w for every event after rev. If the ring covers rev it
// returns the ring's events after rev (which the caller writes first) and
// ok; otherwise the caller must catch up from the cache first.
func (h *hub) join(w *watcher, rev int64) (backlog []*item, head int64, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.isSynced || rev < h.ringStart || h.expiredThrough > 0 && rev <= h.expiredThrough {
		return nil, 0, false
	}
	for i := len(h.ring) - 1; i >= 0 && h.ring[i].ev.Revision > rev; i-- {
		// Counted as handed (whether or not w's selector takes it): a
		// wave of watches that join after a restart or a rebalance gets
		// the backlog's encodings once per session (item.sharedByMany).
		h.ring[i].handed()
		backlog = append(backlog, h.ring[i])
	}
	for i, j := 0, len(backlog)-1; i < j; i, j = i+1, j-1 {
		backlog[i], backlog[j] = backlog[j], backlog[i]
	}
	w.hub = h
	h.watchers.add(w)
	return backlog, h.head.Load(), true
}

func (h *hub) leave(w *watcher) {
	h.mu.Lock()
	h.watchers.remove(w)
	h.release(w)
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
