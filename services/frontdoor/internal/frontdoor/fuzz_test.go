package frontdoor

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"

	"herald.dev/libs/rv"
)

// The fuzz targets feed client input to the whole handler (with a fake
// cache and fanout) as a user who may read every resource but no
// non-resource path (so never a 30 s CPU profile): whatever the input, no panic, and the answer is a 2xx
// or a 4xx Status, never a 5xx. `go test` runs the seeds; `go test -fuzz
// FuzzX` explores.

var (
	fuzzOnce   sync.Once
	fuzzServer *Server
)

func fuzzHandler(t testing.TB) *Server {
	fuzzOnce.Do(func() {
		fan := newFanoutFake(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("{}\n")) }))
		fuzzServer, _ = testServer(t, fan.URL, nil)
	})
	return fuzzServer
}

func serveFuzz(t *testing.T, path, rawQuery string) {
	s := fuzzHandler(t)
	req := &http.Request{Method: http.MethodGet, URL: &url.URL{Path: path, RawQuery: rawQuery}, Header: http.Header{}, Host: "x"}
	req = req.WithContext(t.Context())
	req.Header.Set("Authorization", "Bearer "+tokReader)
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	if rec.Code >= 500 {
		t.Fatalf("%q ? %q: %d %s", path, rawQuery, rec.Code, rec.Body)
	}
	if rec.Code == http.StatusNotFound && rec.Body.String() == "404 page not found\n" {
		return // a group version nobody serves: kube-apiserver's plain-text 404
	}
	if rec.Code >= 400 {
		var st struct {
			Kind string `json:"kind"`
			Code int    `json:"code"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil || st.Kind != "Status" || st.Code != rec.Code {
			t.Fatalf("%q ? %q: %d with a body that is not its Status: %s", path, rawQuery, rec.Code, rec.Body)
		}
	}
}

func FuzzRequestPath(f *testing.F) {
	for _, p := range []string{"/api/v1/pods", "/api/v1/namespaces/ns1/pods/p", "/apis/apps/v1/namespaces/a/deployments",
		"/api/v1/watch/pods", "/api/v1/namespaces//pods", "/api/v1/namespaces/../pods", "/api/v1/pods/%2e%2e", "/apis",
		"/api/v1/namespaces/ns1/pods/p/log", "/api/v1/nodes/n/x/y", "//api///v1", "/api/v1/namespaces/NS/pods",
		"/api/v1/namespaces/ns1/nodes/n", "/debug/pprof/../../etc", "/apis/a/b/c/d/e/f/g", "/api/v1/pods/\x00"} {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, path string) { serveFuzz(t, path, "") })
}

func FuzzQuery(f *testing.F) {
	for _, q := range []string{"watch=true", "watch=1&resourceVersion=0", "limit=-1", "limit=99999999999999999999",
		"resourceVersion=abc", "resourceVersion=5&resourceVersionMatch=Exact", "resourceVersionMatch=Exact",
		"watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
		"watch=true&sendInitialEvents=maybe", "watch=true&timeoutSeconds=-5", "sendInitialEvents=true",
		"%zz", "a=%", "continue=x&resourceVersion=3", "watch=true&allowWatchBookmarks=yes", "labelSelector=a%3Db&watch=true"} {
		f.Add("/api/v1/namespaces/ns1/pods", q)
		f.Add("/api/v1/pods/p", q)
	}
	f.Fuzz(func(t *testing.T, path, query string) {
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		serveFuzz(t, path, query)
	})
}

func FuzzSelectors(f *testing.F) {
	for _, s := range [][2]string{{"a=b", "metadata.name=x"}, {"a in (b,c),!d", "spec.nodeName!=n"}, {"a=", "status.phase=Running"},
		{"(", ")"}, {"a=b,", "=="}, {"x notin ()", "metadata.namespace=a,metadata.name=b"}, {"a,b,!c", "unknown.field=1"},
		{strings.Repeat("a", 300) + "=b", "metadata.name=" + strings.Repeat("x", 300)}, {"a==b", `metadata.name=a\,b`}, {"a!=b", `\`}} {
		f.Add(s[0], s[1], false)
		f.Add(s[0], s[1], true)
	}
	f.Fuzz(func(t *testing.T, label, field string, watch bool) {
		q := url.Values{"labelSelector": {label}, "fieldSelector": {field}}
		if watch {
			q.Set("watch", "true")
		}
		serveFuzz(t, "/api/v1/namespaces/ns1/pods", q.Encode())
		serveFuzz(t, "/api/v1/nodes/n1", q.Encode())
	})
}

func FuzzContinue(f *testing.F) {
	f.Add(rv.After("/registry/pods/ns1/p", 5).Encode("/registry/pods/ns1/"), "", int64(10))
	f.Add(rv.After("/registry/pods/ns1/p", 5).Encode("/registry/pods/ns1/")+"==", "0", int64(0))
	f.Add("eyJ2IjoiaGVyYWxkL3YxIiwicnYiOi0xLCJhZnRlciI6Ii8ifQ", "", int64(1))
	f.Add("not base64!", "", int64(1))
	f.Add(strings.Repeat("A", 5000), "", int64(1))
	f.Add("e30", "7", int64(-3))
	f.Add("eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6LTEsInN0YXJ0IjoibnMxL3BcdTAwMDAifQ", "", int64(1))
	f.Fuzz(func(t *testing.T, cont, resourceVersion string, limit int64) {
		q := url.Values{"continue": {cont}, "resourceVersion": {resourceVersion}, "limit": {strconv.FormatInt(limit, 10)}}
		serveFuzz(t, "/api/v1/pods", q.Encode())
	})
}
