package fanout

import (
	"bytes"
	"io"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// The ring keeps the newest events within both bounds, and a watcher that
// joins before what it holds is sent to the cache rather than given a gap.
func TestRingBounds(t *testing.T) {
	pods := podsResource(t)
	obj := bytes.Repeat([]byte("x"), 1000)
	cost := newItem(&heraldv1.Event{Object: obj}).cost()
	all, err := kube.ParseSelector(pods, "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		limits    ringLimits
		wantItems int
	}{
		{"by events", ringLimits{events: 5, bytes: 1 << 30}, 5},
		{"by bytes", ringLimits{events: 1000, bytes: 3*cost + cost/2}, 3},
		{"one oversized event is kept", ringLimits{events: 1000, bytes: 1}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHub(pods, nil, tc.limits, slog.New(slog.NewTextHandler(io.Discard, nil)), newMetrics(prometheus.NewRegistry()), clock.RealClock{})
			h.mu.Lock()
			h.isSynced = true
			for rev := int64(1); rev <= 20; rev++ {
				h.dispatch(newItem(&heraldv1.Event{Type: heraldv1.EventType_ADDED, Revision: rev, Namespace: "default", Name: "p", Object: obj}))
			}
			h.head.Store(20) // as flush does once the revisions are queued
			if len(h.ring) != tc.wantItems {
				t.Fatalf("ring holds %d events, want %d", len(h.ring), tc.wantItems)
			}
			if h.ringBytes != tc.wantItems*cost {
				t.Errorf("ringBytes = %d, want %d", h.ringBytes, tc.wantItems*cost)
			}
			first := int64(20 - tc.wantItems + 1)
			if h.ring[0].ev.Revision != first || h.ringStart != first-1 {
				t.Errorf("ring starts at revision %d (ringStart %d), want %d (%d)", h.ring[0].ev.Revision, h.ringStart, first, first-1)
			}
			h.mu.Unlock()

			// Joining at ringStart: the ring has everything after it.
			backlog, head, ok := h.join(newWatcher(all, 100, 1<<20), first-1)
			if !ok || head != 20 || len(backlog) != tc.wantItems || backlog[0].ev.Revision != first {
				t.Errorf("join at %d: ok=%v head=%d backlog=%d, want ok, head 20, %d events from %d", first-1, ok, head, len(backlog), tc.wantItems, first)
			}
			// One revision earlier is no longer covered.
			if _, _, ok := h.join(newWatcher(all, 100, 1<<20), first-2); ok {
				t.Errorf("join at %d succeeded; the ring starts after it", first-2)
			}
		})
	}
}

// The hub's head passes a revision only once all its events are queued to
// every watcher they concern: serve writes a bookmark at head without the
// hub's lock, and a bookmark that went out before an event it covers would
// let a client whose stream ends between the two resume past that event.
// Watchers whose queues overflow on the revision's first and second events
// tell, as they are closed from inside the dispatch, where head stood.
func TestHubHeadPassesWholeQueuedRevisions(t *testing.T) {
	pods := podsResource(t)
	all, err := kube.ParseSelector(pods, "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	h := newHub(pods, nil, ringLimits{events: 100, bytes: 1 << 30}, slog.New(slog.NewTextHandler(io.Discard, nil)), newMetrics(prometheus.NewRegistry()), clock.RealClock{})
	h.isSynced, h.ringStart = true, 10
	h.head.Store(10)
	var seen []int64
	for _, room := range []int{0, 1} { // full at the first event of 11, at the second
		w := newWatcher(all, room, 1<<20)
		w.onClose = func(string) { seen = append(seen, h.head.Load()) }
		if _, _, ok := h.join(w, 10); !ok {
			t.Fatal("cannot join at the head")
		}
	}
	ev := func(name string) *heraldv1.Event {
		return &heraldv1.Event{Type: heraldv1.EventType_ADDED, Revision: 11, Namespace: "default", Name: name, Object: []byte("{}")}
	}
	h.flush([]*heraldv1.Event{ev("a"), ev("b")})
	if len(seen) != 2 || seen[0] != 10 || seen[1] != 10 {
		t.Errorf("head while revision 11 was being queued: %v, want [10 10]", seen)
	}
	if head := h.head.Load(); head != 11 {
		t.Errorf("head %d once 11 is queued, want 11", head)
	}
}
