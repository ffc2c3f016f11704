package request

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"reflect"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"herald.dev/libs/kube"
	"herald.dev/libs/rv"
)

func defaultRegistry(t testing.TB) *kube.Registry {
	t.Helper()
	g, err := kube.NewRegistry(kube.DefaultPrefix, kube.DefaultResources())
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestParseWatch(t *testing.T) {
	g := defaultRegistry(t)
	tests := []struct {
		name, path, query string
		code              int32               // 0: valid
		reason            metav1.StatusReason // with code
		want              func(*WatchRequest) bool
	}{
		{name: "from state", path: "/api/v1/pods", query: "watch=true",
			want: func(w *WatchRequest) bool {
				return w.Plan == rv.WatchPlan{Mode: rv.WatchFromState, Consistent: true} && w.Selector.Empty
			}},
		{name: "after a revision", path: "/api/v1/pods", query: "watch=1&resourceVersion=42&allowWatchBookmarks=true&timeoutSeconds=30",
			want: func(w *WatchRequest) bool {
				return w.Plan == rv.WatchPlan{Mode: rv.WatchAfter, Rev: 42} && w.AllowWatchBookmarks && w.TimeoutSeconds == 30
			}},
		{name: "watch list", path: "/api/v1/namespaces/a/pods", query: "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=1",
			want: func(w *WatchRequest) bool {
				return w.Plan.Mode == rv.WatchFromState && w.Plan.InitialEventsEnd && w.SendInitialEvents != nil && *w.SendInitialEvents && w.Selector.Namespace == "a"
			}},
		{name: "from now", path: "/api/v1/pods", query: "watch=1&resourceVersion=0&sendInitialEvents=false&resourceVersionMatch=NotOlderThan",
			want: func(w *WatchRequest) bool { return w.Plan == rv.WatchPlan{Mode: rv.WatchFromNow} }},
		{name: "name folded into the field selector", path: "/api/v1/watch/namespaces/a/pods/web-0", query: "fieldSelector=spec.nodeName%3Dn1",
			want: func(w *WatchRequest) bool {
				return w.FieldSelector == "spec.nodeName=n1" && w.Selector.Fields.String() == "metadata.name=web-0,spec.nodeName=n1"
			}},
		{name: "zero timeout", path: "/api/v1/pods", query: "watch=1&timeoutSeconds=0", want: func(w *WatchRequest) bool { return w.TimeoutSeconds == 0 }},
		{name: "bad label selector", path: "/api/v1/pods", query: "watch=1&labelSelector=a%20in", code: http.StatusBadRequest, reason: metav1.StatusReasonBadRequest},
		{name: "unselectable field", path: "/api/v1/pods", query: "watch=1&fieldSelector=spec.x%3Dy", code: http.StatusBadRequest, reason: metav1.StatusReasonBadRequest},
		{name: "bad field selector with a name", path: "/api/v1/watch/namespaces/a/pods/x", query: "fieldSelector=a", code: http.StatusBadRequest, reason: metav1.StatusReasonBadRequest},
		{name: "bad sendInitialEvents", path: "/api/v1/pods", query: "watch=1&sendInitialEvents=maybe", code: http.StatusBadRequest, reason: metav1.StatusReasonBadRequest},
		{name: "bad allowWatchBookmarks", path: "/api/v1/pods", query: "watch=1&allowWatchBookmarks=2", code: http.StatusBadRequest, reason: metav1.StatusReasonBadRequest},
		// kube-apiserver answers 500 without a reason: its watch cache returns
		// the storage's InvalidError as it is.
		{name: "malformed resourceVersion", path: "/api/v1/pods", query: "watch=1&resourceVersion=abc", code: http.StatusInternalServerError, reason: metav1.StatusReasonUnknown},
		{name: "match without sendInitialEvents", path: "/api/v1/pods", query: "watch=1&resourceVersionMatch=NotOlderThan", code: http.StatusUnprocessableEntity, reason: metav1.StatusReasonInvalid},
		{name: "initial events without bookmarks", path: "/api/v1/pods", query: "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan", code: http.StatusUnprocessableEntity, reason: metav1.StatusReasonInvalid},
		{name: "negative timeout", path: "/api/v1/pods", query: "watch=1&timeoutSeconds=-1", code: http.StatusBadRequest, reason: metav1.StatusReasonBadRequest},
		{name: "timeout not a number", path: "/api/v1/pods", query: "watch=1&timeoutSeconds=x", code: http.StatusBadRequest, reason: metav1.StatusReasonBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, _ := url.ParseQuery(tt.query)
			info, err := Parse(g, tt.path, q)
			if err != nil {
				t.Fatal(err)
			}
			w, err := ParseWatch(info, q)
			if tt.code != 0 {
				if s := kube.StatusOf(err); err == nil || s.Code != tt.code || s.Reason != tt.reason {
					t.Fatalf("err %v (%+v), want %d %s", err, s, tt.code, tt.reason)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tt.want(w) {
				t.Fatalf("%+v (plan %+v)", w, w.Plan)
			}
			assertRoundTrip(t, g, tt.path, w)
		})
	}
}

// assertRoundTrip checks that w's canonical query parses back to w.
func assertRoundTrip(t *testing.T, g *kube.Registry, path string, w *WatchRequest) {
	t.Helper()
	q := w.Query()
	info, err := Parse(g, path, q)
	if err != nil || info.Verb != VerbWatch {
		t.Fatalf("canonical query %q: %v %s", q.Encode(), err, info.Verb)
	}
	back, err := ParseWatch(info, q)
	if err != nil {
		t.Fatalf("canonical query %q: %v", q.Encode(), err)
	}
	if back.Selector.String() != w.Selector.String() {
		t.Fatalf("selector %s, want %s", back.Selector, w.Selector)
	}
	w2 := *w
	back.Selector, w2.Selector = nil, nil
	if !reflect.DeepEqual(*back, w2) {
		t.Fatalf("canonical query %q parses to %+v, want %+v", q.Encode(), *back, w2)
	}
}

// FuzzParseWatch: whatever the query, no panic; an error is a 4xx Status;
// a valid request survives its canonical encoding.
func FuzzParseWatch(f *testing.F) {
	g := defaultRegistry(f)
	f.Add("/api/v1/pods", "watch=1&resourceVersion=5&allowWatchBookmarks=true&timeoutSeconds=9")
	f.Add("/api/v1/watch/namespaces/a/pods/x", "sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=1&labelSelector=a%3Db")
	f.Add("/apis/apps/v1/watch/deployments", "fieldSelector=metadata.name%3Dx&resourceVersion=0")
	f.Fuzz(func(t *testing.T, path, query string) {
		q, _ := url.ParseQuery(query)
		info, err := Parse(g, path, q)
		if err != nil || info.Verb != VerbWatch {
			return
		}
		w, err := ParseWatch(info, q)
		if err != nil {
			if c := kube.StatusOf(err).Code; c != http.StatusBadRequest && c != http.StatusUnprocessableEntity {
				t.Fatalf("code %d for %q ? %q: %v", c, path, query, err)
			}
			return
		}
		assertRoundTrip(t, g, path, w)
	})
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
		if _, err := Parse(g, p, nil); !errors.Is(err, kube.ErrNoRoute) {
			t.Errorf("%s: error %v, want kube.ErrNoRoute", p, err)
		}
	}
	for _, tt := range tests {
		q, _ := url.ParseQuery(tt.query)
		info, err := Parse(g, tt.path, q)
		if tt.code != 0 {
			if apierrors.ReasonForError(err) == "" || kube.StatusOf(err).Code != tt.code {
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

func FuzzParseRequest(f *testing.F) {
	g := defaultRegistry(f)
	f.Add("/api/v1/namespaces/default/pods/x", "watch=true&labelSelector=a%3Db")
	f.Add("/apis/apps/v1/deployments", "fieldSelector=metadata.name%3Dx")
	f.Fuzz(func(t *testing.T, path, query string) {
		q, _ := url.ParseQuery(query)
		info, err := Parse(g, path, q)
		if err != nil {
			if c := kube.StatusOf(err).Code; c < 400 || c >= 500 {
				t.Fatalf("code %d for %q", c, path)
			}
			return
		}
		if _, err := ParseSelector(info.Resource, info.Namespace, q.Get("labelSelector"), q.Get("fieldSelector")); err != nil {
			if c := kube.StatusOf(err).Code; c != 400 {
				t.Fatalf("selector code %d", c)
			}
		}
	})
}

// TestParseCustomResource: a custom resource's paths resolve once its CRD is
// set; a subresource its CRD does not define is a missing object, as
// kube-apiserver's CRD handler answers it.
func TestParseCustomResource(t *testing.T) {
	g := defaultRegistry(t)
	_, widgets, err := kube.CustomResources(testCRD())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.SetCRD("widgets.example.com", widgets); err != nil {
		t.Fatal(err)
	}
	r, _ := g.ByID("widgets.example.com")
	if info, err := Parse(g, "/apis/example.com/v1/namespaces/shop/widgets", url.Values{"watch": {"true"}}); err != nil || info.Resource != r || info.Verb != VerbWatch {
		t.Errorf("Parse = %+v, %v", info, err)
	}
	if _, err := Parse(g, "/apis/example.com/v1/namespaces/shop/widgets/w1/status", nil); err == nil || err.Error() != `widgets.example.com "w1" not found` {
		t.Errorf("Parse of a subresource: %v", err)
	}
}

// testCRD is a served, Established CRD of widgets.example.com as
// kube-apiserver serves it (apiextensions.k8s.io/v1).
func testCRD() []byte {
	crd := &apiextensionsv1.CustomResourceDefinition{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"},
		ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.com", ResourceVersion: "7"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "example.com", Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: new(true)}}}},
			Conversion: &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.NoneConverter},
		},
		Status: apiextensionsv1.CustomResourceDefinitionStatus{
			AcceptedNames: apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList"},
			Conditions: []apiextensionsv1.CustomResourceDefinitionCondition{
				{Type: apiextensionsv1.NamesAccepted, Status: apiextensionsv1.ConditionTrue},
				{Type: apiextensionsv1.Established, Status: apiextensionsv1.ConditionTrue},
			},
			StoredVersions: []string{"v1"},
		},
	}
	b, err := json.Marshal(crd)
	if err != nil {
		panic(err)
	}
	return b
}
