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
	after    int64
	q        chan queued
	maxBytes int64
	bytes    atomic.Int64

	once   sync.Once
	done   chan struct{}
	reason string
	// abort, when set, bounds the writer's blocking write once the watcher
	// is closed: a client that stopped reading must not hold a goroutine
	// and a connection open.
	abort func()
}

func newWatcher(sel *kube.Selector, events, bytes int) *watcher {
	return &watcher{sel: sel, q: make(chan queued, events), maxBytes: int64(bytes), done: make(chan struct{})}
}

// enqueue hands the watcher one event; false means the watcher is closed.
func (w *watcher) enqueue(it *item, t kube.Transition) bool {
	n := int64(len(it.object(t)))
	if w.bytes.Add(n) > w.maxBytes {
		w.close(reasonQueueBytes)
		return false
	}
	select {
	case w.q <- queued{it, t}:
		return true
	default:
		w.close(reasonQueueFull)
		return false
	}
}

// dequeued accounts for a written event.
func (w *watcher) dequeued(q queued) { w.bytes.Add(-int64(len(q.it.object(q.t)))) }

func (w *watcher) close(reason string) {
	w.once.Do(func() {
		w.reason = reason
		close(w.done)
		if w.abort != nil {
			w.abort()
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
