package e2e

import (
	"net/http"
	"testing"
	"time"

	"herald.dev/integration/stack"
)

// TestWatchRetriesOnDownFanout: with one of two fanout replicas killed,
// every new watch is still served (frontdoor retries the other replica
// before answering), and each one gets the events written after it.
func TestWatchRetriesOnDownFanout(t *testing.T) {
	e := startStack(t, stack.Options{Fanouts: 2})
	ctx := testContext(t, 50*time.Second)
	e.Proc("fanout-0").Kill()
	var list podList
	if code := e.get(t, "/api/v1/pods", &list); code != http.StatusOK {
		t.Fatalf("LIST: %d", code)
	}
	var chans []<-chan watchEvent
	for range 4 { // round-robin ties: at least one starts at the dead replica
		code, ch := e.openWatch(t, ctx, "/api/v1/pods?watch=true&resourceVersion="+list.Metadata.ResourceVersion)
		if code != http.StatusOK {
			t.Fatalf("watch with a replica down: %d", code)
		}
		chans = append(chans, ch)
	}
	ev := e.put(t, ctx, "default", "after-kill", podJSON("default", "after-kill", "node-1", 0), true)
	for _, ch := range chans {
		got := collect(t, ctx, ch, ev.RV)
		if last := got[len(got)-1]; last != ev {
			t.Fatalf("watch got %+v, want %+v", last, ev)
		}
	}
	if n := metric(t, e.Proc("frontdoor-0"), "herald_frontdoor_fanout_retries_total"); n < 1 {
		t.Fatalf("herald_frontdoor_fanout_retries_total = %v, want >= 1", n)
	}
}
