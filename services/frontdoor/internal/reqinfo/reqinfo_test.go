package reqinfo

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestLongRunning: kube-apiserver's long-running requests, and only those.
func TestLongRunning(t *testing.T) {
	for path, want := range map[string]bool{
		"/api/v1/namespaces/ns1/pods/p/log":                            true, // follow or not, as kube-apiserver
		"/api/v1/namespaces/ns1/pods/p/exec?command=sh":                true,
		"/api/v1/namespaces/ns1/pods/p/attach":                         true,
		"/api/v1/namespaces/ns1/pods/p/portforward":                    true,
		"/api/v1/namespaces/ns1/services/s:80/proxy/metrics":           true,
		"/api/v1/nodes/n1/proxy/stats":                                 true,
		"/api/v1/watch/namespaces/ns1/secrets":                         true,
		"/apis/apps/v1/deployments?watch=1":                            true,
		"/api/v1/namespaces/ns1/pods/p":                                false,
		"/api/v1/namespaces/ns1/pods/p/status":                         false,
		"/apis/apps/v1/namespaces/ns1/deployments/d/scale":             false,
		"/api/v1/secrets?watch=false":                                  false,
		"/version":                                                     false,
		"/openapi/v3":                                                  false,
		"/apis/example.com/v1/namespaces/ns1/widgets?resourceVersion=": false,
	} {
		if got := LongRunning(httptest.NewRequest(http.MethodGet, path, nil)); got != want {
			t.Errorf("%s: long-running %v, want %v", path, got, want)
		}
	}
}
