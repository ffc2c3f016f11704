package kubeapi

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// watchListGate turns client-go's WatchListClient gate on or off, leaving
// every other gate as it was. client-go reads the gate when it builds a
// reflector, so it must stay set until the informers have started.
type watchListGate struct {
	clientfeatures.Gates
	on bool
}

func (g watchListGate) Enabled(f clientfeatures.Feature) bool {
	if f == clientfeatures.WatchListClient {
		return g.on
	}
	return g.Gates.Enabled(f)
}

func setWatchList(t *testing.T, on bool) {
	prev := clientfeatures.FeatureGates()
	clientfeatures.ReplaceFeatureGates(watchListGate{Gates: prev, on: on})
	t.Cleanup(func() { clientfeatures.ReplaceFeatureGates(prev) })
}

// traffic records what an informer's client asked Herald and what it got.
type traffic struct {
	mu        sync.Mutex
	lists     map[string]int // LIST requests by path
	watches   map[string]int // watch requests by path
	watchList map[string]int // watch requests asking for initial events
	types     map[string]int // response Content-Types (media type only)
}

func newTraffic() *traffic {
	return &traffic{lists: map[string]int{}, watches: map[string]int{}, watchList: map[string]int{}, types: map[string]int{}}
}

func (tr *traffic) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(r)
		q := r.URL.Query()
		tr.mu.Lock()
		defer tr.mu.Unlock()
		switch {
		case q.Get("watch") == "true" || q.Get("watch") == "1":
			tr.watches[r.URL.Path]++
			if q.Get("sendInitialEvents") == "true" {
				tr.watchList[r.URL.Path]++
			}
		default:
			tr.lists[r.URL.Path]++
		}
		if err == nil {
			ct, _, _ := strings.Cut(resp.Header.Get("Content-Type"), ";")
			tr.types[ct]++
		}
		return resp, err
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// churnNamespace makes a fresh namespace (and its default ServiceAccount)
// through kube-apiserver.
func (f *fixture) churnNamespace(t *testing.T, kube kubernetes.Interface, name string) {
	t.Helper()
	ctx := t.Context()
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().ServiceAccounts(name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// churn creates, updates and deletes ConfigMaps, Secrets, Pods and
// Services in ns through kube-apiserver until stop is closed, then returns
// how many writes it made.
func churn(ctx context.Context, t *testing.T, kube kubernetes.Interface, ns string, stop <-chan struct{}) int {
	writes := 0
	for i := 0; ; i++ {
		select {
		case <-stop:
			return writes
		case <-ctx.Done():
			return writes
		default:
		}
		name := fmt.Sprintf("churn-%d", i%7)
		labels := map[string]string{"gen": fmt.Sprint(i)}
		var err error
		switch i % 4 {
		case 0:
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Data: map[string]string{"i": fmt.Sprint(i)}}
			if _, err = kube.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}); isNotFound(err) {
				_, err = kube.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
			}
		case 1:
			s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Data: map[string][]byte{"i": []byte(fmt.Sprint(i))}}
			if _, err = kube.CoreV1().Secrets(ns).Update(ctx, s, metav1.UpdateOptions{}); isNotFound(err) {
				_, err = kube.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{})
			}
		case 2:
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
				Spec: corev1.PodSpec{NodeName: "node-0", Containers: []corev1.Container{{Name: "c", Image: "img"}}}}
			if err = kube.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); isNotFound(err) {
				_, err = kube.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
			}
		case 3:
			if i%3 == 0 {
				err = kube.CoreV1().ConfigMaps(ns).Delete(ctx, fmt.Sprintf("churn-%d", (i+3)%7), metav1.DeleteOptions{})
				if isNotFound(err) {
					err = nil
				}
			} else {
				svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
					Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: int32(80 + i%5)}}}}
				var cur *corev1.Service
				if cur, err = kube.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
					cur.Labels, cur.Spec.Ports = labels, svc.Spec.Ports
					_, err = kube.CoreV1().Services(ns).Update(ctx, cur, metav1.UpdateOptions{})
				} else if isNotFound(err) {
					_, err = kube.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
				}
			}
		}
		if err != nil && ctx.Err() == nil {
			t.Errorf("churn write %d: %v", i, err)
			return writes
		}
		writes++
	}
}

func isNotFound(err error) bool {
	return err != nil && strings.Contains(err.Error(), "not found")
}

