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
