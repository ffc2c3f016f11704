package containers

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moby/moby/client"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientfeatures "k8s.io/client-go/features"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"herald.dev/integration/checker"
	"herald.dev/integration/stack"
	"herald.dev/libs/kube"
)

// The relist storm: a fleet of client-go informers, each like a kubelet
// (pods of one node, by spec.nodeName), watches through both frontdoors
// while every cache and fanout replica is killed at once and started again.
// A fleet that relisted on such a wave would send one LIST per informer to
// the caches (and, on a cold cache, to etcd); Herald must instead let every
// informer resume its watch from its resourceVersion.
const (
	// fleetUsers is how many users the fleet spreads over (each its own
	// rest.Config, connections and per-user limits), half per frontdoor:
	// frontdoor allows 1,000 watches per user.
	fleetUsers = 8
	// informersPerNode: kubelets of a node (each its own informer and
	// watch); podsPerNode pods run on each node.
	informersPerNode = 10
	podsPerNode      = 2
	// fleetMemoryBound is the resident memory no service may exceed during
	// the reconnect wave.
	fleetMemoryBound = 512 << 20
)

// fleetSize is the number of informers: HERALD_RELIST_INFORMERS, or 5,000
// (issue 17's number; on the 2-core machine the suite runs on, the fleet
// syncs in about 25 s, the wave reconnects in 11-27 s, and the whole
// scenario takes under two minutes).
func fleetSize(t *testing.T) int {
	n := 5000
	if v := os.Getenv("HERALD_RELIST_INFORMERS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < informersPerNode*2 {
			t.Fatalf("HERALD_RELIST_INFORMERS=%q: want a number of at least %d", v, informersPerNode*2)
		}
	}
	return n
}

// fleetTokens are the fleet's users in frontdoor's token file (one line
// each, system:masters like the admin: authorization is not under test).
func fleetTokens(admin string) string {
	var b strings.Builder
	for u := range fleetUsers {
		fmt.Fprintf(&b, "%s-fleet-%d,herald-fleet-%d,herald-fleet-%d,\"system:masters\"\n", admin, u, u, u)
	}
	return b.String()
}

// fleetInformer is one kubelet-like informer and the history its handlers
// saw.
type fleetInformer struct {
	node      string
	watchList bool
	inf       cache.SharedIndexInformer

	mu  sync.Mutex
	got []checker.WatchEvent
}

func (f *fleetInformer) record(typ string, obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj, typ = d.Obj, "DELETED-UNKNOWN" // a relist found it gone: never expected
	}
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	rv, _ := strconv.ParseInt(p.ResourceVersion, 10, 64)
	f.mu.Lock()
	f.got = append(f.got, checker.WatchEvent{Type: typ, Key: p.Namespace + "/" + p.Name, RV: rv})
	f.mu.Unlock()
}

func (f *fleetInformer) events() []checker.WatchEvent {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.got)
}

// synced is the informer's resourceVersion (bookmarks move it too).
func (f *fleetInformer) synced() int64 {
	rv, _ := strconv.ParseInt(f.inf.LastSyncResourceVersion(), 10, 64)
	return rv
}

// fleetPod is one of the fleet's pods.
type fleetPod struct{ key, ns, name, node string }

// fleetPods are podsPerNode pods on each of nodes nodes, over two
// namespaces, one in each cache shard.
func fleetPods(nodes int) []fleetPod {
	var lo, hi string
	for i := 0; lo == "" || hi == ""; i++ {
		ns := fmt.Sprintf("relist-%d", i)
		if kube.Partition(ns) < 8 && lo == "" {
			lo = ns
		} else if kube.Partition(ns) >= 8 && hi == "" {
			hi = ns
		}
	}
	var out []fleetPod
	for k := range nodes {
		for j := range podsPerNode {
			ns := []string{lo, hi}[(k+j)%2]
			name := fmt.Sprintf("kubelet-%04d-%d", k, j)
			out = append(out, fleetPod{key: podPrefix + ns + "/" + name, ns: ns, name: name, node: fmt.Sprintf("kubelet-%04d", k)})
		}
	}
	return out
}

func fleetPodJSON(p fleetPod, gen int) string {
	b, _ := json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": p.name, "namespace": p.ns, "labels": map[string]string{"app": "fleet"}},
		"spec":     map[string]any{"nodeName": p.node, "containers": []map[string]any{{"name": "c", "image": "img"}}},
		"status":   map[string]any{"phase": "Running", "observedGeneration": gen},
	})
	return string(b)
}

