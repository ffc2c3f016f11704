package kube

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func defaultRegistry(t testing.TB) *Registry {
	t.Helper()
	g, err := NewRegistry(DefaultPrefix, DefaultResources())
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestParseKey(t *testing.T) {
	g := defaultRegistry(t)
	tests := []struct {
		key, id, ns, name string
		ok                bool
	}{
		{"/registry/pods/default/web-0", "pods", "default", "web-0", true},
		{"/registry/minions/node-7", "nodes", "", "node-7", true},
		{"/registry/services/specs/default/web", "services", "default", "web", true},
		{"/registry/services/endpoints/default/web", "endpoints", "default", "web", true},
		{"/registry/apiregistration.k8s.io/apiservices/v1.example.com", "apiservices.apiregistration.k8s.io", "", "v1.example.com", true},
		// Stored as v1beta1, served as v1 (converted).
		{"/registry/apiextensions.k8s.io/customresourcedefinitions/widgets.example.com", "customresourcedefinitions.apiextensions.k8s.io", "", "widgets.example.com", true},
		// Stored as autoscaling/v2, served as v1 too: only v2 is cached.
		{"/registry/horizontalpodautoscalers/default/web", "horizontalpodautoscalers.autoscaling", "default", "web", true},
		{"/registry/nodes/node-7", "", "", "", false},
		{"/registry/services/default/web", "", "", "", false},
		{"/registry/deployments/kube-system/dns", "deployments.apps", "kube-system", "dns", true},
		{"/registry/pods/default", "pods", "", "", false},
		{"/registry/pods/default/a/b", "pods", "", "", false},
		{"/registry/minions/a/b", "nodes", "", "", false},
		{"/registry/unknown/x", "", "", "", false},
		{"/registry/podsx/a/b", "", "", "", false},
	}
	for _, tt := range tests {
		r, ns, name, ok := g.ParseKey(tt.key)
		id := ""
		if r != nil {
			id = r.ID()
		}
		if id != tt.id || ns != tt.ns || name != tt.name || ok != tt.ok {
			t.Errorf("ParseKey(%q) = %q %q %q %v, want %q %q %q %v", tt.key, id, ns, name, ok, tt.id, tt.ns, tt.name, tt.ok)
		}
	}
}

func TestShardMap(t *testing.T) {
	g := defaultRegistry(t)
	pods, _ := g.ByID("pods")
	nodes, _ := g.ByID("nodes")
	m, err := ParseShardMap("pods/0-7=static:///a:1,a:2; pods/8-15=static:///b:1,b:2; *=static:///c:1", g)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.All(pods); len(got) != 2 || got[0].Target != "static:///a:1,a:2" || len(got[0].Partitions) != 8 || got[1].Partitions[0] != 8 {
		t.Fatalf("All(pods) = %+v", got)
	}
	if got := m.All(nodes); len(got) != 1 || got[0].Target != "static:///c:1" || got[0].Partitions != nil {
		t.Fatalf("All(nodes) = %+v", got)
	}
	for _, ns := range []string{"default", "kube-system", "a", "b", "c", "team-x"} {
		want := "static:///a:1,a:2"
		if Partition(ns) >= 8 {
			want = "static:///b:1,b:2"
		}
		if got := m.For(pods, ns).Target; got != want {
			t.Errorf("For(pods, %s) = %s, want %s (partition %d)", ns, got, want, Partition(ns))
		}
	}
	for _, bad := range []string{
		"pods/0-7=x",                 // partitions 8-15 uncovered, no *
		"pods/0-8=x;pods/8-15=y;*=z", // 8 twice
		"widgets=x;*=y",              // unknown resource
		"pods/0-16=x;*=y",            // out of range
		"pods=;*=y",                  // empty target
	} {
		if _, err := ParseShardMap(bad, g); err == nil {
			t.Errorf("ParseShardMap(%q) accepted", bad)
		}
	}
}

// TestWriteStatusNoRoute: a path under no served group version gets
// kube-apiserver's plain-text 404, not a Status.
func TestWriteStatusNoRoute(t *testing.T) {
	rec := httptest.NewRecorder()
	if code := WriteStatus(rec, ErrNoRoute); code != http.StatusNotFound {
		t.Fatalf("code %d", code)
	}
	if rec.Code != http.StatusNotFound || rec.Body.String() != "404 page not found\n" || rec.Header().Get("Content-Type") != "text/plain; charset=utf-8" {
		t.Fatalf("%d %q %q", rec.Code, rec.Header().Get("Content-Type"), rec.Body.String())
	}
}
