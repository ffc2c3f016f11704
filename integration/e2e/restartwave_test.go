package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientfeatures "k8s.io/client-go/features"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"herald.dev/integration/checker"
	"herald.dev/integration/stack"
)

// waveInformer is one kubelet-like informer and what its handlers saw.
type waveInformer struct {
	node string
	rec  *recorder
	inf  cache.SharedIndexInformer
	mu   sync.Mutex
	got  []checker.WatchEvent
}

func (w *waveInformer) record(typ string, obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj, typ = d.Obj, "DELETED-UNKNOWN"
	}
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	rv, _ := strconv.ParseInt(p.ResourceVersion, 10, 64)
	w.mu.Lock()
	w.got = append(w.got, checker.WatchEvent{Type: typ, Key: p.Namespace + "/" + p.Name, RV: rv})
	w.mu.Unlock()
}

func (w *waveInformer) synced() int64 {
	rv, _ := strconv.ParseInt(w.inf.LastSyncResourceVersion(), 10, 64)
	return rv
}

// served is what Herald answered one request of an informer: a LIST (its
// revision and items) or a watch (where it started and what it sent).
type served struct {
	list  bool
	from  int64                // LIST: its revision; watch: the resourceVersion it resumed after (0: initial events)
	items []checker.WatchEvent // LIST items (RV: the object's); watch: events and BOOKMARKs in order
}