// seedFleet writes every pod; it returns the revision after the last.
func seedFleet(ctx context.Context, cli *clientv3.Client, pods []fleetPod) (int64, error) {
	var rev int64
	for len(pods) > 0 {
		n := min(len(pods), 100) // etcd's default --max-txn-ops is 128
		ops := make([]clientv3.Op, 0, n)
		for _, p := range pods[:n] {
			ops = append(ops, clientv3.OpPut(p.key, fleetPodJSON(p, 0)))
		}
		resp, err := cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return 0, err
		}
		rev, pods = resp.Header.Revision, pods[n:]
	}
	return rev, nil
}

// fleetChurn updates, deletes and re-creates the fleet's pods (each stays
// on its node) at a steady rate until ctx ends.
func fleetChurn(ctx context.Context, cli *clientv3.Client, pods []fleetPod, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	r := rand.New(rand.NewPCG(17, 10))
	gone := map[string]bool{}
	for gen := 1; ; gen++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		p := pods[r.IntN(len(pods))]
		// Not derived from ctx: a write cancelled in flight may still
		// commit after the scenario read its last revision.
		wctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		if !gone[p.key] && gen%7 == 0 {
			if _, err := cli.Delete(wctx, p.key); err == nil {
				gone[p.key] = true
			}
		} else if _, err := cli.Put(wctx, p.key, fleetPodJSON(p, gen)); err == nil {
			gone[p.key] = false
		}
		cancel()
	}
}

// fleetConfigs are the users' client configurations, alternating between
// the frontdoors. Each has its own dialer, so client-go gives it its own
// transport (and HTTP/2 connections), as separate processes would have.
func fleetConfigs(ctx context.Context, c *cluster) ([]*rest.Config, error) {
	var out []*rest.Config
	for u := range fleetUsers {
		base, err := c.frontdoorURL(ctx, u)
		if err != nil {
			return nil, err
		}
		out = append(out, &rest.Config{
			Host:            base,
			BearerToken:     fmt.Sprintf("%s-fleet-%d", c.token, u),
			TLSClientConfig: rest.TLSClientConfig{CAData: c.pki.CAPEM},
			QPS:             -1, // no client-side throttling: the server's limits are under test
			Dial:            (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			UserAgent:       fmt.Sprintf("herald-fleet-%d", u),
		})
	}
	return out, nil
}

// startFleet starts n informers, the first half with WatchList on, the
// other half with it off (a LIST then a watch), and waits until all have
// synced.
func startFleet(t *testing.T, ctx context.Context, c *cluster, n int, stop <-chan struct{}) []*fleetInformer {
	t.Helper()
	cfgs, err := fleetConfigs(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	var clients []kubernetes.Interface
	for _, cfg := range cfgs {
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, cs)
	}
	def := clientfeatures.FeatureGates()
	t.Cleanup(func() { clientfeatures.ReplaceFeatureGates(def) })
	nodes := n / informersPerNode
	fleet := make([]*fleetInformer, n)
	for half, watchList := range []bool{true, false} {
		clientfeatures.ReplaceFeatureGates(stack.WatchListGates{Default: def, WatchList: watchList})
		start := time.Now()
		part := fleet[half*n/2 : (half+1)*n/2]
		for i := range part {
			idx := half*n/2 + i
			f := &fleetInformer{node: fmt.Sprintf("kubelet-%04d", idx%nodes), watchList: watchList}
			f.inf = coreinformers.NewFilteredPodInformer(clients[idx%len(clients)], metav1.NamespaceAll, 0, cache.Indexers{},
				func(o *metav1.ListOptions) { o.FieldSelector = "spec.nodeName=" + f.node })
			f.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
				AddFunc:    func(o any) { f.record("ADDED", o) },
				UpdateFunc: func(_, o any) { f.record("MODIFIED", o) },
				DeleteFunc: func(o any) { f.record("DELETED", o) },
			})
			part[i] = f
		}
		// The reflector reads the gate when Run builds it, before the
		// informer can sync: the gate changes only once all have synced.
		for _, f := range part {
			go f.inf.Run(stop)
		}
		waitFor(t, 5*time.Minute, fmt.Sprintf("%d informers (WatchList %v) to sync", len(part), watchList), func() bool {
			for _, f := range part {
				if !f.inf.HasSynced() {
					return false
				}
			}
			return true
		})
		t.Logf("%d informers with WatchList %v synced in %v", len(part), watchList, time.Since(start).Round(time.Millisecond))
	}
	return fleet
}

