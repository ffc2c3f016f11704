package fanout

import (
	"sync"
	"sync/atomic"

	"herald.dev/libs/kube"
)

// Reasons a watcher is closed by the server.
const (
	reasonQueueFull     = "queue_full"
	reasonQueueBytes    = "queue_bytes"
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
	t  kube.Transition
}

// watcher is one client watch stream. The hub's dispatch pushes into its
// bounded queue without blocking; the client's handler goroutine drains it.
// A watcher whose queue overflows (in events or bytes) is closed: the
// client resumes from the last resourceVersion it received.
type watcher struct {
	sel *kube.Selector
	// after: the watcher has been given every event up to this revision
	// before joining the hub; dispatch skips those. Written before join,
	// read under the hub's lock.
	after int64

	// The queue grows only while events are pending: an idle watcher holds
	// no buffer (a preallocated channel of the queue's size would cost every
	// idle watcher ~16 KB). wake (capacity 1) tells the writer there is
	// something to take: it is signalled when an event lands in an empty
	// queue (the writer takes everything, so every event is behind a
	// signal it has not consumed yet). full (capacity 1) is signalled when
	// the queue reaches half its bound in events or bytes, so that a writer
	// waiting to gather events (Server.serve), which does not listen to
	// wake meanwhile, writes before the queue overflows.
	mu       sync.Mutex
	pending  []queued
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
	// onClose, when set, runs once as the watcher is closed, with the
	// reason: it counts the termination when the server decides it and
	// bounds the writer's blocking write (a client that stopped reading
	// must not hold a goroutine and a connection open).
	onClose func(reason string)
}

func newWatcher(sel *kube.Selector, events, bytes int) *watcher {
	return &watcher{sel: sel, max: events, wake: make(chan struct{}, 1), full: make(chan struct{}, 1), maxBytes: int64(bytes), done: make(chan struct{})}
}

// enqueue hands the watcher one event; false means the watcher is closed.
func (w *watcher) enqueue(it *item, t kube.Transition) bool {
	n := int64(len(it.object(t)))
	total := w.bytes.Add(n)
	if total > w.maxBytes {
		w.close(reasonQueueBytes)
		return false
	}
	w.mu.Lock()
	if len(w.pending) >= w.max {
		w.mu.Unlock()
		w.close(reasonQueueFull)
		return false
	}
	w.pending = append(w.pending, queued{it, t})
	k := len(w.pending)
	full := w.half(k, total) && !w.half(k-1, total-n)
	w.mu.Unlock()
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

// signal fills ch (capacity 1) unless it is full already.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// take returns everything queued, in order, and gives the queue reuse
// (emptied) for its next batch. The byte budget is released as the events
// are handed over.
func (w *watcher) take(reuse []queued) []queued {
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
// queue's bound (then the writer must not wait).
func (w *watcher) level() (n int, half bool) {
	w.mu.Lock()
	n = len(w.pending)
	w.mu.Unlock()
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