// TestInformers runs client-go informers against Herald while objects
// change through kube-apiserver, and checks that each informer's store
// converges to exactly what kube-apiserver lists: typed informers over
// protobuf with WatchList off and on, and metadata informers.
func TestInformers(t *testing.T) {
	f := env(t)
	t.Cleanup(func() { f.logTail(t) })
	kube, err := kubernetes.NewForConfig(f.kubeCfg)
	if err != nil {
		t.Fatal(err)
	}
	resources := []schema.GroupVersionResource{
		{Version: "v1", Resource: "configmaps"}, {Version: "v1", Resource: "secrets"},
		{Version: "v1", Resource: "pods"}, {Version: "v1", Resource: "services"},
	}
	for _, mode := range []struct {
		name      string
		metadata  bool
		watchList bool
	}{
		{"protobuf/watchlist-off", false, false},
		{"protobuf/watchlist-on", false, true},
		{"metadata/watchlist-off", true, false},
		{"metadata/watchlist-on", true, true},
	} {
		t.Run(mode.name, func(t *testing.T) {
			ns := "herald-e2e-churn-" + strings.ReplaceAll(mode.name, "/", "-")
			f.churnNamespace(t, kube, ns)
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()

			// Churn before, during and after the informers' start.
			stop := make(chan struct{})
			var writes atomic.Int64
			done := make(chan struct{})
			go func() { defer close(done); writes.Store(int64(churn(ctx, t, kube, ns, stop))) }()

			setWatchList(t, mode.watchList)
			tr := newTraffic()
			cfg := rest.CopyConfig(f.heraldCfg)
			cfg.ContentType = mediaProtobuf
			cfg.AcceptContentTypes = mediaProtobuf + "," + mediaJSON
			cfg.Wrap(tr.wrap)
			informerCtx, stopInformers := context.WithCancel(ctx)
			defer stopInformers()
			var stores []func() []runtime.Object
			var synced []cache.InformerSynced
			if mode.metadata {
				mc, err := metadata.NewForConfig(cfg)
				if err != nil {
					t.Fatal(err)
				}
				factory := metadatainformer.NewFilteredSharedInformerFactory(mc, 0, ns, nil)
				for _, r := range resources {
					inf := factory.ForResource(r).Informer()
					stores, synced = append(stores, listOf(inf.GetStore())), append(synced, inf.HasSynced)
				}
				factory.Start(informerCtx.Done())
			} else {
				cs, err := kubernetes.NewForConfig(cfg)
				if err != nil {
					t.Fatal(err)
				}
				factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns))
				for _, r := range resources {
					gi, err := factory.ForResource(r)
					if err != nil {
						t.Fatal(err)
					}
					inf := gi.Informer()
					stores, synced = append(stores, listOf(inf.GetStore())), append(synced, inf.HasSynced)
				}
				factory.Start(informerCtx.Done())
			}
			syncCtx, syncCancel := context.WithTimeout(ctx, 30*time.Second)
			defer syncCancel()
			if !cache.WaitForCacheSync(syncCtx.Done(), synced...) {
				tr.mu.Lock()
				t.Errorf("informers through Herald did not all sync in 30s (requests: lists %v, watches %v; answers by content type %v)", tr.lists, tr.watches, tr.types)
				tr.mu.Unlock()
			}
			// Churn on with the informers watching: 200 more writes.
			churnMore(ctx, t, kube, ns, 200)
			close(stop)
			<-done
			t.Logf("%d background writes, 200 more after the informers synced", writes.Load())

			for i, r := range resources {
				t.Run(r.Resource, func(t *testing.T) {
					if !synced[i]() {
						t.Fatal("the informer never synced")
					}
					want := f.kubeState(t, kube, r, ns, mode.metadata)
					cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
					defer cancel()
					if err := converge(cctx, stores[i], want); err != nil {
						t.Error(err)
					}
				})
			}
			t.Run("protocol", func(t *testing.T) {
				tr.mu.Lock()
				defer tr.mu.Unlock()
				for ct, n := range tr.types {
					if ct != mediaProtobuf {
						t.Errorf("%d answers in %q, want every one in %s", n, ct, mediaProtobuf)
					}
				}
				for _, r := range resources {
					p := "/api/v1/namespaces/" + ns + "/" + r.Resource
					switch {
					case mode.watchList && (tr.lists[p] != 0 || tr.watchList[p] == 0):
						t.Errorf("%s: %d LISTs and %d WatchList requests; with WatchList on the informer must start from a watch with initial events and never list (Herald refused WatchList?)", r.Resource, tr.lists[p], tr.watchList[p])
					case !mode.watchList && tr.lists[p] != 1:
						t.Errorf("%s: %d LISTs, want exactly one (a relist means the watch failed)", r.Resource, tr.lists[p])
					}
				}
			})
		})
	}
}

