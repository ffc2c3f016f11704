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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	clientmetadata "k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"herald.dev/integration/stack"
)

// TestInformer runs a client-go shared informer against frontdoor under
// continuous creates, updates and deletes: its store must end equal to
// etcd's contents and no object's resourceVersion may ever go backwards,
// with WatchList on (client-go's default) and off, with a kubelet-like
// client that prefers protobuf (and gets it), and with a metadata informer
// (k8s.io/client-go/metadata: PartialObjectMetadata in protobuf).
func TestInformer(t *testing.T) {
	e := startStack(t, stack.Options{})
	def := clientfeatures.FeatureGates()
	t.Cleanup(func() { clientfeatures.ReplaceFeatureGates(def) })
	cases := []struct {
		name      string
		watchList bool
		protobuf  bool
		metadata  bool
	}{
		{"watchlist", true, false, false},
		{"list-then-watch", false, false, false},
		{"watchlist-protobuf-first", true, true, false},
		{"list-then-watch-protobuf-first", false, true, false},
		{"metadata-watchlist", true, false, true},
		{"metadata-list-then-watch", false, false, true},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clientfeatures.ReplaceFeatureGates(stack.WatchListGates{Default: def, WatchList: tc.watchList})
			ns := fmt.Sprintf("inf-%d", i)
			listsBefore := metricLabeled(t, e.Proc("frontdoor-0"), "apiserver_request_total", `verb="list",resource="pods"`)
			runInformer(t, e, ns, tc.protobuf, tc.metadata)
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

func runInformer(t *testing.T, e *env, ns string, protobuf, metadata bool) {
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
	var rec contentTypes
	rec.wrap(cfg)

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
		p := obj.(metav1.Object)
		rv, err := strconv.ParseInt(p.GetResourceVersion(), 10, 64)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			violations = append(violations, fmt.Sprintf("%s %s: resourceVersion %q", kind, p.GetName(), p.GetResourceVersion()))
			return
		}
		if rv < lastRV[p.GetName()] {
			violations = append(violations, fmt.Sprintf("%s %s: resourceVersion %d after %d", kind, p.GetName(), rv, lastRV[p.GetName()]))
		}
		lastRV[p.GetName()] = rv
	}
	var (
		inf   cache.SharedIndexInformer
		start func(stop <-chan struct{})
	)
	if metadata {
		mc, err := clientmetadata.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		factory := metadatainformer.NewFilteredSharedInformerFactory(mc, 0, ns, nil)
		inf, start = factory.ForResource(corev1.SchemeGroupVersion.WithResource("pods")).Informer(), factory.Start
	} else {
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns))
		inf, start = factory.Core().V1().Pods().Informer(), factory.Start
	}
	inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { observe("add", o) },
		UpdateFunc: func(_, o any) { observe("update", o) },
		DeleteFunc: func(o any) { observe("delete", o) },
	})
	stop := make(chan struct{})
	defer close(stop)
	start(stop)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("informer did not sync")
	}
	<-churned

	want := e.etcdNames(t, ctx, "/registry/pods/"+ns+"/", 0, nil)
	var got []string
	for {
		got = got[:0]
		for _, o := range inf.GetStore().List() {
			p := o.(metav1.Object)
			got = append(got, p.GetNamespace()+"/"+p.GetName()+"@"+p.GetResourceVersion())
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
	// A client that prefers protobuf gets it; a metadata client gets
	// PartialObjectMetadata in protobuf too (pods are a built-in kind).
	if protobuf || metadata {
		if ok, seen := rec.only(protobufType, protobufType+";stream=watch"); !ok {
			t.Errorf("responses were %v, want protobuf", seen)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, v := range violations {
		t.Error(v)
	}
}
