package fanout

import (
	"sync"
	"sync/atomic"

	"herald.dev/libs/kube/request"
)

// Reasons a watcher is closed by the server.
const (
	// reasonQueueFull: the watcher's queue overflowed and the hub's ring
	// has since dropped an event it had not been handed (see hub.fallBehind).
	reasonQueueFull     = "queue_full"
	reasonUpstreamReset = "upstream_reset"
	// reasonUpstreamLagging: a cache shard lagged so far behind the others
	// that the merge's bound was reached (cacheclient.LagError).
	reasonUpstreamLagging = "upstream_lagging"
	// reasonResourceChanged: the watched custom resource's CRD was
	// deleted or changed how its objects are served.
	reasonResourceChanged = "resource_changed"
)

type queued struct {
	it *item
	t  request.Transition
}

// watcher is one client watch stream. The hub's dispatch pushes into its
// bounded queue without blocking; the client's handler goroutine drains it.
// A watcher whose queue overflows (in events or bytes) falls behind: the
// hub stops queueing to it, and its writer tops the queue up from the hub's
// ring of recent events as it drains it, until it has caught up (see
// hub.fallBehind). Only when the ring drops an event it has not been handed
// is it closed: the client resumes from the last resourceVersion it
// received.
type watcher struct {
	sel *request.Selector
	// after: the watcher has been given every event up to this revision
	// before joining the hub; dispatch skips those. Written before join,
	// read under the hub's lock.
	after int64

	// The queue grows only while events are pending: an idle watcher holds
	// no buffer (a preallocated channel of the queue's size would cost every
	// idle watcher ~16 KB). wake (capacity 1) tells the writer there is
	// something to take: it is signalled when an event lands in an empty
	// queue (the writer takes everything, so every queued event is behind a
	// signal it has not consumed yet; what a watcher behind has not been
	// handed is behind urge's). full (capacity 1) is signalled when the
	// queue reaches half its bound in events or bytes, so that a writer
	// waiting to gather events (Server.serve), which does not listen to
	// wake meanwhile, writes before the queue overflows. lastRev: the
	// revision of the last event queued.
	mu       sync.Mutex
	pending  []queued
	lastRev  int64
	max      int
	wake     chan struct{}
	full     chan struct{}
	maxBytes int64
	bytes    atomic.Int64

	once   sync.Once
	done   chan struct{}
	reason string
	// notify, when set (before the watcher joins a hub), replaces wake and
	// full: it is called, with full, where they would be signalled (a
	// watch its session's pacer writes; the pacer may let a notice be
	// while the watch's goroutine writes, which then notifies it again:
	// see paced).
	notify func(full bool)
	// hub: the hub the watcher joined (set by join). behind: its queue
	// overflowed and it is topped up from hub's ring, from the event after
	// the one numbered cursor (item.seq). All three are written under the
	// hub's mutex. behind is read without it too, and hub by the writer
	// once it has read behind set (which is stored after hub).
	hub    *hub
	behind atomic.Bool
	cursor int64

	// onClose, when set, runs once as the watcher is closed, with the
	// reason: it counts the termination when the server decides it and
	// bounds the writer's blocking write (a client that stopped reading
	// must not hold a goroutine and a connection open).
	onClose func(reason string)
}

func newWatcher(sel *request.Selector, events, bytes int) *watcher {
	return &watcher{sel: sel, max: events, wake: make(chan struct{}, 1), full: make(chan struct{}, 1), maxBytes: int64(bytes), done: make(chan struct{})}
}

// enqueue hands the watcher one event; false means its queue is full (in
// events or bytes), and the event was not queued.
func (w *watcher) enqueue(it *item, t request.Transition) bool {
	n := int64(len(it.object(t)))
	w.mu.Lock()
	k, total, ok := w.push(it, t, n)
	w.mu.Unlock()
	if !ok {
		return false
	}
	full := w.half(k, total) && !w.half(k-1, total-n)
	switch {
	case w.notify != nil:
		if k == 1 || full {
			w.notify(full)
		}
	default:
		if k == 1 {
			signal(w.wake)
		}
		if full {
			signal(w.full)
		}
	}
	return true
}

// push appends an event of n bytes to the queue if it has room, and
// returns the queue's length and bytes. An empty queue takes one event of
// any size (or the watcher could never be handed it), and a revision
// queued in part is queued whole past the bounds: a watcher never falls
// behind inside a revision (a transaction's events), so that one the ring
// passes has been handed whole revisions, and its client, which resumes
// after the last revision it received, misses none. Called with mu held.
func (w *watcher) push(it *item, t request.Transition, n int64) (k int, total int64, ok bool) {
	rev := it.ev.Revision
	if rev != w.lastRev && (len(w.pending) >= w.max || len(w.pending) > 0 && w.bytes.Load()+n > w.maxBytes) {
		return 0, 0, false
	}
	w.pending = append(w.pending, queued{it, t})
	w.lastRev = rev
	it.handed()
	return len(w.pending), w.bytes.Add(n), true
}

// urge tells the writer to write now: the watcher is behind, and what it
// has not been handed waits in the ring, not in its queue (nothing else
// would wake the writer for it).
func (w *watcher) urge() {
	if w.notify != nil {
		w.notify(true)
		return
	}
	signal(w.wake)
	signal(w.full)
}

// signal fills ch (capacity 1) unless it is full already.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// take returns everything queued, in order, and gives the queue reuse
// (emptied) for its next batch. The byte budget is released as the events
// are handed over. A watcher that is behind is topped up from its hub's
// ring first.
func (w *watcher) take(reuse []queued) []queued {
	if w.behind.Load() {
		w.hub.catchUp(w)
	}
	w.mu.Lock()
	batch := w.pending
	w.pending = reuse[:0]
	w.mu.Unlock()
	var n int64
	for _, q := range batch {
		n += int64(len(q.it.object(q.t)))
	}
	w.bytes.Add(-n)
	return batch
}

// queued is the number of events waiting.
func (w *watcher) queued() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.pending)
}

// level is the number of events waiting and whether they reach half the
// queue's bound (then the writer must not wait). A watcher that is behind
// has events waiting in the ring: at least one, and the writer must not
// wait.
func (w *watcher) level() (n int, half bool) {
	w.mu.Lock()
	n = len(w.pending)
	w.mu.Unlock()
	if w.behind.Load() {
		return max(n, 1), true
	}
	return n, w.half(n, w.bytes.Load())
}

// half reports whether n events of b bytes reach half the queue's bound,
// in events or in bytes.
func (w *watcher) half(n int, b int64) bool {
	return n >= max(w.max/2, 1) || b >= w.maxBytes/2
}

func (w *watcher) close(reason string) {
	w.once.Do(func() {
		w.reason = reason
		close(w.done)
		if w.onClose != nil {
			w.onClose(reason)
		}
	})
}

// closedReason is the reason the server closed the watcher, "" if it did
// not.
func (w *watcher) closedReason() string {
	select {
	case <-w.done:
		return w.reason
	default:
		return ""
	}
}
