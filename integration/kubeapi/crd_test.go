package kubeapi

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"herald.dev/libs/storage"
)

// TestCRDCreatedMidRun creates a CRD through kube-apiserver while Herald
// runs: Herald must start serving it (list, field selector on its
// selectable field, watch, discovery) without a restart, and stop when it
// is deleted.
func TestCRDCreatedMidRun(t *testing.T) {
	f := env(t)
	t.Cleanup(func() { f.logTail(t) })
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	late := &resourceCase{
		gvr: schema.GroupVersionResource{Group: crdGroup, Version: "v1", Resource: "latecomers"}, kind: "Latecomer", namespaced: true,
		make: func(_ string, i int) obj {
			return obj{"spec": obj{"color": []string{"red", "blue", "red", "green", "blue"}[i], "size": i}}
		},
	}
	crds := &resourceCase{gvr: crdGVR, kind: "CustomResourceDefinition", make: func(string, int) obj { return crd("latecomers") }}
	crds.objName = func(int) string { return "latecomers." + crdGroup }
	if err := f.create(ctx, crds, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.waitEstablished(ctx, crds.name0(0)); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 1} {
		if err := f.create(ctx, late, i); err != nil {
			t.Fatal(err)
		}
	}
	p := late.path(nsA)

	// Herald learns the CRD from the stream: wait (bounded) until it
	// serves the list as kube-apiserver does.
	listed := t.Run("listable", func(t *testing.T) {
		if v := f.eventually(ctx, 30*time.Second, f.fetchJSON(p, nil, mediaJSON), agreeOpts{listRV: true}); v != "" {
			t.Fatalf("Herald did not serve the new CRD's list as kube-apiserver does within 30s: %s", v)
		}
	})
	t.Run("discovery", func(t *testing.T) {
		// kube-apiserver lists a group version's custom resources in
		// its CRD informer's order (not sorted, not stable across
		// restarts): the new resource's entry is compared, as
		// TestDiscovery compares every entry.
		p := "/apis/" + crdGroup + "/v1"
		var k, h metav1.APIResourceList
		if code := f.getJSON(t, f.kubeURL, p, &k); code != http.StatusOK {
			t.Fatalf("kube-apiserver: %s: %d", p, code)
		}
		if code := f.getJSON(t, f.heraldURL, p, &h); code != http.StatusOK {
			t.Fatalf("Herald: %s: %d", p, code)
		}
		find := func(l metav1.APIResourceList) *metav1.APIResource {
			for i := range l.APIResources {
				if l.APIResources[i].Name == late.gvr.Resource {
					return &l.APIResources[i]
				}
			}
			return nil
		}
		kr, hr := find(k), find(h)
		switch {
		case kr == nil:
			t.Fatalf("kube-apiserver does not list %s", late.gvr.Resource)
		case hr == nil:
			t.Fatalf("Herald does not list %s", late.gvr.Resource)
		case kr.SingularName != hr.SingularName || kr.Namespaced != hr.Namespaced || kr.Kind != hr.Kind ||
			!slices.Equal(kr.ShortNames, hr.ShortNames) || !slices.Equal(kr.Categories, hr.Categories):
			t.Errorf("kube-apiserver %+v\nHerald         %+v", *kr, *hr)
		}
	})
	var checks []check
	checks = append(checks,
		check{"list/all", f.fetchJSON(late.path(""), nil, mediaJSON), agreeOpts{listRV: true}},
		check{"list/field/spec.color=red", f.fetchJSON(p, query("fieldSelector", "spec.color=red"), mediaJSON), agreeOpts{listRV: true}},
		check{"list/label/tier=a", f.fetchJSON(p, query("labelSelector", "tier=a"), mediaJSON), agreeOpts{listRV: true}},
		check{"list/table", f.fetchJSON(p, nil, acceptTable), agreeOpts{listRV: true}},
		check{"list/metadata", f.fetchJSON(p, nil, mediaJSON+asMetaList), agreeOpts{listRV: true}},
		check{"get", f.fetchJSON(p+"/"+late.name0(0), nil, mediaJSON), agreeOpts{}},
	)
	f.runChecks(t, checks)

	t.Run("watchable", func(t *testing.T) {
		if !listed {
			t.Fatal("not listable")
		}
		from, err := f.currentRV(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// A watch through Herald opened before the writes must see them.
		type result struct {
			v   view
			err error
		}
		live := make(chan result, 1)
		var marker string
		markerSet := make(chan struct{})
		go func() {
			<-markerSet
			v, err := f.fetchWatchJSON(p, query("resourceVersion", from), mediaJSON, marker)(ctx, f.heraldURL)
			live <- result{v, err}
		}()
		if err := f.create(ctx, late, 3); err != nil {
			t.Fatal(err)
		}
		if _, err := f.patch(ctx, late, 1, obj{"spec": obj{"color": "green"}}); err != nil {
			t.Fatal(err)
		}
		if err := f.client(late, nsA).Delete(ctx, late.name0(3), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if marker, err = f.patch(ctx, late, 0, obj{"metadata": obj{"annotations": obj{"e2e.herald.test/marker": "end"}}}); err != nil {
			t.Fatal(err)
		}
		close(markerSet)
		k, err := f.fetchWatchJSON(p, query("resourceVersion", from), mediaJSON, marker)(ctx, f.kubeURL)
		if err != nil {
			t.Fatal(err)
		}
		h := <-live
		if h.err != nil {
			t.Fatal(h.err)
		}
		if !k.equal(h.v) {
			t.Errorf("watch of the new CRD's resource: %s", diff(k, h.v))
		}
	})

	t.Run("deleted", func(t *testing.T) {
		if err := f.dyn.Resource(crdGVR).Delete(ctx, crds.name0(0), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		// kube-apiserver stops serving once the CRD's objects are gone and
		// the CRD with them.
		if err := waitFor(ctx, 60*time.Second, func() bool {
			_, err := f.dyn.Resource(crdGVR).Get(ctx, crds.name0(0), metav1.GetOptions{})
			return isNotFound(err)
		}); err != nil {
			t.Fatalf("kube-apiserver did not delete the CRD: %v", err)
		}
		if v := f.eventually(ctx, 30*time.Second, f.fetchJSON(p, nil, mediaJSON), agreeOpts{}); v != "" {
			t.Errorf("after the CRD's deletion Herald does not answer as kube-apiserver within 30s: %s", v)
		}
	})
}

// eventually judges the fetch until Herald agrees with kube-apiserver, for
// at most d; it returns "" or the last difference.
func (f *fixture) eventually(ctx context.Context, d time.Duration, fetch fetcher, o agreeOpts) string {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for {
		v := f.judge(ctx, fetch, o)
		if v == "" {
			return ""
		}
		select {
		case <-ctx.Done():
			return v
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitFor polls cond every 100ms for at most d.
func waitFor(ctx context.Context, d time.Duration, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// TestDiscovery compares Herald's discovery with kube-apiserver's for every
// group version the test uses: each resource kube-apiserver lists with the
// list and watch verbs must be in Herald's with the same name, scope,
// kind, short names and categories, and its read verbs (get, list, watch:
// standalone Herald is read-only) in a subtest of their own.
func TestDiscovery(t *testing.T) {
	f := env(t)
	gvs := map[string]bool{}
	for _, c := range f.cases {
		gvs[schema.GroupVersion{Group: c.gvr.Group, Version: c.gvr.Version}.String()] = true
	}
	for gv := range gvs {
		p := "/apis/" + gv
		if gv == "v1" {
			p = "/api/v1"
		}
		t.Run(gv, func(t *testing.T) {
			var k, h metav1.APIResourceList
			if code := f.getJSON(t, f.kubeURL, p, &k); code != http.StatusOK {
				t.Fatalf("kube-apiserver: %s: %d", p, code)
			}
			if code := f.getJSON(t, f.heraldURL, p, &h); code != http.StatusOK {
				t.Fatalf("Herald: %s: %d", p, code)
			}
			hs := map[string]metav1.APIResource{}
			for _, r := range h.APIResources {
				hs[r.Name] = r
			}
			for _, kr := range k.APIResources {
				if !hasVerbs(kr.Verbs, "list", "watch") {
					continue
				}
				t.Run(kr.Name, func(t *testing.T) {
					hr, ok := hs[kr.Name]
					if !ok {
						t.Fatalf("not in Herald's discovery")
					}
					if kr.SingularName != hr.SingularName || kr.Namespaced != hr.Namespaced || kr.Kind != hr.Kind ||
						!slices.Equal(kr.ShortNames, hr.ShortNames) || !slices.Equal(kr.Categories, hr.Categories) {
						t.Errorf("kube-apiserver %+v\nHerald         %+v", kr, hr)
					}
					t.Run("verbs", func(t *testing.T) {
						// Herald alone is read-only: it advertises the
						// reads kube-apiserver offers, no more, no less
						// (a client shown "create" would be refused 405).
						// In cluster mode discovery is kube-apiserver's
						// own, forwarded (TestClusterMode).
						if want := readVerbs(kr.Verbs); !slices.Equal(want, hr.Verbs) {
							t.Errorf("verbs: kube-apiserver %v (reads %v), Herald %v", kr.Verbs, want, hr.Verbs)
						}
					})
				})
			}
		})
	}
}

// readVerbs are the verbs of vs Herald serves without kube-apiserver, in
// discovery's order.
func readVerbs(vs metav1.Verbs) metav1.Verbs {
	out := metav1.Verbs{}
	for _, v := range vs {
		if v == "get" || v == "list" || v == "watch" {
			out = append(out, v)
		}
	}
	return out
}

func hasVerbs(have metav1.Verbs, want ...string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

func (f *fixture) getJSON(t *testing.T, base, path string, out any) int {
	t.Helper()
	resp, err := f.request(t.Context(), base, path, nil, mediaJSON)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		if err := decodeBody(resp, out); err != nil {
			t.Fatalf("%s%s: %v", base, path, err)
		}
	}
	return resp.StatusCode
}

func decodeBody(resp *http.Response, out any) error { return json.NewDecoder(resp.Body).Decode(out) }

// TestBuiltinTable checks libs/storage's built-in resource table against
// the running kube-apiserver's discovery: every resource kube-apiserver
// serves with list and watch is in the table with the same scope, kind,
// short names and categories, and every table entry is served.
func TestBuiltinTable(t *testing.T) {
	f := env(t)
	table := map[schema.GroupVersionResource]*storage.Resource{}
	for _, r := range storage.Builtins() {
		table[r.GroupVersionResource()] = r
	}
	var groups metav1.APIGroupList
	if code := f.getJSON(t, f.kubeURL, "/apis", &groups); code != http.StatusOK {
		t.Fatalf("/apis: %d", code)
	}
	paths := []string{"/api/v1"}
	for _, g := range groups.Groups {
		for _, v := range g.Versions {
			paths = append(paths, "/apis/"+v.GroupVersion)
		}
	}
	served := map[schema.GroupVersionResource]bool{}
	for _, p := range paths {
		var l metav1.APIResourceList
		if code := f.getJSON(t, f.kubeURL, p, &l); code != http.StatusOK {
			t.Fatalf("%s: %d", p, code)
		}
		gv, _ := schema.ParseGroupVersion(l.GroupVersion)
		if gv.Group == crdGroup {
			continue
		}
		for _, kr := range l.APIResources {
			if strings.Contains(kr.Name, "/") || !hasVerbs(kr.Verbs, "list", "watch") {
				continue
			}
			gvr := gv.WithResource(kr.Name)
			served[gvr] = true
			t.Run(gvrName(gvr), func(t *testing.T) {
				r := table[gvr]
				if r == nil {
					t.Fatalf("served by kube-apiserver, not in libs/storage's table")
				}
				if r.Namespaced != kr.Namespaced || r.Kind != kr.Kind || !slices.Equal(r.ShortNames, kr.ShortNames) || !slices.Equal(r.Categories, kr.Categories) {
					t.Errorf("table: namespaced %v kind %s short %v categories %v\nkube-apiserver: namespaced %v kind %s short %v categories %v",
						r.Namespaced, r.Kind, r.ShortNames, r.Categories, kr.Namespaced, kr.Kind, kr.ShortNames, kr.Categories)
				}
			})
		}
	}
	for gvr := range table {
		if !served[gvr] {
			t.Run(gvrName(gvr), func(t *testing.T) { t.Errorf("in libs/storage's table, not served by kube-apiserver") })
		}
	}
}

func gvrName(r schema.GroupVersionResource) string {
	if r.Group == "" {
		return r.Version + "/" + r.Resource
	}
	return r.Group + "/" + r.Version + "/" + r.Resource
}
