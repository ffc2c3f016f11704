package kube

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

func TestParseRequest(t *testing.T) {
	g := defaultRegistry(t)
	tests := []struct {
		path, query string
		id, ns, n   string
		verb        Verb
		code        int32
	}{
		{"/api/v1/pods", "", "pods", "", "", VerbList, 0},
		{"/api/v1/pods", "watch=true", "pods", "", "", VerbWatch, 0},
		{"/api/v1/namespaces/default/pods", "watch=1", "pods", "default", "", VerbWatch, 0},
		// kube-apiserver's reading of ?watch: anything but 0 and false.
		{"/api/v1/pods", "watch=True", "pods", "", "", VerbWatch, 0},
		{"/api/v1/pods", "watch=yes", "pods", "", "", VerbWatch, 0},
		{"/api/v1/pods", "watch", "pods", "", "", VerbWatch, 0},
		{"/api/v1/pods", "watch=", "pods", "", "", VerbWatch, 0},
		{"/api/v1/pods", "watch=FALSE", "pods", "", "", VerbList, 0},
		{"/api/v1/pods", "watch=0&watch=1", "pods", "", "", VerbList, 0},
		{"/api/v1/namespaces/default/pods/web-0", "", "pods", "default", "web-0", VerbGet, 0},
		{"/api/v1/namespaces/default", "", "namespaces", "", "default", VerbGet, 0},
		{"/api/v1/namespaces", "", "namespaces", "", "", VerbList, 0},
		{"/api/v1/nodes/n1", "", "nodes", "", "n1", VerbGet, 0},
		{"/apis/apps/v1/namespaces/a/deployments", "", "deployments.apps", "a", "", VerbList, 0},
		{"/api/v1/watch/namespaces/a/pods", "", "pods", "a", "", VerbWatch, 0},
		{"/api/v1/widgets", "", "", "", "", "", http.StatusNotFound},
		{"/api/v1/namespaces/default/pods/web-0", "watch=true", "pods", "default", "web-0", VerbGet, 0}, // watch=true on a name is a GET
		{"/api/v1/watch/namespaces/default/pods/web-0", "", "pods", "default", "web-0", VerbWatch, 0},
		{"/apis/apps/v1/nothings", "", "", "", "", "", http.StatusNotFound},
		{"/api/v2/pods", "", "", "", "", "", http.StatusNotFound}, // a built-in group's unknown version: a Status
		{"/apis/apps/v7/deployments", "", "", "", "", "", http.StatusNotFound},
		{"/api/v1/namespaces/a/nodes", "", "", "", "", "", http.StatusNotFound},
		{"/api/v1/namespaces/a/pods/b/log", "", "", "", "", "", http.StatusNotFound}, // not served from the cache: 404 as for an unknown path (issue 14),
		{"/api/v1/namespaces/Bad_NS/pods", "", "", "", "", "", http.StatusBadRequest},
		{"/", "", "", "", "", "", http.StatusNotFound},
	}
	// Groups without a built-in handler: kube-apiserver's plain-text 404.
	for _, p := range []string{"/apis/nothing.example/v1/nothings", "/apis/widgets.example.com/v2/widgets"} {
		if _, err := g.ParseRequest(p, nil); !errors.Is(err, ErrNoRoute) {
			t.Errorf("%s: error %v, want ErrNoRoute", p, err)
		}
	}
	for _, tt := range tests {
		q, _ := url.ParseQuery(tt.query)
		info, err := g.ParseRequest(tt.path, q)
		if tt.code != 0 {
			if apierrors.ReasonForError(err) == "" || StatusOf(err).Code != tt.code {
				t.Errorf("%s: error %v, want code %d", tt.path, err, tt.code)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tt.path, err)
			continue
		}
		if info.Resource.ID() != tt.id || info.Namespace != tt.ns || info.Name != tt.n || info.Verb != tt.verb {
			t.Errorf("%s?%s = %s %q %q %s", tt.path, tt.query, info.Resource.ID(), info.Namespace, info.Name, info.Verb)
		}
	}
}

func TestSelectorAndDecide(t *testing.T) {
	g := defaultRegistry(t)
	pods, _ := g.ByID("pods")
	s, err := ParseSelector(pods, "", "app=web", "spec.nodeName=n1")
	if err != nil {
		t.Fatal(err)
	}
	if !s.Matches("a", map[string]string{"app": "web"}, map[string]string{"spec.nodeName": "n1"}) {
		t.Fatal("should match")
	}
	if s.Matches("a", map[string]string{"app": "db"}, map[string]string{"spec.nodeName": "n1"}) {
		t.Fatal("should not match")
	}
	if _, err := ParseSelector(pods, "", "", "spec.foo=x"); StatusOf(err).Code != 400 {
		t.Fatalf("unsupported field: %v", err)
	}
	if _, err := ParseSelector(pods, "", "a in (", ""); StatusOf(err).Code != 400 {
		t.Fatalf("bad label selector: %v", err)
	}
	cases := []struct {
		kind      string
		cur, prev bool
		want      Transition
	}{
		{"ADDED", true, false, AsAdded}, {"ADDED", false, false, Skip},
		{"MODIFIED", true, true, AsModified}, {"MODIFIED", true, false, AsAdded},
		{"MODIFIED", false, true, AsDeletedPrev}, {"MODIFIED", false, false, Skip},
		{"DELETED", true, false, AsDeleted}, {"DELETED", false, false, Skip},
	}
	for _, c := range cases {
		if got := Decide(c.kind, c.cur, c.prev); got != c.want {
			t.Errorf("Decide(%s,%v,%v) = %v, want %v", c.kind, c.cur, c.prev, got, c.want)
		}
	}
}

func FuzzParseRequest(f *testing.F) {
	g := defaultRegistry(f)
	f.Add("/api/v1/namespaces/default/pods/x", "watch=true&labelSelector=a%3Db")
	f.Add("/apis/apps/v1/deployments", "fieldSelector=metadata.name%3Dx")
	f.Fuzz(func(t *testing.T, path, query string) {
		q, _ := url.ParseQuery(query)
		info, err := g.ParseRequest(path, q)
		if err != nil {
			if c := StatusOf(err).Code; c < 400 || c >= 500 {
				t.Fatalf("code %d for %q", c, path)
			}
			return
		}
		if _, err := ParseSelector(info.Resource, info.Namespace, q.Get("labelSelector"), q.Get("fieldSelector")); err != nil {
			if c := StatusOf(err).Code; c != 400 {
				t.Fatalf("selector code %d", c)
			}
		}
	})
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
