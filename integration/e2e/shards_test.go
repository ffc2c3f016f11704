package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"testing"
	"time"

	"herald.dev/integration/checker"
	"herald.dev/integration/stack"
	"herald.dev/libs/kube"
)

// shardedStack splits pods over two shards (namespace partitions 0-7 and
// 8-15) of two replicas each; everything else lives on a third shard.
func shardedStack(t *testing.T, cacheFlags ...string) *env {
	return startStack(t, stack.Options{
		CacheShards: []stack.CacheShard{
			{Resources: "pods", Partitions: "0-7", Replicas: 2},
			{Resources: "pods", Partitions: "8-15", Replicas: 2},
			{Replicas: 1},
		},
		Flags: map[string][]string{"cache": cacheFlags},
	})
}

// splitNamespaces returns n namespaces, half in each pod shard.
func splitNamespaces(n int) []string {
	var lo, hi []string
	for i := 0; len(lo) < n/2 || len(hi) < n/2; i++ {
		ns := fmt.Sprintf("ns-%d", i)
		if kube.Partition(ns) < 8 && len(lo) < n/2 {
			lo = append(lo, ns)
		} else if kube.Partition(ns) >= 8 && len(hi) < n/2 {
			hi = append(hi, ns)
		}
	}
	var out []string
	for i := range lo {
		out = append(out, lo[i], hi[i])
	}
	return out
}

// churn writes n changes over pods in namespaces and returns the last
// revision.
func (e *env) churn(t *testing.T, ctx context.Context, namespaces []string, n, seed int) int64 {
	t.Helper()
	live := map[string]bool{}
	var last int64
	for i := range n {
		ns := namespaces[(i*7+seed)%len(namespaces)]
		name := fmt.Sprintf("p%d", (i*3+seed)%11)
		key := ns + "/" + name
		switch {
		case live[key] && i%5 == 0:
			last = e.del(t, ctx, ns, name).RV
			delete(live, key)
		default:
			last = e.put(t, ctx, ns, name, labeledPod(ns, name, fmt.Sprintf("n%d", i%3), []string{"web", "db"}[i%2]), !live[key]).RV
			live[key] = true
		}
	}
	return last
}

// TestShardedCache: pods split over 2 shards x 2 replicas. LISTs equal
// etcd at the same revision in every resourceVersion mode, a cluster-wide
// watch across the shards sees every event once in order, and resumes work
// inside the window, inside the stream's history, and fail with 410 before
// both.
func TestShardedCache(t *testing.T) {
	e := shardedStack(t, "--default-watch-cache-size=30")
	ctx := testContext(t, 3*time.Minute)
	namespaces := splitNamespaces(8)
	from := e.rev(t, ctx)
	_, live := e.openWatch(t, ctx, "/api/v1/pods?watch=true&resourceVersion="+strconv.FormatInt(from, 10))
	last := e.churn(t, ctx, namespaces, 300, 1)

	history, err := checker.EtcdHistory(ctx, e.etcd, "/registry/pods/", from+1, last)
	if err != nil {
		t.Fatal(err)
	}
	want := checker.ExpectedEvents("/registry/pods/", history, nil)
	t.Run("cluster-wide watch across shards", func(t *testing.T) {
		for _, err := range checker.CheckWatch(want, collect(t, ctx, live, last)) {
			t.Error(err)
		}
	})

	listEquals := func(t *testing.T, path, prefix string) int64 {
		t.Helper()
		var all []json.RawMessage
		var rv string
		next := path
		for {
			var l podList
			if code := e.get(t, next, &l); code != 200 {
				t.Fatalf("GET %s: %d", next, code)
			}
			if rv == "" {
				rv = l.Metadata.ResourceVersion
			}
			all = append(all, l.Items...)
			if l.Metadata.Continue == "" {
				break
			}
			next = prefix + "?limit=7&continue=" + url.QueryEscape(l.Metadata.Continue)
		}
		r, _ := strconv.ParseInt(rv, 10, 64)
		etcdPrefix := "/registry/pods/"
		if p := prefix[len("/api/v1/"):]; len(p) > len("pods") {
			ns := p[len("namespaces/") : len(p)-len("/pods")]
			etcdPrefix += ns + "/"
		}
		if got, want := names(all), e.etcdNames(t, ctx, etcdPrefix, r, nil); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s at %d:\n got %v\nwant %v", path, r, got, want)
		}
		return r
	}
	t.Run("lists in every mode", func(t *testing.T) {
		for _, prefix := range []string{"/api/v1/pods", "/api/v1/namespaces/" + namespaces[1] + "/pods"} {
			if r := listEquals(t, prefix, prefix); r < last {
				t.Errorf("consistent LIST of %s at %d, older than %d", prefix, r, last)
			}
			listEquals(t, prefix+"?resourceVersion=0", prefix)
			listEquals(t, prefix+"?resourceVersion="+strconv.FormatInt(last-3, 10)+"&resourceVersionMatch=NotOlderThan", prefix)
			if r := listEquals(t, prefix+"?resourceVersion="+strconv.FormatInt(last-5, 10)+"&resourceVersionMatch=Exact", prefix); r != last-5 {
				t.Errorf("Exact LIST answered at %d, want %d", r, last-5)
			}
			listEquals(t, prefix+"?limit=7", prefix)
		}
	})

	t.Run("resume inside the window", func(t *testing.T) {
		_, evs := e.openWatch(t, ctx, "/api/v1/pods?watch=true&resourceVersion="+strconv.FormatInt(want[len(want)-10].RV-1, 10))
		for _, err := range checker.CheckWatch(want[len(want)-10:], collect(t, ctx, evs, last)) {
			t.Error(err)
		}
	})
	t.Run("resume inside the stream's history", func(t *testing.T) {
		// 300 changes over two shards with 30-event windows: from the start
		// is far older than either window.
		_, evs := e.openWatch(t, ctx, "/api/v1/pods?watch=true&resourceVersion="+strconv.FormatInt(from, 10))
		for _, err := range checker.CheckWatch(want, collect(t, ctx, evs, last)) {
			t.Error(err)
		}
		_, evs = e.openWatch(t, ctx, "/api/v1/namespaces/"+namespaces[0]+"/pods?watch=true&resourceVersion="+strconv.FormatInt(from, 10))
		var nsWant []checker.WatchEvent
		for _, w := range want {
			if len(w.Key) > len(namespaces[0]) && w.Key[:len(namespaces[0])+1] == namespaces[0]+"/" {
				nsWant = append(nsWant, w)
			}
		}
		for _, err := range checker.CheckWatch(nsWant, collect(t, ctx, evs, nsWant[len(nsWant)-1].RV)) {
			t.Error(err)
		}
	})
	t.Run("resume before both", func(t *testing.T) {
		_, evs := e.openWatch(t, ctx, "/api/v1/pods?watch=true&resourceVersion=1")
		ev := <-evs
		var st status
		json.Unmarshal(ev.Object, &st)
		if ev.Type != "ERROR" || st.Code != 410 || st.Reason != "Expired" {
			t.Fatalf("got %s %s", ev.Type, ev.Object)
		}
	})
}

