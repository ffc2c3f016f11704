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

// TestFrontdoorReplicas: two frontdoors, each on its own address, each
// routing over both fanout replicas. Two watches through each frontdoor
// land one per fanout (each frontdoor picks the least loaded replica), so
// every fanout holds two of the four, and every watch gets the write made
// after it opened.
func TestFrontdoorReplicas(t *testing.T) {
	e := startStack(t, stack.Options{Fanouts: 2, Frontdoors: 2})
	ctx := testContext(t, 50*time.Second)
	if len(e.FrontdoorURLs) != 2 || e.FrontdoorURL != e.FrontdoorURLs[0] || e.FrontdoorURLs[0] == e.FrontdoorURLs[1] {
		t.Fatalf("frontdoor URLs %v (FrontdoorURL %s): want two distinct, the first FrontdoorURL", e.FrontdoorURLs, e.FrontdoorURL)
	}
	var list podList
	if code := e.get(t, "/api/v1/pods", &list); code != http.StatusOK {
		t.Fatalf("LIST: %d", code)
	}
	var chans []<-chan watchEvent
	for _, base := range e.FrontdoorURLs {
		for range 2 {
			code, ch := e.openWatchAt(t, ctx, base, "/api/v1/pods?watch=true&resourceVersion="+list.Metadata.ResourceVersion)
			if code != http.StatusOK {
				t.Fatalf("watch through %s: %d", base, code)
			}
			chans = append(chans, ch)
		}
	}
	for _, name := range []string{"frontdoor-0", "frontdoor-1"} {
		if n := metricLabeled(t, e.Proc(name), "apiserver_longrunning_requests", `resource="pods"`); n != 2 {
			t.Errorf("%s holds %v pods watches, want 2", name, n)
		}
	}
	for _, name := range []string{"fanout-0", "fanout-1"} {
		if n := metric(t, e.Proc(name), "herald_fanout_watchers"); n != 2 {
			t.Errorf("%s holds %v watches, want 2 (one from each frontdoor)", name, n)
		}
	}
	ev := e.put(t, ctx, "default", "through-both", podJSON("default", "through-both", "node-1", 0), true)
	for i, ch := range chans {
		got := collect(t, ctx, ch, ev.RV)
		if last := got[len(got)-1]; last != ev {
			t.Fatalf("watch %d got %+v, want %+v", i, last, ev)
		}
	}
}