// saveHeapProfile writes nd's heap profile (its admin server's pprof) to
// file; a failure is logged, not fatal (diagnostics only).
func saveHeapProfile(t *testing.T, ctx context.Context, nd *node, file string) {
	a, err := nd.addr(ctx, nd.health)
	if err == nil {
		var resp *http.Response
		if resp, err = http.Get("http://" + a + "/debug/pprof/heap"); err == nil {
			defer resp.Body.Close()
			var b []byte
			if b, err = io.ReadAll(resp.Body); err == nil {
				err = os.WriteFile(file, b, 0o644)
			}
		}
	}
	if err != nil {
		t.Logf("heap profile of %s: %v", nd.name, err)
	}
}

// fleetCaughtUp reports how many informers have reached revision rev.
func fleetCaughtUp(fleet []*fleetInformer, rev int64) int {
	n := 0
	for _, f := range fleet {
		if f.synced() >= rev {
			n++
		}
	}
	return n
}

// memorySampler keeps the highest resident memory each node reports on
// /metrics (process_resident_memory_bytes) while it runs.
// and the highest Go heap in use (go_memstats_heap_inuse_bytes: what is
// live or not yet swept, without the pages a burst left mapped).
type memorySampler struct {
	mu       sync.Mutex
	peak     map[string]float64
	base     map[string]float64
	peakHeap map[string]float64
	baseHeap map[string]float64
}

func sampleMemory(ctx context.Context, nodes []*node, every time.Duration) (*memorySampler, func()) {
	m := &memorySampler{peak: map[string]float64{}, base: map[string]float64{}, peakHeap: map[string]float64{}, baseHeap: map[string]float64{}}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			var wg sync.WaitGroup
			for _, n := range nodes {
				wg.Go(func() {
					rctx, rcancel := context.WithTimeout(sctx, 2*time.Second)
					defer rcancel()
					v, err := n.metric(rctx, "process_resident_memory_bytes")
					if err != nil || v == 0 {
						return // restarting
					}
					h, _ := n.metric(rctx, "go_memstats_heap_inuse_bytes")
					m.mu.Lock()
					if _, ok := m.base[n.name]; !ok && h > 0 { // both read
						m.base[n.name], m.baseHeap[n.name] = v, h
					}
					m.peak[n.name] = max(m.peak[n.name], v)
					m.peakHeap[n.name] = max(m.peakHeap[n.name], h)
					m.mu.Unlock()
				})
			}
			wg.Wait()
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return m, func() { cancel(); <-done }
}

// metricOn sums the samples of one metric whose labels contain every one
// of labels (`verb="list"`).
func metricOn(ctx context.Context, nodes []*node, name string, labels ...string) (float64, error) {
	var sum float64
	for _, n := range nodes {
		v, err := n.metricWhere(ctx, name, labels...)
		for try := 1; err != nil && try < 5 && ctx.Err() == nil; try++ {
			v, err = n.metricWhere(ctx, name, labels...) // a loaded machine drops a scrape now and then
		}
		if err != nil {
			return 0, fmt.Errorf("%s: %w", n.name, err)
		}
		sum += v
	}
	return sum, nil
}