// TestCacheReplicaKilled kills one replica of a pod shard under load:
// watchers are not broken (no reconnect, nothing lost), LISTs keep being
// answered by the other replica, and the restarted replica rebuilds and
// becomes ready.
func TestCacheReplicaKilled(t *testing.T) {
	e := shardedStack(t)
	ctx := testContext(t, 3*time.Minute)
	namespaces := splitNamespaces(6)
	from := e.rev(t, ctx)
	client := e.resumingClient(ctx, "/api/v1/pods?watch=true&allowWatchBookmarks=true", from)
	nsClient := e.resumingClient(ctx, "/api/v1/namespaces/"+namespaces[0]+"/pods?watch=true", from)
	e.churn(t, ctx, namespaces, 100, 2)
	lists := 0
	// Kill each replica of the shard in turn (restarting it in between), so
	// that whichever one carried the fanout's upstream stream is killed.
	for v, name := range []string{"cache-0-0", "cache-0-1"} {
		victim := e.Proc(name)
		victim.Kill()
		for i := range 10 {
			var l podList
			if code := e.get(t, "/api/v1/pods", &l); code != 200 {
				t.Fatalf("LIST %d with %s down: %d", i, name, code)
			}
			lists++
			e.churn(t, ctx, namespaces, 5, 3+i+10*v)
		}
		if err := victim.Start(); err != nil {
			t.Fatal(err)
		}
		if err := victim.WaitReady(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		e.churn(t, ctx, namespaces, 30, 60+v)
	}
	last := e.churn(t, ctx, namespaces, 100, 40)

	history, err := checker.EtcdHistory(ctx, e.etcd, "/registry/pods/", from+1, last)
	if err != nil {
		t.Fatal(err)
	}
	want := checker.ExpectedEvents("/registry/pods/", history, nil)
	for _, err := range checker.CheckWatch(want, client.until(t, ctx, last)) {
		t.Error(err)
	}
	var nsWant []checker.WatchEvent
	for _, w := range want {
		if len(w.Key) > len(namespaces[0]) && w.Key[:len(namespaces[0])+1] == namespaces[0]+"/" {
			nsWant = append(nsWant, w)
		}
	}
	for _, err := range checker.CheckWatch(nsWant, nsClient.until(t, ctx, nsWant[len(nsWant)-1].RV)) {
		t.Error(err)
	}
	if client.reconnects() != 0 || nsClient.reconnects() != 0 {
		t.Errorf("watches were broken: %d and %d reconnects", client.reconnects(), nsClient.reconnects())
	}
	t.Logf("%d LISTs answered with a replica down; %d events to the cluster-wide watcher", lists, len(want))
}
