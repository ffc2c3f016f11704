package frontdoor

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestAuthorization: every request is authenticated, then authorized per
// verb, resource and namespace, with kube-apiserver's codes and messages.
func TestAuthorization(t *testing.T) {
	var watches atomic.Int64
	fan := newFanoutFake(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		watches.Add(1)
		w.Write([]byte(`{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"7"}}}` + "\n"))
	}))
	defer fan.Close()
	s, _ := testServer(t, fan.URL, nil)
	for _, tc := range []struct {
		token, path string
		code        int
		reason, msg string
	}{
		{"", "/api/v1/pods", 401, "Unauthorized", "Unauthorized"},
		{"nope", "/api/v1/pods", 401, "Unauthorized", "Unauthorized"},
		{"", "/livez", 200, "", ""},
		{tokBob, "/api", 200, "", ""},
		{tokBob, "/api/v1/namespaces/ns1/pods", 403, "Forbidden", `pods is forbidden: User "bob" cannot list resource "pods" in API group "" in the namespace "ns1"`},
		{tokAlice, "/api/v1/namespaces/ns1/pods", 200, "", ""},
		{tokAlice, "/api/v1/namespaces/ns1/pods/p", 200, "", ""},
		{tokAlice, "/api/v1/namespaces/ns1/pods?watch=true", 200, "", ""},
		{tokAlice, "/api/v1/namespaces/ns2/pods/p", 403, "Forbidden", `pods "p" is forbidden: User "alice" cannot get resource "pods" in API group "" in the namespace "ns2"`},
		{tokAlice, "/api/v1/pods", 403, "Forbidden", `pods is forbidden: User "alice" cannot list resource "pods" in API group "" at the cluster scope`},
		{tokAlice, "/api/v1/pods?watch=1", 403, "Forbidden", `pods is forbidden: User "alice" cannot watch resource "pods" in API group "" at the cluster scope`},
		{tokAlice, "/api/v1/namespaces/ns1/configmaps", 403, "Forbidden", `configmaps is forbidden: User "alice" cannot list resource "configmaps" in API group "" in the namespace "ns1"`},
		{tokAlice, "/metrics", 403, "Forbidden", `forbidden: User "alice" cannot get path "/metrics"`},
		{tokOps, "/metrics", 200, "", ""},
		{tokOps, "/debug/pprof/", 200, "", ""},
		{tokOps, "/apis/apps/v1/deployments", 200, "", ""},
		{tokAdmin, "/api/v1/nodes", 200, "", ""},
		{tokAdmin, "/debug/pprof/cmdline", 200, "", ""},
		{tokAdmin, "/api/v1/namespaces/ns1/pods/missing", 404, "NotFound", `pods "missing" not found`},
		{tokAdmin, "/api/v1/widgets", 404, "NotFound", ""},
	} {
		code, body, _ := do(s, tc.token, tc.path)
		if code != tc.code {
			t.Errorf("%s %s: %d, want %d: %s", tc.token, tc.path, code, tc.code, body)
			continue
		}
		if tc.reason != "" {
			c, reason, msg := statusOf(t, body)
			if int(c) != tc.code || reason != tc.reason || (tc.msg != "" && msg != tc.msg) {
				t.Errorf("%s %s: Status %d %s %q, want %d %s %q", tc.token, tc.path, c, reason, msg, tc.code, tc.reason, tc.msg)
			}
		}
	}
	if watches.Load() != 1 {
		t.Errorf("fanout saw %d watches, want 1 (only the allowed one)", watches.Load())
	}
}

// TestLimits: non-watch requests over the limit get 429 with Retry-After;
// bodies over the limit 413.
func TestLimits(t *testing.T) {
	s, _ := testServer(t, "", func(c *Config) { c.MaxInflight, c.MaxInflightPerUser, c.MaxBodyBytes = 4, 2, 10 })
	rel1, _ := s.requests.Acquire("alice")
	rel2, _ := s.requests.Acquire("alice")
	code, body, h := do(s, tokAlice, "/api/v1/namespaces/ns1/pods")
	if c, reason, _ := statusOf(t, body); code != 429 || c != 429 || reason != "TooManyRequests" || h.Get("Retry-After") != "1" {
		t.Fatalf("alice over her share: %d %s (Retry-After %q)", code, body, h.Get("Retry-After"))
	}
	if code, body, _ := do(s, tokOps, "/api/v1/pods"); code != 200 {
		t.Fatalf("another user while alice is at her limit: %d %s", code, body)
	}
	rel1()
	rel2()
	rel2() // releasing twice is harmless
	if n := s.requests.InUse(); n != 0 {
		t.Fatalf("slots in use after release: %d", n)
	}
	req := httptest.NewRequest(http.MethodGet, "/api/v1/pods", strings.NewReader(strings.Repeat("x", 11)))
	req.Header.Set("Authorization", "Bearer "+tokAdmin)
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	if c, reason, _ := statusOf(t, rec.Body.Bytes()); rec.Code != 413 || c != 413 || reason != "RequestEntityTooLarge" {
		t.Fatalf("large body: %d %s", rec.Code, rec.Body)
	}
}
