package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"
)

// testKubeletNamedReads (issue 53, point 6): a kubelet's watch-based
// Secret and ConfigMap managers list and watch each object its pods mount
// by fieldSelector=metadata.name, with the node's identity; the Node
// authorizer allows exactly those. Through Herald (which serves them from
// its cache, authorized by SubjectAccessReview) the codes are
// kube-apiserver's: 200 for what a pod bound to the node mounts, 403 (the
// same Status) for what none does.
func testKubeletNamedReads(t *testing.T, ctx context.Context, c *clusterEnv) {
	for _, obj := range []struct{ path, body string }{
		{"/api/v1/namespaces/demo/secrets", `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"kubelet-secret"},"stringData":{"k":"v"}}`},
		{"/api/v1/namespaces/demo/secrets", `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"kubelet-secret-unmounted"},"stringData":{"k":"v"}}`},
		{"/api/v1/namespaces/demo/configmaps", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"kubelet-cm"},"data":{"k":"v"}}`},
		{"/api/v1/namespaces/demo/configmaps", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"kubelet-cm-unmounted"},"data":{"k":"v"}}`},
		{"/api/v1/namespaces/demo/pods", `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"kubelet-reads"},"spec":{"nodeName":"node-1","automountServiceAccountToken":false,
			"containers":[{"name":"c","image":"registry.k8s.io/pause:3.10"}],
			"volumes":[{"name":"s","secret":{"secretName":"kubelet-secret"}},{"name":"cm","configMap":{"name":"kubelet-cm"}}]}}`},
	} {
		if code, body := c.call(ctx, c.kubeURL, c.Token, http.MethodPost, obj.path, obj.body); code != http.StatusCreated {
			t.Fatalf("create in %s: %d %s", obj.path, code, clip(body))
		}
	}
	// The Node authorizer's graph follows the cluster's watch of pods; the
	// cache has the objects once Herald serves them.
	since := time.Now()
	waitCode(t, ctx, c, tokNode1, "/api/v1/namespaces/demo/secrets/kubelet-secret", http.StatusOK, since, 20*time.Second)
	waitCode(t, ctx, c, tokNode1, "/api/v1/namespaces/demo/configmaps/kubelet-cm", http.StatusOK, since, 20*time.Second)

	forwarded := metricLabeled(t, c.Proc("frontdoor-0"), "herald_frontdoor_forwarded_requests_total", "")
	for _, tc := range []struct {
		resource, name string
		want           int
	}{
		{"secrets", "kubelet-secret", http.StatusOK},
		{"configmaps", "kubelet-cm", http.StatusOK},
		{"secrets", "kubelet-secret-unmounted", http.StatusForbidden},
		{"configmaps", "kubelet-cm-unmounted", http.StatusForbidden},
	} {
		base := fmt.Sprintf("/api/v1/namespaces/demo/%s?fieldSelector=metadata.name%%3D%s", tc.resource, tc.name)
		for _, path := range []string{
			base + "&limit=500&resourceVersion=0",
			// As client-go's reflector watches (timeoutSeconds bounds
			// kube-apiserver's; the code is read from the headers).
			base + "&allowWatchBookmarks=true&resourceVersion=0&timeoutSeconds=30&watch=true",
		} {
			hc, hs := kubeletCall(ctx, t, c, c.FrontdoorURL, path)
			kc, ks := kubeletCall(ctx, t, c, c.kubeURL, path)
			t.Logf("node-1 GET %s: Herald %d, kube-apiserver %d", path, hc, kc)
			if hc != tc.want || kc != tc.want || hs != ks {
				t.Errorf("node-1 GET %s: Herald %d %s, kube-apiserver %d %s; want %d from both, the same Status", path, hc, hs, kc, ks, tc.want)
			}
		}
	}
	if n := metricLabeled(t, c.Proc("frontdoor-0"), "herald_frontdoor_forwarded_requests_total", "") - forwarded; n != 0 {
		t.Errorf("%v of node-1's reads were forwarded to kube-apiserver, want all served (and authorized) by Herald", n)
	}
}

// kubeletCall sends one GET as node-1 and returns the code and, for an
// error, its Status line; a watch's body is not read past its headers.
func kubeletCall(ctx context.Context, t *testing.T, c *clusterEnv, base, path string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.PKI.CAPEM)
	cl := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer cl.CloseIdleConnections()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
	req.Header.Set("Authorization", "Bearer "+tokNode1)
	req.Header.Set("Accept", "application/json")
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatalf("GET %s%s: %v", base, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		return resp.StatusCode, ""
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, statusLine(string(b))
}
