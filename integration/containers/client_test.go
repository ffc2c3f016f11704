package containers

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"herald.dev/integration/checker"
	"herald.dev/libs/kube"
)

const podPrefix = "/registry/pods/"

// churnNamespaces are the writer's namespaces: two in partitions 0-7
// (cache-a), two in 8-15 (cache-b), interleaved.
var churnNamespaces = splitNamespaces(4)

// splitNamespaces returns n namespaces "ns-<i>", half of them in partitions
// 0-7 and half in 8-15, alternating.
func splitNamespaces(n int) []string {
	var lo, hi []string
	for i := 0; len(lo) < n/2 || len(hi) < n/2; i++ {
		ns := fmt.Sprintf("ns-%d", i)
		if kube.Partition(ns) < 8 {
			lo = append(lo, ns)
		} else {
			hi = append(hi, ns)
		}
	}
	var out []string
	for i := range n / 2 {
		out = append(out, lo[i], hi[i])
	}
	return out
}

// byHalf counts events in namespaces of partitions 0-7 and 8-15.
func byHalf(evs []checker.WatchEvent) (lo, hi int) {
	for _, e := range evs {
		ns, _, _ := strings.Cut(e.Key, "/")
		if kube.Partition(ns) < 8 {
			lo++
		} else {
			hi++
		}
	}
	return lo, hi
}

// churn keeps creating, updating and deleting pods in etcd at a steady
// rate until ctx ends. Failed writes (an etcd member just died) are
// skipped: the expected history is read back from etcd afterwards, so the
// writer needs no bookkeeping of its own.
func churn(ctx context.Context, cli *clientv3.Client, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	exists := map[string]bool{}
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		ns, name := churnNamespaces[n%len(churnNamespaces)], fmt.Sprintf("p-%02d", n%48)
		key := podPrefix + ns + "/" + name
		// Not derived from ctx: a write cancelled in flight may still commit
		// after the scenario read its last revision. Stopping waits for it.
		wctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		var err error
		if exists[key] && n%5 == 0 {
			_, err = cli.Delete(wctx, key)
			if err == nil {
				exists[key] = false
			}
		} else {
			_, err = cli.Put(wctx, key, podJSON(ns, name, n))
			if err == nil {
				exists[key] = true
			}
		}
		cancel()
	}
}

func podJSON(ns, name string, gen int) string {
	b, _ := json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": name, "namespace": ns, "labels": map[string]string{"app": "churn"}},
		"spec":     map[string]any{"nodeName": fmt.Sprintf("node-%d", gen%4), "containers": []map[string]any{{"name": "c", "image": "img"}}},
		"status":   map[string]any{"phase": "Running", "observedGeneration": gen},
	})
	return string(b)
}

// watcher is a resuming client: it watches pods through frontdoor from a
// resourceVersion and, whenever its stream ends, fails or goes silent
// (no event or bookmark for idleTimeout), reconnects with the last
// resourceVersion it saw, alternating between frontdoor replicas.
type watcher struct {
	name   string
	c      *cluster
	http   *http.Client
	prefer int
	from   int64 // the resourceVersion it started from

	mu         sync.Mutex
	got        []checker.WatchEvent
	rv         int64
	reconnects int
	expired    int // 410 Gone (as a status or an ERROR event)
	statuses   map[int]int
}

const idleTimeout = 5 * time.Second // bookmarks come every second

func newWatcher(c *cluster, name string, prefer int, from int64) *watcher {
	return &watcher{name: name, c: c, http: c.httpClient(), prefer: prefer, from: from, rv: from, statuses: map[int]int{}}
}

// run watches until ctx ends or the watch expires (a 410 cannot be resumed
// from: the test fails on it).
func (w *watcher) run(ctx context.Context) {
	for attempt := 0; attempt < 5000 && ctx.Err() == nil; attempt++ {
		if attempt > 0 {
			w.mu.Lock()
			w.reconnects++
			w.mu.Unlock()
			select { // back off a little between attempts; not a synchronisation
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
		if w.once(ctx, w.prefer+attempt) {
			return
		}
	}
}

// once runs one watch request; it reports whether the watcher must stop.
func (w *watcher) once(ctx context.Context, attempt int) (stop bool) {
	base, err := w.c.frontdoorURL(ctx, attempt)
	if err != nil {
		return false
	}
	w.mu.Lock()
	rv := w.rv
	w.mu.Unlock()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, _ := http.NewRequestWithContext(rctx, http.MethodGet,
		base+"/api/v1/pods?watch=true&allowWatchBookmarks=true&resourceVersion="+strconv.FormatInt(rv, 10), nil)
	resp, err := w.http.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		w.mu.Lock()
		defer w.mu.Unlock()
		w.statuses[resp.StatusCode]++
		if resp.StatusCode == http.StatusGone {
			w.expired++
			return true
		}
		return false
	}
	lines := make(chan []byte)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			select {
			case lines <- append([]byte(nil), sc.Bytes()...):
			case <-rctx.Done():
				return
			}
		}
	}()
	idle := time.NewTimer(idleTimeout)
	defer idle.Stop()
	for {
		select {
		case <-ctx.Done():
			return true
		case <-idle.C:
			return false // silent stream: resume elsewhere
		case line, ok := <-lines:
			if !ok {
				return false
			}
			idle.Reset(idleTimeout)
			if w.handle(line) {
				return true
			}
		}
	}
}

