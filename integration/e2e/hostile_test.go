package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"herald.dev/integration/stack"
)

// TestHostileRequests sends malformed paths, options, selectors and
// continue tokens (the fuzz targets' seeds) through the real stack, as the
// admin so that every check runs: the answer is a 200 or a 4xx Status,
// never a 5xx or a dropped connection. (A resourceVersion ahead of the
// cache is a legitimate 504 ResourceVersionTooLarge after 3 s, as in
// kube-apiserver; the conformance tests cover it.) Oversized headers get 431, bodies 413.
func TestHostileRequests(t *testing.T) {
	e := startStack(t, stack.Options{})
	ctx := testContext(t, 50*time.Second)
	e.put(t, ctx, "ns1", "p", podJSON("ns1", "p", "node-1", 0), true)
	paths := []string{"/api/v1/pods", "/api/v1/namespaces/ns1/pods", "/api/v1/namespaces/ns1/pods/p", "/api/v1/nodes/n1"}
	queries := []string{"", "limit=-1", "limit=99999999999999999999", "limit=2&continue=%%%", "resourceVersion=abc",
		"resourceVersion=1&resourceVersionMatch=Exact", "resourceVersionMatch=Exact", "resourceVersion=0&resourceVersionMatch=Exact",
		"resourceVersion=-3", "sendInitialEvents=true",
		"continue=" + base64.RawURLEncoding.EncodeToString([]byte(`{"v":"herald/v1","rv":-1,"after":"/"}`)),
		"continue=" + base64.RawURLEncoding.EncodeToString([]byte(`{"v":"herald/v1","rv":1,"after":"/registry/pods/../x"}`)),
		"continue=" + base64.RawURLEncoding.EncodeToString([]byte(`{"v":"meta.k8s.io/v1","rv":-1,"start":"ns1/p\u0000"}`)),
		"continue=" + base64.RawURLEncoding.EncodeToString([]byte(`{"v":"meta.k8s.io/v1","rv":1,"start":"../secrets/x"}`)),
		"continue=" + strings.Repeat("A", 5000), "continue=x&resourceVersion=3",
		"labelSelector=" + url.QueryEscape("a in (b,c),!d"), "labelSelector=" + url.QueryEscape("(("), "labelSelector=" + url.QueryEscape("a=b,"),
		"fieldSelector=" + url.QueryEscape("spec.nodeName!=n"), "fieldSelector=" + url.QueryEscape("unknown.field=1"), "fieldSelector=" + url.QueryEscape(`\`),
		"watch=true&timeoutSeconds=-5", "watch=true&sendInitialEvents=maybe", "watch=true&allowWatchBookmarks=yes",
		"watch=true&resourceVersionMatch=NotOlderThan", "watch=true&resourceVersion=abc", "watch=true&labelSelector=" + url.QueryEscape("x notin ()"),
		"watch=true&resourceVersion=1&timeoutSeconds=1", "watch=1&fieldSelector=" + url.QueryEscape("metadata.name=q")}
	for _, p := range append(paths, "/api/v1/namespaces/NS/pods", "/api/v1/namespaces/ns1/pods/p/log", "/apis/a/b/c/d/e/f", "//api///v1", "/api/v1/pods/%2e%2e") {
		for _, q := range queries {
			target := e.FrontdoorURL + p
			if q != "" {
				target += "?" + q
			}
			rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
			req, err := http.NewRequestWithContext(rctx, http.MethodGet, target, nil)
			if err != nil {
				rcancel()
				continue // not a URL a client can send
			}
			resp, err := e.http.Do(req)
			if err != nil {
				rcancel()
				t.Fatalf("GET %s: %v", target, err)
			}
			var b []byte
			if resp.StatusCode != http.StatusOK {
				b, _ = io.ReadAll(resp.Body)
			}
			resp.Body.Close() // a 200 watch is closed at once
			rcancel()
			// The one 500 is kube-apiserver's own answer to a watch from a
			// resourceVersion that is not a number (integration/kubeapi).
			if resp.StatusCode >= 500 && !(resp.StatusCode == http.StatusInternalServerError && q == "watch=true&resourceVersion=abc") {
				t.Errorf("GET %s: %d %s", target, resp.StatusCode, b)
				continue
			}
			if resp.StatusCode == http.StatusNotFound && strings.HasPrefix(p, "/apis/a/") {
				// A group version nobody serves: kube-apiserver's own
				// plain-text 404, which client-go reads as NotFound.
				if string(b) != "404 page not found\n" {
					t.Errorf("GET %s: 404 %q, want kube-apiserver's plain 404", target, b)
				}
				continue
			}
			if resp.StatusCode >= 400 {
				var st statusBody
				if json.Unmarshal(b, &st) != nil || st.Kind != "Status" || st.Code != resp.StatusCode {
					t.Errorf("GET %s: %d with a body that is not its Status: %s", target, resp.StatusCode, b)
				}
			}
		}
	}

	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.FrontdoorURL+"/api/v1/pods", nil)
	req.Header.Set("X-Big", strings.Repeat("x", 2<<20))
	if resp, err := e.http.Do(req); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("2 MiB header: %d, want 431", resp.StatusCode)
		}
	} // HTTP/2 may instead reset the stream: refused either way
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, e.FrontdoorURL+"/api/v1/pods", strings.NewReader(strings.Repeat("x", 4<<20)))
	resp, err := e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var st statusBody
	json.Unmarshal(b, &st)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || st.Reason != "RequestEntityTooLarge" {
		t.Errorf("4 MiB body: %d %s, want 413 RequestEntityTooLarge", resp.StatusCode, b)
	}
}