// relistStorm: see the constants above. It runs on its own (no scenario
// clients): the fleet is the client.
func relistStorm(t *testing.T, c *cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	n := fleetSize(t)
	pods := fleetPods(n / informersPerNode)
	seedRev, err := seedFleet(ctx, c.etcd, pods)
	if err != nil {
		t.Fatalf("seeding %d pods: %v", len(pods), err)
	}
	stop := make(chan struct{})
	defer close(stop)
	fleet := startFleet(t, ctx, c, n, stop)
	fronts := c.group("frontdoor")
	var restarted []*node
	for _, sh := range c.shards {
		restarted = append(restarted, c.group(sh.alias)...)
	}
	caches := slices.Clone(restarted)
	restarted = append(restarted, c.group("fanout")...)
	etcds := c.group("etcd")

	cctx, stopChurn := context.WithCancel(ctx)
	churned := make(chan struct{})
	go func() { defer close(churned); fleetChurn(cctx, c.etcd, pods, 20*time.Millisecond) }()
	defer func() { stopChurn(); <-churned }()
	warm := currentRevision(t, ctx, c.etcd) + 50
	waitFor(t, 5*time.Minute, "the fleet to follow the churn", func() bool {
		return currentRevision(t, ctx, c.etcd) > warm && fleetCaughtUp(fleet, warm) == n
	})

	// Before: LISTs and watches frontdoor passed on, LISTs the caches
	// served, ranges etcd served.
	listsBefore, err := metricOn(ctx, fronts, "apiserver_request_total", `verb="list"`, `resource="pods"`)
	if err != nil {
		t.Fatal(err)
	}
	watchesBefore, _ := metricOn(ctx, fronts, "apiserver_request_total", `verb="watch"`, `resource="pods"`)
	cacheListsBefore, err := metricOn(ctx, caches, "apiserver_cache_list_total")
	if err != nil {
		t.Fatal(err)
	}
	rangesBefore, err := metricOn(ctx, etcds, "etcd_mvcc_range_total")
	if err != nil || rangesBefore == 0 {
		t.Fatalf("etcd's etcd_mvcc_range_total: %v, %v (the suite has read etcd: it cannot be 0)", rangesBefore, err)
	}
	all := slices.Concat(c.group("ingest"), restarted, fronts, etcds)
	mem, stopSampling := sampleMemory(ctx, all, 250*time.Millisecond)
	defer stopSampling()

	for _, nd := range c.group("fanout") {
		w, _ := nd.metric(ctx, "herald_fanout_watchers")
		t.Logf("%s: %v watchers before the wave", nd.name, w)
	}
	if dir := os.Getenv("HERALD_RELIST_PROFILES"); dir != "" {
		for _, nd := range restarted {
			saveHeapProfile(t, ctx, nd, filepath.Join(dir, nd.name+".heap"))
		}
	}

	// The wave: SIGKILL every cache and fanout replica at once, then start
	// them all again.
	kill := time.Now()
	t.Logf("kill %d caches and %d fanouts at once", len(caches), len(restarted)-len(caches))
	errs := make(chan error, len(restarted))
	for _, nd := range restarted {
		go func() {
			_, err := c.docker.ContainerKill(ctx, nd.ctr.GetContainerID(), client.ContainerKillOptions{Signal: "KILL"})
			errs <- err
		}()
	}
	for range restarted {
		if err := <-errs; err != nil {
			t.Fatalf("kill: %v", err)
		}
	}
	for _, nd := range restarted {
		go func() { errs <- nd.ctr.Start(ctx) }() // waits for readiness
	}
	for range restarted {
		if err := <-errs; err != nil {
			t.Fatalf("start: %v", err)
		}
	}
	ready := time.Since(kill)
	resumeRev := currentRevision(t, ctx, c.etcd)
	var caughtUp atomic.Int64
	waitFor(t, 5*time.Minute, fmt.Sprintf("all %d informers to resume past revision %d", n, resumeRev), func() bool {
		k := fleetCaughtUp(fleet, resumeRev)
		caughtUp.Store(int64(k))
		return k == n
	})
	reconnect := time.Since(kill)
	t.Logf("services ready %v after the kill; all %d informers resumed past revision %d after %v",
		ready.Round(time.Millisecond), n, resumeRev, reconnect.Round(time.Millisecond))

	// Churn on a little after the wave, then everyone must reach the end.
	after := currentRevision(t, ctx, c.etcd) + 50
	waitFor(t, 5*time.Minute, "50 more changes", func() bool { return currentRevision(t, ctx, c.etcd) > after })
	stopChurn()
	<-churned
	last := currentRevision(t, ctx, c.etcd)
	waitFor(t, 5*time.Minute, fmt.Sprintf("all informers to reach revision %d", last), func() bool {
		return fleetCaughtUp(fleet, last) == n
	})
	stopSampling()

	listsAfter, err := metricOn(ctx, fronts, "apiserver_request_total", `verb="list"`, `resource="pods"`)
	if err != nil {
		t.Fatal(err)
	}
	watchesAfter, _ := metricOn(ctx, fronts, "apiserver_request_total", `verb="watch"`, `resource="pods"`)
	cacheListsAfter, err := metricOn(ctx, caches, "apiserver_cache_list_total") // counted since each restart
	if err != nil {
		t.Fatal(err)
	}
	rangesAfter, err := metricOn(ctx, etcds, "etcd_mvcc_range_total")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("frontdoor: %v LISTs of pods, %v watches of pods during the wave; caches: %v LISTs before, %v since their restart; etcd: %v range requests during the wave",
		listsAfter-listsBefore, watchesAfter-watchesBefore, cacheListsBefore, cacheListsAfter, rangesAfter-rangesBefore)
	if d := listsAfter - listsBefore; d != 0 {
		t.Errorf("relist storm: %v LISTs of pods reached frontdoor during the wave (want 0: informers resume their watches)", d)
	}
	if cacheListsAfter != 0 {
		t.Errorf("relist storm: the caches served %v LISTs after their restart (want 0)", cacheListsAfter)
	}
	// etcd's ranges are logged, not bounded: they are the restarted
	// caches' own rebuilds (a paginated range per resource) and the deep
	// resumes' lookups of objects' previous states, not LISTs; a relist
	// reaches the caches first, and is caught above.
	mem.mu.Lock()
	for _, nd := range all {
		t.Logf("memory %s: resident %.0f MiB before, %.0f MiB peak; heap in use %.0f MiB before, %.0f MiB peak", nd.name,
			mem.base[nd.name]/(1<<20), mem.peak[nd.name]/(1<<20), mem.baseHeap[nd.name]/(1<<20), mem.peakHeap[nd.name]/(1<<20))
		if mem.peak[nd.name] > fleetMemoryBound {
			t.Errorf("%s: %.0f MiB resident during the wave (bound %d MiB)", nd.name, mem.peak[nd.name]/(1<<20), fleetMemoryBound>>20)
		}
	}
	mem.mu.Unlock()

	checkFleet(t, ctx, c, fleet, pods, seedRev, last)
	t.Logf("RelistStorm: %d informers (%d with WatchList), reconnect %v", n, n/2, reconnect.Round(time.Millisecond))
}

