package frontdoor

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/golang-jwt/jwt/v5"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// podCache holds pods and nodes by namespace/name with their uid, and
// records the resourceVersion of each lookup.
type podCache struct {
	fakeCache
	pods map[string]string // ns/name -> uid
	mu   sync.Mutex
	rvs  map[string][]string
}

func (c *podCache) List(_ context.Context, req *heraldv1.ListRequest, _ ...grpc.CallOption) (*heraldv1.ListResponse, error) {
	key := req.Namespace + "/" + req.Name
	c.mu.Lock()
	c.rvs[key] = append(c.rvs[key], fmt.Sprintf("%q", req.ResourceVersion))
	c.mu.Unlock()
	if req.Name == "down" {
		return nil, status.Error(codes.Unavailable, "cache down")
	}
	uid, ok := c.pods[key]
	if !ok {
		return nil, status.Error(codes.NotFound, "not found")
	}
	return &heraldv1.ListResponse{Revision: 9, Items: [][]byte{[]byte(fmt.Sprintf(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":%q,"namespace":%q,"uid":%q}}`, req.Name, req.Namespace, uid))}}, nil
}

// TestBoundPodToken: a token the cluster vouches for (TokenReview, cached)
// but bound to a pod (or a node) that the cache no longer holds, or holds
// with another uid, is refused with 401 before anything is served or
// forwarded; one whose pod the cache cannot be asked about is refused too
// (fail closed). A pod-bound token's node is not checked.
func TestBoundPodToken(t *testing.T) {
	k := newFakeKube(t)
	s := clusterServer(t, k.srv.URL, k.caPEM(), nil)
	pc := &podCache{pods: map[string]string{"ns1/p": "uid-p", "/n1": "uid-n1"}, rvs: map[string][]string{}}
	s.cache = pc
	for _, tc := range []struct {
		token string
		code  int
		rvs   string // lookups of the pod, in order
	}{
		{"pod-p-token", http.StatusCreated, `"0"`},
		{"pod-gone-token", http.StatusUnauthorized, `"0" ""`},   // consistent read before refusing
		{"pod-reused-token", http.StatusUnauthorized, `"0" ""`}, // same name, another pod
		{"pod-down-token", http.StatusUnauthorized, `"0"`},
		{"node-n1-token", http.StatusCreated, `"0"`},
		{"node-gone-token", http.StatusUnauthorized, `"0" ""`},
	} {
		n := k.count()
		user := clusterUsers[tc.token]
		key := "ns1/" + strings.Join(user.Extra["authentication.kubernetes.io/pod-name"], "")
		if strings.HasPrefix(tc.token, "node-") {
			key = "/" + user.Extra["authentication.kubernetes.io/node-name"][0]
		}
		pc.mu.Lock()
		pc.rvs[key] = nil
		pc.mu.Unlock()
		rec := send(s, http.MethodPost, "/api/v1/namespaces/ns1/configmaps", tc.token, strings.NewReader("{}"), nil)
		if rec.Code != tc.code {
			t.Errorf("%s: %d %s, want %d", tc.token, rec.Code, rec.Body, tc.code)
		}
		if forwarded := k.count() > n; forwarded != (tc.code == http.StatusCreated) {
			t.Errorf("%s: forwarded %v", tc.token, forwarded)
		}
		pc.mu.Lock()
		if got := strings.Join(pc.rvs[key], " "); got != tc.rvs {
			t.Errorf("%s: pod lookups with resourceVersion %s, want %s", tc.token, got, tc.rvs)
		}
		pc.mu.Unlock()
	}
	// The pod goes: its token stops working at once, though TokenReview's
	// answer is still cached.
	reviews := k.tokenReviews.Load()
	delete(pc.pods, "ns1/p")
	if rec := send(s, http.MethodPost, "/api/v1/namespaces/ns1/configmaps", "pod-p-token", strings.NewReader("{}"), nil); rec.Code != http.StatusUnauthorized {
		t.Errorf("token of a deleted pod: %d %s", rec.Code, rec.Body)
	}
	if k.tokenReviews.Load() != reviews {
		t.Error("the token was reviewed again: the refusal must not depend on the review cache")
	}
	// The forwarded identity carries the pod's extras (the cluster's
	// Node authorizer and admission use them).
	pc.pods["ns1/p"] = "uid-p"
	send(s, http.MethodPost, "/api/v1/namespaces/ns1/configmaps", "pod-p-token", strings.NewReader("{}"), nil)
	got, _ := k.last(t)
	if got.Header.Get("Impersonate-Extra-Authentication.kubernetes.io%2Fpod-name") != "p" {
		t.Errorf("forwarded extras: %v", got.Header)
	}
}

// TestBoundSecretToken: a service-account token naming a Secret in its
// claims (bound to it by TokenRequest, or a legacy token stored in it) is
// refused with 401 once the cache no longer holds that Secret (with the
// uid, when the claims carry one); a Secret of another namespace than the
// account's binds nothing.
func TestBoundSecretToken(t *testing.T) {
	k := newFakeKube(t)
	s := clusterServer(t, k.srv.URL, k.caPEM(), nil)
	pc := &podCache{pods: map[string]string{"ns1/s": "uid-s", "ns1/old": "uid-old"}, rvs: map[string][]string{}}
	s.cache = pc
	bound := secretToken(`{"kubernetes.io":{"namespace":"ns1","secret":{"name":"s","uid":"uid-s"}}}`)
	reused := secretToken(`{"kubernetes.io":{"namespace":"ns1","secret":{"name":"s","uid":"uid-of-an-earlier-s"}}}`)
	legacy := secretToken(`{"kubernetes.io/serviceaccount/namespace":"ns1","kubernetes.io/serviceaccount/secret.name":"old"}`)
	elsewhere := secretToken(`{"kubernetes.io":{"namespace":"ns2","secret":{"name":"elsewhere","uid":"u"}}}`)
	post := func(token string) int {
		return send(s, http.MethodPost, "/api/v1/namespaces/ns1/configmaps", token, strings.NewReader("{}"), nil).Code
	}
	for _, tc := range []struct {
		name, token string
		code        int
	}{
		{"bound", bound, http.StatusCreated},
		{"bound to an earlier secret of the name", reused, http.StatusUnauthorized},
		{"legacy", legacy, http.StatusCreated},
		{"another namespace's secret", elsewhere, http.StatusCreated},
	} {
		if code := post(tc.token); code != tc.code {
			t.Errorf("%s: %d, want %d", tc.name, code, tc.code)
		}
	}
	delete(pc.pods, "ns1/s")
	delete(pc.pods, "ns1/old")
	for name, token := range map[string]string{"bound": bound, "legacy": legacy} {
		if code := post(token); code != http.StatusUnauthorized {
			t.Errorf("%s token after its secret is deleted: %d, want 401", name, code)
		}
	}
}

// TestStandaloneBoundToken: standalone, a service-account token verified
// by key is held to its binding as in cluster mode (one check, bound.go),
// from its verified claims: the pod (not its node), a node, a secret, each
// by name and uid; and its user carries the extra kube-apiserver gives it.
func TestStandaloneBoundToken(t *testing.T) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	pub, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	keyFile := writeFile(t, filepath.Join(t.TempDir(), "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}))
	s, _ := testServer(t, "", func(c *Config) {
		c.SAKeyFiles = keyFile
		c.SAIssuers = testIssuer + ",kubernetes/serviceaccount"
	})
	pc := &podCache{pods: map[string]string{"ns1/p": "uid-p", "/n1": "uid-n1", "ns1/s": "uid-s"}, rvs: map[string][]string{}}
	s.cache = pc
	bound := func(k8s map[string]any) string {
		return saToken(t, jwt.SigningMethodES256, key, func(c jwt.MapClaims) {
			m := c["kubernetes.io"].(map[string]any)
			for k, v := range k8s {
				m[k] = v
			}
			c["jti"] = "j-1"
		})
	}
	ref := func(name, uid string) map[string]any { return map[string]any{"name": name, "uid": uid} }
	for _, tc := range []struct {
		name  string
		k8s   map[string]any
		code  int
		extra map[string][]string
	}{
		{"pod", map[string]any{"pod": ref("p", "uid-p"), "node": ref("gone", "uid-gone")}, 200, map[string][]string{
			"authentication.kubernetes.io/pod-name": {"p"}, "authentication.kubernetes.io/pod-uid": {"uid-p"},
			"authentication.kubernetes.io/node-name": {"gone"}, "authentication.kubernetes.io/node-uid": {"uid-gone"},
			"authentication.kubernetes.io/credential-id": {"JTI=j-1"}}},
		{"pod of another uid", map[string]any{"pod": ref("p", "uid-other")}, 401, nil},
		{"pod without a uid", map[string]any{"pod": ref("p", "")}, 401, nil},
		{"pod gone", map[string]any{"pod": ref("missing", "uid-m")}, 401, nil},
		{"pod the cache cannot look up", map[string]any{"pod": ref("down", "uid-d")}, 401, nil},
		{"node", map[string]any{"node": ref("n1", "uid-n1")}, 200, nil},
		{"node of another uid", map[string]any{"node": ref("n1", "uid-n0")}, 401, nil},
		{"secret", map[string]any{"secret": ref("s", "uid-s")}, 200, nil},
		{"secret of another uid", map[string]any{"secret": ref("s", "uid-s0")}, 401, nil},
		{"not bound", nil, 200, map[string][]string{"authentication.kubernetes.io/credential-id": {"JTI=j-1"}}},
	} {
		tok := bound(tc.k8s)
		req := httptest.NewRequest(http.MethodGet, "/api", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		u, err := s.authenticate(req)
		if code := map[bool]int{true: 200, false: 401}[err == nil]; code != tc.code {
			t.Errorf("%s: %d (%v), want %d", tc.name, code, err, tc.code)
			continue
		}
		if tc.extra != nil && !reflect.DeepEqual(u.Extra, tc.extra) {
			t.Errorf("%s: extra %v, want %v", tc.name, u.Extra, tc.extra)
		}
		if code, body, _ := do(s, tok, "/api/v1/namespaces/ns1/configmaps"); tc.code == 401 && code != 401 {
			t.Errorf("%s: served %d %s, want 401", tc.name, code, body)
		}
	}
	// A legacy token (one that carries an expiry) names its Secret by name
	// only: any uid, but the Secret must be there.
	for secret, ok := range map[string]bool{"s": true, "gone": false} {
		tok := saToken(t, jwt.SigningMethodES256, key, func(c jwt.MapClaims) {
			exp := c["exp"]
			legacyClaims(c)
			c["exp"] = exp
			c["kubernetes.io/serviceaccount/secret.name"] = secret
		})
		req := httptest.NewRequest(http.MethodGet, "/api", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		if _, err := s.authenticate(req); (err == nil) != ok {
			t.Errorf("legacy token of secret %q: %v, want accepted %v", secret, err, ok)
		}
	}
}
