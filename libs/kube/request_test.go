package kube

import (
	"net/http"
	"net/url"
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"herald.dev/libs/rv"
)

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
			info, err := g.ParseRequest(tt.path, q)
			if err != nil {
				t.Fatal(err)
			}
			w, err := ParseWatch(info, q)
			if tt.code != 0 {
				if s := StatusOf(err); err == nil || s.Code != tt.code || s.Reason != tt.reason {
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
func assertRoundTrip(t *testing.T, g *Registry, path string, w *WatchRequest) {
	t.Helper()
	q := w.Query()
	info, err := g.ParseRequest(path, q)
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
		info, err := g.ParseRequest(path, q)
		if err != nil || info.Verb != VerbWatch {
			return
		}
		w, err := ParseWatch(info, q)
		if err != nil {
			if c := StatusOf(err).Code; c != http.StatusBadRequest && c != http.StatusUnprocessableEntity {
				t.Fatalf("code %d for %q ? %q: %v", c, path, query, err)
			}
			return
		}
		assertRoundTrip(t, g, path, w)
	})
}