// checkFleet compares each informer's handler history with etcd's: the
// pods of its node at seedRev (ADDED, in any order), then every change of
// them up to last, once each, in order.
func checkFleet(t *testing.T, ctx context.Context, c *cluster, fleet []*fleetInformer, pods []fleetPod, seedRev, last int64) {
	t.Helper()
	nodeOf := map[string]string{}
	for _, p := range pods {
		nodeOf[checker.KeyName(podPrefix, p.key)] = p.node
	}
	initial := map[string][]checker.WatchEvent{}
	snap, err := c.etcd.Get(ctx, podPrefix+"relist-", clientv3.WithPrefix(), clientv3.WithRev(seedRev), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range snap.Kvs {
		key := checker.KeyName(podPrefix, string(kv.Key))
		initial[nodeOf[key]] = append(initial[nodeOf[key]], checker.WatchEvent{Type: "ADDED", Key: key, RV: kv.ModRevision})
	}
	changes, err := expectedEvents(ctx, c.etcd, seedRev, last)
	if err != nil {
		t.Fatal(err)
	}
	later := map[string][]checker.WatchEvent{}
	for _, e := range changes {
		if node, ok := nodeOf[e.Key]; ok {
			later[node] = append(later[node], e)
		}
	}
	var total verdict
	failed := 0
	for i, f := range fleet {
		got := f.events()
		// The initial ADDED events come in the server's order, not by
		// revision: compare them sorted.
		k := min(len(initial[f.node]), len(got))
		slices.SortFunc(got[:k], byRVKey)
		want := slices.Concat(sortedByRV(initial[f.node]), later[f.node])
		v := tally(want, got)
		total.events += v.events
		total.lost += v.lost
		total.duplicated += v.duplicated
		total.reordered += v.reordered
		if !v.ok() {
			if failed++; failed <= 5 {
				t.Errorf("informer %d (%s, WatchList %v): %v; %v", i, f.node, f.watchList, v, v.errs[:min(len(v.errs), 5)])
			}
		}
	}
	t.Logf("fleet: %d informers, %d events, %d lost, %d duplicated, %d reordered; %d informers differ from etcd",
		len(fleet), total.events, total.lost, total.duplicated, total.reordered, failed)
}

func sortedByRV(evs []checker.WatchEvent) []checker.WatchEvent {
	out := slices.Clone(evs)
	slices.SortFunc(out, byRVKey)
	return out
}

// byRVKey orders events by resourceVersion, then key (pods seeded in one
// transaction share a revision).
func byRVKey(a, b checker.WatchEvent) int {
	if c := cmp.Compare(a.RV, b.RV); c != 0 {
		return c
	}
	return strings.Compare(a.Key, b.Key)
}