type wireEvent struct {
	Type   string `json:"type"`
	Object struct {
		Code     int `json:"code"`
		Metadata struct {
			Name            string `json:"name"`
			Namespace       string `json:"namespace"`
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	} `json:"object"`
}

// handle records one line; it reports whether the watcher must stop.
func (w *watcher) handle(line []byte) bool {
	var ev wireEvent
	if err := json.Unmarshal(line, &ev); err != nil {
		return false // a torn line from a dying stream: resume
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch ev.Type {
	case "ERROR":
		if ev.Object.Code == http.StatusGone {
			w.expired++
			return true
		}
		return false
	case "BOOKMARK":
		if rv, err := strconv.ParseInt(ev.Object.Metadata.ResourceVersion, 10, 64); err == nil && rv > w.rv {
			w.rv = rv
		}
		return false
	}
	rv, _ := strconv.ParseInt(ev.Object.Metadata.ResourceVersion, 10, 64)
	w.got = append(w.got, checker.WatchEvent{Type: ev.Type, Key: ev.Object.Metadata.Namespace + "/" + ev.Object.Metadata.Name, RV: rv})
	if rv > w.rv {
		w.rv = rv
	}
	return false
}

// progress is what the watcher has seen so far.
func (w *watcher) progress() (events int, rv int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.got), w.rv
}

// verdict is one client's result against etcd's history.
type verdict struct {
	events, lost, duplicated, reordered int
	expired, reconnects                 int
	statuses                            map[int]int
	errs                                []error
}

func (v verdict) String() string {
	return fmt.Sprintf("%d events, %d lost, %d duplicated, %d reordered, %d expired (410), %d reconnects, statuses %v",
		v.events, v.lost, v.duplicated, v.reordered, v.expired, v.reconnects, v.statuses)
}

func (v verdict) ok() bool {
	return v.lost == 0 && v.duplicated == 0 && v.reordered == 0 && v.expired == 0 && len(v.errs) == 0
}

// upTo is what the watcher saw, without the events after revision last at
// its end (one after last followed by one before it stays: a reorder).
func (w *watcher) upTo(last int64) []checker.WatchEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	got := w.got
	for len(got) > 0 && got[len(got)-1].RV > last {
		got = got[:len(got)-1]
	}
	return append([]checker.WatchEvent(nil), got...)
}

// judge compares what the watcher saw up to revision last with what it
// must see. Events after last are outside the checked window (a write that
// timed out during a fault may still commit after the scenario read last).
func (w *watcher) judge(want []checker.WatchEvent, last int64) verdict {
	got := w.upTo(last)
	w.mu.Lock()
	defer w.mu.Unlock()
	v := tally(want, got)
	v.expired, v.reconnects, v.statuses = w.expired, w.reconnects, w.statuses
	return v
}

// tally counts what got lost, duplicated and reordered against want.
func tally(want, got []checker.WatchEvent) verdict {
	v := verdict{events: len(got)}
	seen := map[checker.WatchEvent]int{}
	for i, e := range got {
		seen[e]++
		if seen[e] > 1 {
			v.duplicated++
		}
		if i > 0 && e.RV < got[i-1].RV {
			v.reordered++
		}
	}
	for _, e := range want {
		if seen[e] == 0 {
			v.lost++
		}
	}
	v.errs = checker.CheckWatch(want, got)
	return v
}

// expectedEvents turns etcd's history of pods in (from, to] into the watch
// events a client from resourceVersion from must see.
func expectedEvents(ctx context.Context, cli *clientv3.Client, from, to int64) ([]checker.WatchEvent, error) {
	before, err := cli.Get(ctx, podPrefix, clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithKeysOnly())
	if err != nil {
		return nil, err
	}
	exists := map[string]bool{}
	for _, kv := range before.Kvs {
		exists[string(kv.Key)] = true
	}
	changes, err := etcdHistory(ctx, cli, from+1, to)
	if err != nil {
		return nil, err
	}
	var out []checker.WatchEvent
	for _, ch := range changes {
		typ := "MODIFIED"
		switch {
		case ch.Delete:
			typ = "DELETED"
			delete(exists, ch.Key)
		case !exists[ch.Key]:
			typ = "ADDED"
			exists[ch.Key] = true
		}
		out = append(out, checker.WatchEvent{Type: typ, Key: checker.KeyName(podPrefix, ch.Key), RV: ch.Rev})
	}
	return out, nil
}

// etcdHistory reads pod changes in [from, to] with checker.EtcdHistory,
// asking again after the last change it got until a read comes back empty
// or reaches to: EtcdHistory stops at the first watch response whose header
// revision reaches to, and a watch catching up on old history sends it in
// several responses, all with the current header revision.
func etcdHistory(ctx context.Context, cli *clientv3.Client, from, to int64) ([]checker.Change, error) {
	var out []checker.Change
	for range 10000 {
		part, err := checker.EtcdHistory(ctx, cli, podPrefix, from, to)
		if err != nil {
			return nil, err
		}
		out = append(out, part...)
		if len(part) == 0 || part[len(part)-1].Rev >= to {
			return out, nil
		}
		from = part[len(part)-1].Rev + 1
	}
	return nil, fmt.Errorf("etcd history (%d, %d]: no end", from, to)
}

// streamOf turns watch events back into changes (without values), so that
// checker.Compare can name what differs from etcd's history.
func streamOf(evs []checker.WatchEvent) []checker.Change {
	out := make([]checker.Change, len(evs))
	for i, e := range evs {
		out[i] = checker.Change{Rev: e.RV, Key: podPrefix + e.Key, Delete: e.Type == "DELETED"}
	}
	return out
}

// ensure the etcd client is reachable before using it in a scenario.
func currentRevision(t *testing.T, ctx context.Context, cli *clientv3.Client) int64 {
	t.Helper()
	var rev int64
	waitFor(t, 2*time.Minute, "an etcd revision", func() bool { // a loaded machine (RelistStorm) can starve one read
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		resp, err := cli.Get(cctx, "/herald-e2e/probe")
		if err != nil {
			return false
		}
		rev = resp.Header.Revision
		return true
	})
	return rev
}
