package frontdoor

import (
	"net/http"
	"testing"
	"time"
)

// The cluster's "not a valid token" is cached for the negative TTL: the
// token is reviewed once (the fake cluster answers as kube-apiserver does,
// with status.error).
func TestClusterNegativeTokenCache(t *testing.T) {
	k := newFakeKube(t)
	s := clusterServer(t, k.srv.URL, k.caPEM(), func(c *Config) { c.Upstream.AuthnNegativeCacheTTL = time.Minute })
	for range 3 {
		if code, b, _ := do(s, "no-such-token", "/api/v1/namespaces/ns1/pods"); code != http.StatusUnauthorized {
			t.Fatalf("%d %s, want 401", code, b)
		}
	}
	if n := k.tokenReviews.Load(); n != 1 {
		t.Errorf("%d TokenReviews for three uses of a refused token, want 1", n)
	}
}