// recorder records, under the informer's client, every LIST and watch
// response as it went over the wire, so that what Herald served can be
// checked against etcd whatever client-go made of it.
type recorder struct {
	rt http.RoundTripper
	mu sync.Mutex
	rs []*served
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.rt.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusOK || !strings.HasSuffix(req.URL.Path, "/pods") {
		return resp, err
	}
	q := req.URL.Query()
	sv := &served{list: q.Get("watch") != "true"}
	r.mu.Lock()
	r.rs = append(r.rs, sv)
	r.mu.Unlock()
	if sv.list {
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		var l struct {
			Metadata struct{ ResourceVersion string } `json:"metadata"`
			Items    []struct {
				Metadata struct{ Namespace, Name, ResourceVersion string } `json:"metadata"`
			} `json:"items"`
		}
		if err := json.Unmarshal(b, &l); err != nil {
			return nil, err
		}
		r.mu.Lock()
		sv.from, _ = strconv.ParseInt(l.Metadata.ResourceVersion, 10, 64)
		for _, it := range l.Items {
			rv, _ := strconv.ParseInt(it.Metadata.ResourceVersion, 10, 64)
			sv.items = append(sv.items, checker.WatchEvent{Type: "ITEM", Key: it.Metadata.Namespace + "/" + it.Metadata.Name, RV: rv})
		}
		r.mu.Unlock()
		resp.Body = io.NopCloser(bytes.NewReader(b))
		return resp, nil
	}
	sv.from, _ = strconv.ParseInt(q.Get("resourceVersion"), 10, 64)
	if q.Get("sendInitialEvents") == "true" {
		sv.from = 0
	}
	pr, pw := io.Pipe()
	body := resp.Body
	go func() {
		sc := bufio.NewScanner(io.TeeReader(body, pw))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var ev watchEvent
			if json.Unmarshal(sc.Bytes(), &ev) != nil {
				continue
			}
			r.mu.Lock()
			sv.items = append(sv.items, ev.toCheck())
			r.mu.Unlock()
		}
		pw.CloseWithError(sc.Err())
	}()
	resp.Body = struct {
		io.Reader
		io.Closer
	}{pr, closerFunc(func() error { pr.Close(); return body.Close() })}
	return resp, nil
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// TestRestartWave kills every pod cache replica and every fanout replica at
// once under churn, as the containers' RelistStorm does on a small scale,
// with kubelet-like informers (one node's pods each, half WatchList) going
// through it. Whatever each informer does meanwhile (resume, relist), every
// response Herald sends it is checked against etcd's history: a LIST equals
// the node's pods at the list's revision, initial events equal them at
// their bookmark's revision, and a watch sends exactly the node's changes
// after the revision it resumed from, up to the last revision it claimed
// (its last event or bookmark). A relist's own effects on the informer
// (changes between its last event and the list folded into one update, a
// pod deleted meanwhile turned into DeletedFinalStateUnknown) are client-go's
// and only logged.
func TestRestartWave(t *testing.T) {
	e := startStack(t, stack.Options{
		CacheShards: []stack.CacheShard{
			{Resources: "pods", Partitions: "0-7", Replicas: 2},
			{Resources: "pods", Partitions: "8-15", Replicas: 2},
			{Replicas: 1},
		},
		Fanouts: 3,
	})
	ctx := testContext(t, 6*time.Minute)
	const nodes, perNode = 8, 4
	namespaces := splitNamespaces(2)
	type pod struct{ ns, name, node string }
	var pods []pod
	nodeOf := map[string]string{}
	for k := range nodes {
		for j := range 2 {
			p := pod{namespaces[(k+j)%2], fmt.Sprintf("w-%d-%d", k, j), fmt.Sprintf("node-%d", k)}
			pods = append(pods, p)
			nodeOf[p.ns+"/"+p.name] = p.node
			e.put(t, ctx, p.ns, p.name, podJSON(p.ns, p.name, p.node, 0), true)
		}
	}
	seedRev := e.rev(t, ctx)

	cfg, err := clientcmd.BuildConfigFromFlags("", e.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS = -1
	cfg.ContentType, cfg.AcceptContentTypes = "application/json", "application/json"
	def := clientfeatures.FeatureGates()
	t.Cleanup(func() { clientfeatures.ReplaceFeatureGates(def) })
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	var fleet []*waveInformer
	for half, watchList := range []bool{true, false} {
		clientfeatures.ReplaceFeatureGates(stack.WatchListGates{Default: def, WatchList: watchList})
		var part []*waveInformer
		for i := range nodes * perNode / 2 {
			w := &waveInformer{node: fmt.Sprintf("node-%d", (i+half)%nodes)}
			c := rest.CopyConfig(cfg)
			c.Wrap(func(rt http.RoundTripper) http.RoundTripper { w.rec = &recorder{rt: rt}; return w.rec })
			cs, err := kubernetes.NewForConfig(c)
			if err != nil {
				t.Fatal(err)
			}
			w.inf = coreinformers.NewFilteredPodInformer(cs, metav1.NamespaceAll, 0, cache.Indexers{},
				func(o *metav1.ListOptions) { o.FieldSelector = "spec.nodeName=" + w.node })
			w.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
				AddFunc:    func(o any) { w.record("ADDED", o) },
				UpdateFunc: func(_, o any) { w.record("MODIFIED", o) },
				DeleteFunc: func(o any) { w.record("DELETED", o) },
			})
			part = append(part, w)
			go w.inf.Run(stop)
		}
		waitUntil(t, ctx, "informers to sync", func() bool {
			for _, w := range part {
				if !w.inf.HasSynced() {
					return false
				}
			}
			return true
		})
		fleet = append(fleet, part...)
	}

	cctx, stopChurn := context.WithCancel(ctx)
	churned := make(chan struct{})
	go func() {
		defer close(churned)
		gone := map[string]bool{}
		for i := 1; cctx.Err() == nil; i++ {
			p := pods[(i*7)%len(pods)]
			key := p.ns + "/" + p.name
			wctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			if !gone[key] && i%7 == 0 {
				if _, err := e.etcd.Delete(wctx, "/registry/pods/"+key); err == nil {
					gone[key] = true
				}
			} else if _, err := e.etcd.Put(wctx, "/registry/pods/"+key, podJSON(p.ns, p.name, p.node, i)); err == nil {
				gone[key] = false
			}
			cancel()
			select {
			case <-cctx.Done():
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	defer func() { stopChurn(); <-churned }()
	warm := e.rev(t, ctx) + 50
	waitUntil(t, ctx, "the fleet to follow the churn", func() bool {
		for _, w := range fleet {
			if w.synced() < warm {
				return false
			}
		}
		return true
	})

	// Paginated LISTs all along the wave: the pages of one list go to
	// whichever replica round-robin picks, restarted or not, and together
	// must be etcd's pods at the list's revision.
	type paged struct {
		rev   int64
		names []string
	}
	var listed []paged
	lctx, stopLists := context.WithCancel(ctx)
	listsDone := make(chan struct{})
	go func() {
		defer close(listsDone)
		for lctx.Err() == nil {
			var all []json.RawMessage
			var rev int64
			next := "/api/v1/pods?limit=3"
			for next != "" && lctx.Err() == nil {
				req, _ := http.NewRequestWithContext(lctx, http.MethodGet, e.FrontdoorURL+next, nil)
				resp, err := e.http.Do(req)
				if err != nil {
					break
				}
				var l podList
				err = json.NewDecoder(resp.Body).Decode(&l)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK {
					all = nil // refused (not ready, not reached in time): start over
					break
				}
				if rev == 0 {
					rev, _ = strconv.ParseInt(l.Metadata.ResourceVersion, 10, 64)
				}
				all = append(all, l.Items...)
				next = ""
				if l.Metadata.Continue != "" {
					next = "/api/v1/pods?limit=3&continue=" + url.QueryEscape(l.Metadata.Continue)
				}
			}
			if next == "" && rev > 0 {
				listed = append(listed, paged{rev, names(all)})
			}
			select { // a pace, not a synchronization
			case <-lctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	defer func() { stopLists(); <-listsDone }()

	front := e.Proc("frontdoor-0")
	lists := func() float64 {
		return metricLabeled(t, front, "apiserver_request_total", `verb="list",resource="pods"`)
	}
	listsBefore := lists()
	var wave []*stack.Proc
	for _, p := range e.Procs() {
		if p.Bin == "fanout" || (p.Bin == "cache" && p.Name != "cache-2-0") {
			wave = append(wave, p)
		}
	}
	for _, p := range wave {
		p.Kill()
	}
	for _, p := range wave {
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range wave {
		if err := p.WaitReady(ctx, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	after := e.rev(t, ctx) + 100
	waitUntil(t, ctx, "100 more changes", func() bool { return e.rev(t, ctx) > after })
	stopChurn()
	<-churned
	stopLists()
	<-listsDone
	last := e.rev(t, ctx)
	waitUntil(t, ctx, fmt.Sprintf("every informer to reach %d", last), func() bool {
		for _, w := range fleet {
			if w.synced() < last {
				return false
			}
		}
		return true
	})

	t.Logf("%v LISTs of pods (informers' relists and the paginated lists' pages) during the wave", lists()-listsBefore)
	unknown := 0
	for _, w := range fleet {
		w.mu.Lock()
		for _, ev := range w.got {
			if ev.Type == "DELETED-UNKNOWN" {
				unknown++
			}
		}
		w.mu.Unlock()
	}
	t.Logf("relists made informers drop %d pods that were deleted meanwhile (DeletedFinalStateUnknown)", unknown)
	history, err := checker.EtcdHistory(ctx, e.etcd, "/registry/pods/", seedRev+1, last)
	if err != nil {
		t.Fatal(err)
	}
	seed, err := e.etcd.Get(ctx, "/registry/pods/", clientv3.WithPrefix(), clientv3.WithRev(seedRev))
	if err != nil {
		t.Fatal(err)
	}
	// stateAt is the node's pods (key: resourceVersion) at rev; changes
	// are the node's changes in (from, to].
	stateAt := func(node string, rev int64) map[string]int64 {
		st := map[string]int64{}
		for _, kv := range seed.Kvs {
			if k := checker.KeyName("/registry/pods/", string(kv.Key)); nodeOf[k] == node {
				st[k] = kv.ModRevision
			}
		}
		for _, c := range history {
			if k := checker.KeyName("/registry/pods/", c.Key); c.Rev <= rev && nodeOf[k] == node {
				if c.Delete {
					delete(st, k)
				} else {
					st[k] = c.Rev
				}
			}
		}
		return st
	}
	changes := func(node string, from, to int64) []string {
		var out []string
		for _, c := range history {
			if k := checker.KeyName("/registry/pods/", c.Key); c.Rev > from && c.Rev <= to && nodeOf[k] == node {
				out = append(out, fmt.Sprintf("%s@%d/%v", k, c.Rev, c.Delete))
			}
		}
		return out
	}
	bad := 0
	for i, w := range fleet {
		w.rec.mu.Lock()
		rs := slices.Clone(w.rec.rs)
		w.rec.mu.Unlock()
		for _, sv := range rs {
			w.rec.mu.Lock()
			items := slices.Clone(sv.items)
			w.rec.mu.Unlock()
			var errs []string
			if sv.list {
				got := map[string]int64{}
				for _, it := range items {
					got[it.Key] = it.RV
				}
				if want := stateAt(w.node, sv.from); fmt.Sprint(got) != fmt.Sprint(want) {
					errs = append(errs, fmt.Sprintf("LIST at %d: got %v, etcd has %v", sv.from, got, want))
				}
			} else {
				from := sv.from
				if from == 0 { // initial events, then the bookmark at their revision
					st := map[string]int64{}
					n := 0
					for n < len(items) && items[n].Type != "BOOKMARK" {
						st[items[n].Key] = items[n].RV
						n++
					}
					if n == len(items) {
						continue // ended before its state was whole
					}
					from, items = items[n].RV, items[n+1:]
					if want := stateAt(w.node, from); fmt.Sprint(st) != fmt.Sprint(want) {
						errs = append(errs, fmt.Sprintf("initial events at %d: got %v, etcd has %v", from, st, want))
					}
				}
				var got []string
				through := from
				for _, it := range items {
					switch it.Type {
					case "BOOKMARK":
					case "ADDED", "MODIFIED", "DELETED":
						got = append(got, fmt.Sprintf("%s@%d/%v", it.Key, it.RV, it.Type == "DELETED"))
					default:
						continue
					}
					through = max(through, it.RV)
				}
				if want := changes(w.node, from, through); fmt.Sprint(got) != fmt.Sprint(want) {
					errs = append(errs, fmt.Sprintf("watch after %d, through %d: got %v, etcd has %v", from, through, got, want))
				}
			}
			if len(errs) > 0 {
				if bad++; bad <= 8 {
					t.Errorf("informer %d (%s): %v", i, w.node, errs)
				}
			}
		}
	}
	for _, l := range listed {
		if want := e.etcdNames(t, ctx, "/registry/pods/", l.rev, nil); !slices.Equal(l.names, want) {
			if bad++; bad <= 8 {
				t.Errorf("paginated LIST at %d: got %v, etcd has %v", l.rev, l.names, want)
			}
		}
	}
	t.Logf("%d paginated LISTs checked", len(listed))
	if bad > 0 {
		t.Errorf("%d responses served data that differs from etcd", bad)
	}
}

// waitUntil polls cond until it holds or ctx ends.
func waitUntil(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
