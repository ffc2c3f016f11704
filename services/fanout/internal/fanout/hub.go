package fanout

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// hub is the one upstream watch a fanout replica holds per resource, shared
// by all its watchers of that resource.
//
// Invariants (under mu):
//   - ring holds, oldest first, every event of the resource with revision
//     > ringStart, up to head; head only grows.
//   - a registered watcher has been handed every event after the revision
//     it joined at, in order, by dispatch (or was closed).
type hub struct {
	res    *kube.Resource
	cache  heraldv1.CacheClient
	log    *slog.Logger
	m      *metrics
	size   int
	synced chan struct{} // closed once the first upstream stream has started

	mu        sync.Mutex
	ring      []*item
	ringStart int64
	head      atomic.Int64
	watchers  map[*watcher]struct{}
	// isSynced: ringStart and head are known (an upstream stream started
	// and has not lost continuity since).
	isSynced bool
}

func newHub(res *kube.Resource, cache heraldv1.CacheClient, size int, log *slog.Logger, m *metrics) *hub {
	return &hub{res: res, cache: cache, size: size, log: log.With("resource", res.ID()), m: m,
		synced: make(chan struct{}), watchers: map[*watcher]struct{}{}}
}

// run keeps the upstream stream open until ctx ends, resuming after head
// whenever it breaks.
func (h *hub) run(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := h.stream(ctx)
		if ctx.Err() != nil {
			return
		}
		h.m.upstreamRestarts.WithLabelValues(h.res.ID()).Inc()
		if status.Code(err) == codes.OutOfRange {
			// The cache no longer has our resume point: continuity is
			// lost. Close every watcher (each resumes from its own last
			// revision, or gets 410 from the cache) and start afresh.
			h.log.Warn("upstream cannot resume; resetting", "err", err)
			h.reset()
		} else {
			h.log.Info("upstream watch ended; resuming", "after", h.head.Load(), "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
		if err == nil || status.Code(err) == codes.Aborted {
			backoff = 100 * time.Millisecond
		}
	}
}

func (h *hub) reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.watchers {
		w.close(reasonUpstreamReset)
	}
	h.watchers = map[*watcher]struct{}{}
	h.ring = nil
	h.head.Store(0)
	h.isSynced = false
}

func (h *hub) stream(ctx context.Context) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	h.mu.Lock()
	after := h.head.Load()
	h.mu.Unlock()
	st, err := h.cache.Watch(sctx, &heraldv1.WatchRequest{Resource: h.res.ID(), AfterRevision: after, Follow: true})
	if err != nil {
		return err
	}
	first := true
	for {
		resp, err := st.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		h.mu.Lock()
		for _, ev := range resp.Events {
			if first {
				first = false
				if !h.isSynced {
					// The stream starts after ev.Revision: the ring is
					// complete from there on.
					h.ringStart = ev.Revision
					h.head.Store(ev.Revision)
					h.isSynced = true
					select {
					case <-h.synced:
					default:
						close(h.synced)
					}
				}
				continue
			}
			if ev.Type == heraldv1.EventType_BOOKMARK {
				if ev.Revision > h.head.Load() {
					h.head.Store(ev.Revision)
				}
				continue
			}
			if ev.Revision < h.head.Load() {
				continue // already have it (cannot happen on a healthy stream)
			}
			h.dispatch(newItem(ev))
		}
		h.mu.Unlock()
	}
}

// dispatch appends it to the ring and hands it to every watcher it
// concerns. Called with mu held.
func (h *hub) dispatch(it *item) {
	if len(h.ring) >= h.size {
		h.ringStart = h.ring[0].ev.Revision
		h.ring[0] = nil
		h.ring = h.ring[1:]
	}
	h.ring = append(h.ring, it)
	h.head.Store(it.ev.Revision)
	h.m.events.WithLabelValues(h.res.ID()).Inc()
	for w := range h.watchers {
		if it.ev.Revision <= w.after {
			continue
		}
		t := it.transition(w.sel)
		if t == kube.Skip {
			continue
		}
		if !w.enqueue(it, t) {
			delete(h.watchers, w)
		}
	}
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
	h.watchers[w] = struct{}{}
	return backlog, h.head.Load(), true
}

func (h *hub) leave(w *watcher) {
	h.mu.Lock()
	delete(h.watchers, w)
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
