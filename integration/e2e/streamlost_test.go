package e2e

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"herald.dev/integration/checker"
	"herald.dev/integration/stack"
)

// TestStreamDeleted: the stream removed under a running stack (`nats stream
// rm HERALD`, or NATS restarted without its store). Ingest creates it again
// as generation 2 with a resync marker, the cache rebuilds from etcd, a
// watch from before the loss ends having seen only etcd's history and
// resuming it is expired (410), and a client that lists again sees every
// later change once, in order.
func TestStreamDeleted(t *testing.T) {
	e := startStack(t, stack.Options{})
	ctx := testContext(t, 2*time.Minute)
	w := &writer{e: e, ns: "lost"}
	w.run(ctx, 20, nil)
	e.streamReaches(t, ctx, w.lastRev())
	watchFrom := w.lastRev()
	_, old := e.openWatch(t, ctx, "/api/v1/namespaces/lost/pods?watch=true&resourceVersion="+strconv.FormatInt(watchFrom, 10))

	if err := e.js.DeleteStream(ctx, "HERALD"); err != nil {
		t.Fatal(err)
	}
	w.run(ctx, 10, nil) // the first of them finds no stream
	cache := e.Proc("cache-0")
	ingests := func(f func(p *stack.Proc) float64) (sum, most float64) {
		for _, p := range e.Procs() {
			if strings.HasPrefix(p.Name, "ingest") {
				v := f(p)
				sum, most = sum+v, max(most, v)
			}
		}
		return sum, most
	}
	until := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			select {
			case <-ctx.Done():
				t.Fatalf("never: %s", what)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	until("ingest starts generation 2", func() bool {
		_, gen := ingests(func(p *stack.Proc) float64 { return metricOr(p, "herald_stream_generation", 0) })
		lost, _ := ingests(func(p *stack.Proc) float64 {
			return metricLabeled(nopT{}, p, "herald_ingest_failures_total", `cause="stream_lost"`)
		})
		return gen == 2 && lost == 1
	})
	until("the cache rebuilds at generation 2", func() bool { return metricOr(cache, "herald_stream_generation", 0) == 2 })
	recs := e.streamReaches(t, ctx, e.rev(t, ctx))
	if resyncs := checker.Resyncs(recs); len(resyncs) != 1 || !recs[0].Resync {
		t.Fatalf("the new stream starts with %+v, resync markers at %v; want one resync marker first", recs[0], resyncs)
	}

	// The watch from before the loss ends; what it saw is etcd's history
	// from watchFrom on, with nothing left out before its last event.
	var seen []checker.WatchEvent
	for ev := range old {
		if ev.Type != "BOOKMARK" && ev.Type != "ERROR" {
			seen = append(seen, ev.toCheck())
		}
	}
	if len(seen) > 0 {
		history, err := checker.EtcdHistory(ctx, e.etcd, "/registry/pods/lost/", watchFrom+1, lastOf(seen).RV)
		if err != nil {
			t.Fatal(err)
		}
		for _, err := range checker.CheckWatch(checker.ExpectedEvents("/registry/pods/", history, e.live(t, ctx, "lost", watchFrom)), seen) {
			t.Errorf("the watch from before the loss: %v", err)
		}
	}
	_, again := e.openWatch(t, ctx, "/api/v1/namespaces/lost/pods?watch=true&resourceVersion="+strconv.FormatInt(watchFrom, 10))
	ev := <-again
	var st status
	json.Unmarshal(ev.Object, &st)
	if ev.Type != "ERROR" || st.Code != 410 {
		t.Fatalf("resuming from before the loss: %s %s, want 410", ev.Type, ev.Object)
	}

	// Listed again: the list is etcd's state, and a watch from it sees
	// every later change once, in order.
	var l podList
	if code := e.get(t, "/api/v1/namespaces/lost/pods", &l); code != 200 {
		t.Fatalf("LIST: %d", code)
	}
	lr, _ := strconv.ParseInt(l.Metadata.ResourceVersion, 10, 64)
	if got, want := names(l.Items), e.etcdNames(t, ctx, "/registry/pods/lost/", lr, nil); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("LIST after the loss %v, etcd %v", got, want)
	}
	_, evs := e.openWatch(t, ctx, "/api/v1/namespaces/lost/pods?watch=true&resourceVersion="+l.Metadata.ResourceVersion)
	w.run(ctx, 15, nil)
	got := collect(t, ctx, evs, w.lastRev())
	history, err := checker.EtcdHistory(ctx, e.etcd, "/registry/pods/lost/", lr+1, w.lastRev())
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range checker.CheckWatch(checker.ExpectedEvents("/registry/pods/", history, e.live(t, ctx, "lost", lr)), got) {
		t.Error(err)
	}
}

// live is the set of pods of namespace ns at revision rev, by key.
func (e *env) live(t *testing.T, ctx context.Context, ns string, rev int64) map[string]bool {
	t.Helper()
	resp, err := e.etcd.Get(ctx, "/registry/pods/"+ns+"/", clientv3.WithPrefix(), clientv3.WithRev(rev), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = true
	}
	return out
}
