package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"herald.dev/integration/stack"
)

// eventually polls cond until it returns "" or the deadline passes; it
// reports the last reason otherwise.
func eventually(t *testing.T, ctx context.Context, what string, cond func() string) {
	t.Helper()
	for {
		why := cond()
		if why == "" {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("%s: %s", what, why)
		}
		time.Sleep(20 * time.Millisecond) // polling a scrape, with a deadline
	}
}

// TestMetricsAfterKnownWorkload (issue 8, acceptance 2): scrape every
// service's /metrics after N writes, M watchers and K LISTs and check the
// counters' exact values (as deltas from a scrape before the workload, the
// stack writing a few keys of its own at start).
func TestMetricsAfterKnownWorkload(t *testing.T) {
	const (
		N = 12 // pod writes: 8 creations, 4 updates
		M = 3  // watchers of all pods
		K = 5  // LISTs of pods
	)
	e := startStack(t, stack.Options{})
	ctx := testContext(t, 45*time.Second)
	ingest, cache, fanout, front := e.Proc("ingest-0"), e.Proc("cache-0"), e.Proc("fanout-0"), e.Proc("frontdoor-0")
	pods := `resource="pods"`

	var list podList
	if code := e.get(t, "/api/v1/pods", &list); code != http.StatusOK {
		t.Fatalf("LIST: %d", code)
	}
	wctx, stopWatches := context.WithCancel(ctx)
	defer stopWatches()
	var watches []<-chan watchEvent
	for range M {
		status, ch := e.openWatch(t, wctx, "/api/v1/pods?watch=true&resourceVersion="+list.Metadata.ResourceVersion)
		if status != http.StatusOK {
			t.Fatalf("watch: %d", status)
		}
		watches = append(watches, ch)
	}
	eventually(t, ctx, "watchers registered", func() string {
		if n := metricLabeled(t, fanout, "herald_fanout_hub_watchers", pods); n != M {
			return fmt.Sprintf("herald_fanout_hub_watchers = %v", n)
		}
		return ""
	})

	type sample struct {
		p      *stack.Proc
		name   string
		labels string
	}
	counters := map[string]sample{
		"published":  {ingest, "herald_ingest_events_published_total", ""},
		"revisions":  {ingest, "herald_ingest_records_published_total", `kind="revision"`},
		"received":   {cache, "apiserver_watch_cache_events_received_total", pods},
		"cacheLists": {cache, "apiserver_cache_list_total", pods},
		"dispatched": {fanout, "apiserver_watch_cache_events_dispatched_total", pods},
		"sent":       {fanout, "apiserver_watch_events_total", pods},
		"latency":    {fanout, "herald_event_delivery_latency_seconds_count", ""},
		"terminated": {fanout, "apiserver_terminated_watchers_total", ""},
		"lists":      {front, "apiserver_request_total", `verb="list",resource="pods",code="200"`},
		"watches":    {front, "apiserver_request_total", `verb="watch",resource="pods",code="200"`},
	}
	read := func(s sample) float64 {
		if s.labels == "" {
			return metric(t, s.p, s.name)
		}
		return metricLabeled(t, s.p, s.name, s.labels)
	}
	before := map[string]float64{}
	for k, s := range counters {
		before[k] = read(s)
	}

	// The workload: N writes, then K LISTs.
	var last int64
	for i := range N {
		name := "m-" + strconv.Itoa(i%8)
		ev := e.put(t, ctx, "metrics", name, podJSON("metrics", name, "node-1", i), i < 8)
		last = ev.RV
	}
	for _, ch := range watches {
		if got := collect(t, ctx, ch, last); len(got) != N {
			t.Fatalf("a watcher got %d events, want %d", len(got), N)
		}
	}
	for range K {
		if code := e.get(t, "/api/v1/pods", &list); code != http.StatusOK {
			t.Fatalf("LIST: %d", code)
		}
	}

	want := map[string]float64{
		"published": N, "revisions": N, "received": N, "cacheLists": K,
		"dispatched": N, "sent": N * M, "latency": N * M, "terminated": 0,
		"lists": K, "watches": 0, // watches are counted when they end
	}
	eventually(t, ctx, "counters after the workload", func() string {
		for k, w := range want {
			if got := read(counters[k]) - before[k]; got != w {
				return fmt.Sprintf("%s %s{%s} grew by %v, want %v", counters[k].p.Name, counters[k].name, counters[k].labels, got, w)
			}
		}
		return ""
	})

	// Gauges at rest: every hop caught up, nothing queued.
	gauges := []struct {
		p      *stack.Proc
		name   string
		labels string
		want   float64
	}{
		{ingest, "herald_ingest_leader", "", 1},
		{ingest, "herald_ingest_revision_lag", "", 0},
		{cache, "herald_cache_jetstream_consumer_pending_messages", "", 0},
		{cache, "herald_cache_revision_lag", "", 0},
		{cache, "herald_cache_watch_queue_events", "", 0},
		{cache, "herald_cache_ready", "", 1},
		{cache, "herald_cache_watch_streams", pods, 1}, // the fanout's one upstream for pods
		{fanout, "herald_fanout_watchers", "", M},
		{fanout, "herald_fanout_hub_watchers", pods, M},
		{fanout, "herald_fanout_watch_queue_events", pods, 0},
		{front, "apiserver_longrunning_requests", `verb="WATCH",resource="pods"`, M},
	}
	eventually(t, ctx, "gauges at rest", func() string {
		for _, g := range gauges {
			got := read(sample{g.p, g.name, g.labels})
			if got != g.want {
				return fmt.Sprintf("%s %s{%s} = %v, want %v", g.p.Name, g.name, g.labels, got, g.want)
			}
		}
		// The fanout hop is at the cache's revision, which is at least the
		// last write.
		head := metric(t, cache, "apiserver_watch_cache_resource_version")
		if hub := metricLabeled(t, fanout, "herald_fanout_hub_revision", pods); hub < float64(last) || head < float64(last) {
			return fmt.Sprintf("cache head %v, fanout hub %v, want both >= %d", head, hub, last)
		}
		return ""
	})

	// The clients leave: their watches are counted, none was terminated by
	// the server.
	stopWatches()
	eventually(t, ctx, "watches ended", func() string {
		if got := read(counters["watches"]) - before["watches"]; got != M {
			return fmt.Sprintf("frontdoor watch requests grew by %v, want %d", got, M)
		}
		if n := metricLabeled(t, front, "apiserver_longrunning_requests", `verb="WATCH"`); n != 0 {
			return fmt.Sprintf("apiserver_longrunning_requests = %v", n)
		}
		if n := metric(t, fanout, "herald_fanout_watchers"); n != 0 {
			return fmt.Sprintf("herald_fanout_watchers = %v", n)
		}
		return ""
	})
	if got := read(counters["terminated"]) - before["terminated"]; got != 0 {
		t.Errorf("apiserver_terminated_watchers_total grew by %v, want 0", got)
	}
}
