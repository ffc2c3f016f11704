package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"herald.dev/integration/stack"
)

// gates overrides client-go's WatchListClient feature and defers every
// other feature to client-go's defaults.
type gates struct {
	def       clientfeatures.Gates
	watchList bool
}

func (g gates) Enabled(f clientfeatures.Feature) bool {
	if f == clientfeatures.WatchListClient {
		return g.watchList
	}
	return g.def.Enabled(f)
}

// TestInformer runs a client-go shared informer against frontdoor under
// continuous creates, updates and deletes: its store must end equal to
// etcd's contents and no object's resourceVersion may ever go backwards,
// with WatchList on (client-go's default) and off, and with a kubelet-like
// client that prefers protobuf.
func TestInformer(t *testing.T) {
	e := startStack(t, stack.Options{})
	def := clientfeatures.FeatureGates()
	t.Cleanup(func() { clientfeatures.ReplaceFeatureGates(def) })
	cases := []struct {
		name      string
		watchList bool
		protobuf  bool
	}{
		{"watchlist", true, false},
		{"list-then-watch", false, false},
		{"watchlist-protobuf-first", true, true},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clientfeatures.ReplaceFeatureGates(gates{def: def, watchList: tc.watchList})
			ns := fmt.Sprintf("inf-%d", i)
			listsBefore := metricLabeled(t, e.Proc("frontdoor-0"), "apiserver_request_total", `verb="list",resource="pods"`)
			runInformer(t, e, ns, tc.protobuf)
			lists := metricLabeled(t, e.Proc("frontdoor-0"), "apiserver_request_total", `verb="list",resource="pods"`) - listsBefore
			if tc.watchList && lists != 0 {
				t.Errorf("WatchList informer sent %v LIST requests", lists)
			}
			if !tc.watchList && lists == 0 {
				t.Errorf("informer with WatchList off sent no LIST")
			}
		})
	}
}

func runInformer(t *testing.T, e *env, ns string, protobuf bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg, err := clientcmd.BuildConfigFromFlags("", e.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if protobuf {
		cfg.ContentType = "application/vnd.kubernetes.protobuf"
		cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	// Churn: creates, updates and deletes over 40 pods, before, during and
	// after the informer starts.
	const ops = 600
	started := make(chan struct{})
	churned := make(chan struct{})
	go func() {
		defer close(churned)
		r := rand.New(rand.NewPCG(1, 2))
		live := map[string]bool{}
		for i := range ops {
			if i == ops/4 {
				close(started)
			}
			name := fmt.Sprintf("q%02d", r.IntN(40))
			switch {
			case live[name] && r.IntN(4) == 0:
				e.del(t, ctx, ns, name)
				delete(live, name)
			default:
				e.put(t, ctx, ns, name, podJSON(ns, name, "n", i), !live[name])
				live[name] = true
			}
		}
	}()
	<-started

	var mu sync.Mutex
	lastRV := map[string]int64{}
	var violations []string
	observe := func(kind string, obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		p := obj.(*corev1.Pod)
		rv, err := strconv.ParseInt(p.ResourceVersion, 10, 64)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			violations = append(violations, fmt.Sprintf("%s %s: resourceVersion %q", kind, p.Name, p.ResourceVersion))
			return
		}
		if rv < lastRV[p.Name] {
			violations = append(violations, fmt.Sprintf("%s %s: resourceVersion %d after %d", kind, p.Name, rv, lastRV[p.Name]))
		}
		lastRV[p.Name] = rv
	}
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns))
	inf := factory.Core().V1().Pods().Informer()
	inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { observe("add", o) },
		UpdateFunc: func(_, o any) { observe("update", o) },
		DeleteFunc: func(o any) { observe("delete", o) },
	})
	stop := make(chan struct{})
	defer close(stop)
	factory.Start(stop)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("informer did not sync")
	}
	<-churned

	want := e.etcdNames(t, ctx, "/registry/pods/"+ns+"/", 0, nil)
	var got []string
	for {
		got = got[:0]
		for _, o := range inf.GetStore().List() {
			p := o.(*corev1.Pod)
			got = append(got, p.Namespace+"/"+p.Name+"@"+p.ResourceVersion)
		}
		sort.Strings(got)
		if fmt.Sprint(got) == fmt.Sprint(want) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("informer store never matched etcd:\n got %v\nwant %v", got, want)
		case <-time.After(20 * time.Millisecond):
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, v := range violations {
		t.Error(v)
	}
}
