package frontdoor

import (
	"encoding/json"
	"net/http"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"herald.dev/libs/kube"
)

// compactedToken is the inconsistent continue token fakeCache answers a
// compacted continued list with.
const compactedToken = "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6LTEsInN0YXJ0IjoiL3AxMFx1MDAwMCJ9"

// TestClusterListCompacted: the cache's 410 for a list whose revision etcd
// compacted is written as it is, in cluster mode too (kube-apiserver could
// not read that revision from etcd either): for a continued list with the
// inconsistent continue token in the Status's metadata, as kube-apiserver
// answers; for an exact list with kube-apiserver's message. Neither goes
// upstream, unlike a list that is only older than the cache's window.
func TestClusterListCompacted(t *testing.T) {
	k := newFakeKube(t)
	s := clusterServer(t, k.srv.URL, k.caPEM(), nil)
	standalone, _ := testServer(t, "", nil)
	for _, tc := range []struct {
		path, token, message string
	}{
		{"/api/v1/namespaces/ns1/pods?limit=10&labelSelector=cache%3Dcompacted", compactedToken, kube.InconsistentContinueMessage},
		{"/api/v1/namespaces/ns1/pods?resourceVersion=2&resourceVersionMatch=Exact", "", kube.ExpiredListMessage},
	} {
		for name, srv := range map[string]http.Handler{"cluster": s, "standalone": standalone} {
			n := k.count()
			rec := send(srv, http.MethodGet, tc.path, tokAdmin, nil, nil)
			if k.count() != n {
				t.Errorf("%s %s: forwarded upstream", name, tc.path)
			}
			var st metav1.Status
			if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
				t.Fatalf("%s %s: %d %s: %v", name, tc.path, rec.Code, rec.Body, err)
			}
			if rec.Code != http.StatusGone || st.Kind != "Status" || st.Reason != metav1.StatusReasonExpired || st.Code != http.StatusGone ||
				st.Message != tc.message || st.Continue != tc.token {
				t.Errorf("%s %s: %d %s\nwant 410 Expired %q with continue %q", name, tc.path, rec.Code, rec.Body, tc.message, tc.token)
			}
		}
	}
}
