package upstream

import (
	"net/http/httptest"
	"testing"
)

// A forwarded request is named as kube-apiserver's metrics name it.
func TestRequestName(t *testing.T) {
	for _, tc := range []struct {
		method, target, contentType string
		verb, resource, sub, ns     string
	}{
		{"GET", "/api/v1/namespaces/ns/pods", "", "list", "pods", "", "ns"},
		{"POST", "/api/v1/namespaces/ns/pods/p/exec?command=sh", "", "connect", "pods", "exec", "ns"},
		{"PATCH", "/apis/apps/v1/namespaces/ns/deployments/d", "application/apply-patch+yaml", "apply", "deployments.apps", "", "ns"},
		{"PATCH", "/apis/apps/v1/namespaces/ns/deployments/d", "application/merge-patch+json", "patch", "deployments.apps", "", "ns"},
		{"GET", "/api/v1/nodes/n1/proxy/stats", "", "connect", "nodes", "proxy", ""},
		{"BREW", "/api/v1/pods", "", "other", "pods", "", ""},
		{"GET", "/openapi/v3", "", "get", "", "", ""},
	} {
		r := httptest.NewRequest(tc.method, tc.target, nil)
		if tc.contentType != "" {
			r.Header.Set("Content-Type", tc.contentType)
		}
		verb, res, sub, ns := RequestName(r)
		if verb != tc.verb || res != tc.resource || sub != tc.sub || ns != tc.ns {
			t.Errorf("%s %s: %q %q %q %q, want %q %q %q %q", tc.method, tc.target, verb, res, sub, ns, tc.verb, tc.resource, tc.sub, tc.ns)
		}
	}
}
