package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"herald.dev/integration/checker"
	"herald.dev/integration/stack"
)

// writer keeps writing pods (creates, updates, deletes over a fixed set of
// names), retrying a write that fails (an etcd outage) until it lands.
type writer struct {
	e    *env
	ns   string
	mu   sync.Mutex
	last int64
}

func (w *writer) run(ctx context.Context, n int, at map[int]func()) {
	live := map[string]bool{}
	for i := range n {
		if f := at[i]; f != nil {
			f()
		}
		name := fmt.Sprintf("w%02d", i%30)
		for ctx.Err() == nil {
			var rev int64
			var err error
			if live[name] && i%7 == 0 {
				var r *clientv3.DeleteResponse
				if r, err = w.e.etcd.Delete(ctx, "/registry/pods/"+w.ns+"/"+name); err == nil {
					rev = r.Header.Revision
				}
			} else {
				var r *clientv3.PutResponse
				if r, err = w.e.etcd.Put(ctx, "/registry/pods/"+w.ns+"/"+name, podJSON(w.ns, name, "n", i)); err == nil {
					rev = r.Header.Revision
				}
			}
			if err == nil {
				live[name] = !(live[name] && i%7 == 0)
				w.mu.Lock()
				w.last = rev
				w.mu.Unlock()
				break
			}
			select { // etcd is down: retry shortly
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}

func (w *writer) lastRev() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

// leader returns the ingest process that reports leadership.
func (e *env) leader(t *testing.T, ctx context.Context, except *stack.Proc) *stack.Proc {
	t.Helper()
	for {
		for _, p := range e.Procs() {
			if len(p.Name) > 6 && p.Name[:6] == "ingest" && p != except && metricOr(p, "herald_ingest_leader", -1) == 1 {
				return p
			}
		}
		select {
		case <-ctx.Done():
			t.Fatal("no ingest leader")
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// metricOr scrapes a metric, returning def when the process does not answer
// (paused or dead).
func metricOr(p *stack.Proc, name string, def float64) float64 {
	c := &http.Client{Timeout: 300 * time.Millisecond}
	resp, err := c.Get("http://" + p.Admin + "/metrics")
	if err != nil {
		return def
	}
	resp.Body.Close()
	return metric(nopT{}, p, name)
}

// nopT is a testing.TB for helpers used off the test goroutine, where a
// failure is an ordinary outcome (a process that is down, a stream that
// broke) rather than a test failure.
type nopT struct{ testing.TB }

func (nopT) Helper()               {}
func (nopT) Fatal(args ...any)     {}
func (nopT) Fatalf(string, ...any) {}
func (nopT) Logf(string, ...any)   {}

// streamReaches waits until the stream holds revision rev.
func (e *env) streamReaches(t *testing.T, ctx context.Context, rev int64) []checker.Record {
	t.Helper()
	for {
		recs, err := checker.ReadStream(ctx, e.js, "HERALD")
		if err == nil && len(recs) > 0 && recs[len(recs)-1].Revision >= rev {
			return recs
		}
		select {
		case <-ctx.Done():
			t.Fatalf("stream never reached revision %d (err %v)", rev, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// checkStream verifies that the stream holds etcd's history of (from, to]
// exactly once, in order, and returns that history.
func (e *env) checkStream(t *testing.T, ctx context.Context, recs []checker.Record, from, to int64) []checker.Change {
	t.Helper()
	changes, errs := checker.StreamChanges(recs)
	for _, err := range errs {
		t.Error(err)
	}
	var inRange []checker.Change
	for _, c := range changes {
		if c.Rev > from && c.Rev <= to {
			inRange = append(inRange, c)
		}
	}
	history, err := checker.EtcdHistory(ctx, e.etcd, "/registry/", from+1, to)
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range checker.Compare(history, inRange) {
		t.Error(err)
	}
	t.Logf("stream holds %d changes of (%d, %d] exactly once, in order", len(inRange), from, to)
	return history
}

func (e *env) rev(t *testing.T, ctx context.Context) int64 {
	t.Helper()
	r, err := e.etcd.Get(ctx, "/herald/probe")
	if err != nil {
		t.Fatal(err)
	}
	return r.Header.Revision
}

// TestIngestLeaderKilled: SIGKILL the ingest leader mid-burst; the standby
// takes over and the stream holds every revision exactly once, in order.
func TestIngestLeaderKilled(t *testing.T) {
	e := startStack(t, stack.Options{Ingests: 2})
	ctx := testContext(t, 3*time.Minute)
	from := e.rev(t, ctx)
	old := e.leader(t, ctx, nil)
	w := &writer{e: e, ns: "burst"}
	w.run(ctx, 600, map[int]func(){150: old.Kill})
	successor := e.leader(t, ctx, old)
	recs := e.streamReaches(t, ctx, w.lastRev())
	e.checkStream(t, ctx, recs, from, w.lastRev())
	if n := metric(t, successor, "herald_ingest_leader_terms_total"); n != 1 {
		t.Errorf("successor won %v terms, want 1", n)
	}
}

// TestIngestPausedLeaderFenced freezes the leader in the middle of an
// append (fault injection) and stops it (SIGSTOP: no lease keep-alive, no
// release of leadership) until the standby has taken over and appended; woken
// up, the old leader carries on with its append, which the stream refuses.
func TestIngestPausedLeaderFenced(t *testing.T) {
	e := startStack(t, stack.Options{Ingests: 2, Flags: map[string][]string{"ingest": {"--debug.fault-injection"}}})
	ctx := testContext(t, 3*time.Minute)
	from := e.rev(t, ctx)
	old := e.leader(t, ctx, nil)
	post := func(p *stack.Proc, path string) {
		resp, err := http.Post("http://"+p.Admin+path, "text/plain", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	w := &writer{e: e, ns: "pause"}
	var successor *stack.Proc
	w.run(ctx, 500, map[int]func(){
		100: func() { post(old, "/debug/fault/pause-publish") },
		110: old.Pause,
		// Writes 110..299 happen while the old leader is frozen; the
		// successor must have taken over and appended them.
		300: func() {
			successor = e.leader(t, ctx, old)
			e.streamReaches(t, ctx, w.lastRev())
			old.Resume()
			post(old, "/debug/fault/resume-publish")
		},
	})
	recs := e.streamReaches(t, ctx, w.lastRev())
	e.checkStream(t, ctx, recs, from, w.lastRev())
	for metricLabeled(t, old, "herald_ingest_failures_total", `cause="fenced"`) != 1 || metric(t, old, "herald_ingest_leader") != 0 {
		select {
		case <-ctx.Done():
			t.Fatalf("the old leader's append was not refused (fenced=%v, leader=%v)",
				metricLabeled(t, old, "herald_ingest_failures_total", `cause="fenced"`), metric(t, old, "herald_ingest_leader"))
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Logf("old leader's append refused by the fence; %s leads", successor.Name)
}

// TestCompactionResync: while ingest is down, etcd compacts past its resume
// point; on restart ingest appends a resync marker, caches rebuild, and a
// watcher older than the marker gets 410 Gone, never a silent gap.
func TestCompactionResync(t *testing.T) {
	e := startStack(t, stack.Options{})
	ctx := testContext(t, 2*time.Minute)
	w := &writer{e: e, ns: "compact"}
	w.run(ctx, 20, nil)
	e.streamReaches(t, ctx, w.lastRev())
	watchFrom := w.lastRev()
	_, evs := e.openWatch(t, ctx, "/api/v1/pods?watch=true&resourceVersion="+strconv.FormatInt(watchFrom, 10))

	ing := e.Proc("ingest-0")
	ing.Kill()
	w.run(ctx, 40, nil)
	if _, err := e.etcd.Compact(ctx, w.lastRev(), clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	compacted := w.lastRev()
	if err := ing.Start(); err != nil {
		t.Fatal(err)
	}
	for metricOr(ing, "herald_ingest_resyncs_total", 0) != 1 {
		select {
		case <-ctx.Done():
			t.Fatal("ingest never resynced")
		case <-time.After(50 * time.Millisecond):
		}
	}
	w.run(ctx, 10, nil)
	recs := e.streamReaches(t, ctx, w.lastRev())
	resyncs := checker.Resyncs(recs)
	if len(resyncs) != 1 || resyncs[0] < compacted {
		t.Fatalf("resync markers %v, want one at or after the compaction (%d)", resyncs, compacted)
	}
	// The stream is exact after the marker.
	e.checkStream(t, ctx, recs, resyncs[0], w.lastRev())
	for metric(t, e.Proc("cache-0"), "herald_cache_resyncs_total") != 1 {
		select {
		case <-ctx.Done():
			t.Fatal("cache never resynced")
		case <-time.After(50 * time.Millisecond):
		}
	}
	// The old watcher is cut off, and resuming it is refused with 410.
	for range evs {
	}
	_, again := e.openWatch(t, ctx, "/api/v1/pods?watch=true&resourceVersion="+strconv.FormatInt(watchFrom, 10))
	ev := <-again
	var st status
	json.Unmarshal(ev.Object, &st)
	if ev.Type != "ERROR" || st.Code != 410 || st.Reason != "Expired" {
		t.Fatalf("resuming from before the resync: %s %s", ev.Type, ev.Object)
	}
	// And the cache serves etcd's current state.
	var l podList
	e.get(t, "/api/v1/namespaces/compact/pods", &l)
	lr, _ := strconv.ParseInt(l.Metadata.ResourceVersion, 10, 64)
	if got, want := names(l.Items), e.etcdNames(t, ctx, "/registry/pods/compact/", lr, nil); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after resync LIST %v, etcd %v", got, want)
	}
}

// TestOutagesUnderLoad restarts NATS and then etcd under a continuous write
// load: the stream holds every revision once, in order, and a resuming
// client sees every change once.
func TestOutagesUnderLoad(t *testing.T) {
	e := startStack(t, stack.Options{})
	ctx := testContext(t, 3*time.Minute)
	from := e.rev(t, ctx)
	client := e.resumingClient(ctx, "/api/v1/namespaces/load/pods?watch=true&allowWatchBookmarks=true", from)
	w := &writer{e: e, ns: "load"}
	w.run(ctx, 600, map[int]func(){
		200: func() {
			if err := e.RestartNATS(); err != nil {
				t.Error(err)
			}
		},
		400: func() {
			if err := e.RestartEtcd(); err != nil {
				t.Error(err)
			}
		},
	})
	last := w.lastRev()
	recs := e.streamReaches(t, ctx, last)
	e.checkStream(t, ctx, recs, from, last)

	history, err := checker.EtcdHistory(ctx, e.etcd, "/registry/pods/load/", from+1, last)
	if err != nil {
		t.Fatal(err)
	}
	want := checker.ExpectedEvents("/registry/pods/", history, nil)
	got := client.until(t, ctx, last)
	for _, err := range checker.CheckWatch(want, got) {
		t.Error(err)
	}
	t.Logf("client saw %d events over %d reconnects, expired=%v", len(got), client.reconnects(), client.expired())
	if client.expired() {
		t.Error("the client was sent 410 although its revision never left the window")
	}
}

// TestOneEtcdWatch: whatever the number of clients, etcd has exactly one
// watch from Herald (the ingest leader's).
func TestOneEtcdWatch(t *testing.T) {
	e := startStack(t, stack.Options{})
	ctx := testContext(t, time.Minute)
	var l podList
	e.get(t, "/api/v1/pods", &l)
	for i := range 100 {
		path := "/api/v1/pods?watch=true&resourceVersion=" + l.Metadata.ResourceVersion
		switch i % 3 {
		case 1:
			path = fmt.Sprintf("/api/v1/namespaces/ns-%d/pods?watch=true", i)
		case 2:
			path = fmt.Sprintf("/api/v1/pods?watch=true&fieldSelector=spec.nodeName%%3Dnode-%d&resourceVersion=%s", i, l.Metadata.ResourceVersion)
		}
		if code, _ := e.openWatch(t, ctx, path); code != 200 {
			t.Fatalf("watch %d: %d", i, code)
		}
	}
	ev := e.put(t, ctx, "ns-1", "x", podJSON("ns-1", "x", "node-2", 0), true)
	_ = ev
	if got := metric(t, e.Proc("fanout-0"), "herald_fanout_watchers"); got != 100 {
		t.Fatalf("fanout has %v watchers, want 100", got)
	}
	watchers := gatherGauge(t, "etcd_debugging_mvcc_watcher_total")
	streams := gatherGauge(t, "etcd_debugging_mvcc_watch_stream_total")
	if watchers != 1 || streams != 1 {
		t.Fatalf("etcd has %v watchers on %v streams with 100 clients, want 1 and 1", watchers, streams)
	}
}

func gatherGauge(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			var sum float64
			for _, m := range mf.GetMetric() {
				sum += m.GetGauge().GetValue()
			}
			return sum
		}
	}
	t.Fatalf("etcd metric %s not found", name)
	return 0
}