// churnMore makes n more writes (the background churn goes on meanwhile).
func churnMore(ctx context.Context, t *testing.T, kube kubernetes.Interface, ns string, n int) {
	for i := range n {
		name := fmt.Sprintf("more-%d", i%11)
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"i": fmt.Sprint(i)}}
		_, err := kube.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{})
		if isNotFound(err) {
			_, err = kube.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
		}
		if i%5 == 4 {
			err = kube.CoreV1().ConfigMaps(ns).Delete(ctx, fmt.Sprintf("more-%d", (i+4)%11), metav1.DeleteOptions{})
			if isNotFound(err) {
				err = nil
			}
		}
		if err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
}

func listOf(s cache.Store) func() []runtime.Object {
	return func() []runtime.Object {
		var out []runtime.Object
		for _, o := range s.List() {
			out = append(out, o.(runtime.Object))
		}
		return out
	}
}

// kubeState is kube-apiserver's current list of r in ns, typed (or as
// PartialObjectMetadata), read with the same client code.
func (f *fixture) kubeState(t *testing.T, kube kubernetes.Interface, r schema.GroupVersionResource, ns string, asMetadata bool) []runtime.Object {
	t.Helper()
	var list runtime.Object
	var err error
	if asMetadata {
		mc, cerr := metadata.NewForConfig(f.kubeCfg)
		if cerr != nil {
			t.Fatal(cerr)
		}
		list, err = mc.Resource(r).Namespace(ns).List(t.Context(), metav1.ListOptions{})
	} else {
		switch r.Resource {
		case "configmaps":
			list, err = kube.CoreV1().ConfigMaps(ns).List(t.Context(), metav1.ListOptions{})
		case "secrets":
			list, err = kube.CoreV1().Secrets(ns).List(t.Context(), metav1.ListOptions{})
		case "pods":
			list, err = kube.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{})
		case "services":
			list, err = kube.CoreV1().Services(ns).List(t.Context(), metav1.ListOptions{})
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		t.Fatal(err)
	}
	return items
}

// converge waits until the store holds exactly want (compared object by
// object, semantically), or reports the difference when ctx ends.
func converge(ctx context.Context, store func() []runtime.Object, want []runtime.Object) error {
	key := func(o runtime.Object) string {
		m, _ := meta.Accessor(o)
		return m.GetNamespace() + "/" + m.GetName()
	}
	index := func(objs []runtime.Object) map[string]runtime.Object {
		m := map[string]runtime.Object{}
		for _, o := range objs {
			m[key(o)] = o
		}
		return m
	}
	w := index(want)
	var last string
	for {
		got := index(store())
		last = ""
		var missing, extra, differ []string
		for k, o := range w {
			g, ok := got[k]
			switch {
			case !ok:
				missing = append(missing, k)
			case !equality.Semantic.DeepEqual(stripTypeMeta(g), stripTypeMeta(o)):
				differ = append(differ, k+" (resourceVersion "+rvOf(g)+" vs "+rvOf(o)+")")
			}
		}
		for k := range got {
			if _, ok := w[k]; !ok {
				extra = append(extra, k)
			}
		}
		if len(missing)+len(extra)+len(differ) == 0 {
			return nil
		}
		slices.Sort(missing)
		slices.Sort(extra)
		slices.Sort(differ)
		last = fmt.Sprintf("missing %v, extra %v, different %v", missing, extra, differ)
		select {
		case <-ctx.Done():
			return fmt.Errorf("the informer's store did not converge to kube-apiserver's list: %s", last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func rvOf(o runtime.Object) string {
	m, _ := meta.Accessor(o)
	return m.GetResourceVersion()
}

// stripTypeMeta: informers' typed objects carry no apiVersion/kind (the
// decoder clears them); a list's items neither. Compare without.
func stripTypeMeta(o runtime.Object) runtime.Object {
	o = o.DeepCopyObject()
	if u, ok := o.(*unstructured.Unstructured); ok {
		return u
	}
	o.GetObjectKind().SetGroupVersionKind(schema.GroupVersionKind{})
	return o
}
