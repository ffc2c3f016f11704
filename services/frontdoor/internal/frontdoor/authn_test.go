package frontdoor

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"herald.dev/services/frontdoor/internal/authn"
)

const testIssuer = "https://kubernetes.default.svc.cluster.local"

func saToken(t *testing.T, method jwt.SigningMethod, key any, mod func(jwt.MapClaims)) string {
	t.Helper()
	c := jwt.MapClaims{
		"iss": testIssuer, "aud": []string{testIssuer}, "sub": "system:serviceaccount:ns1:builder",
		"exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix(), "nbf": time.Now().Unix(),
		"kubernetes.io": map[string]any{"namespace": "ns1", "serviceaccount": map[string]any{"name": "builder", "uid": "u-1"}},
	}
	if mod != nil {
		mod(c)
	}
	s, err := jwt.NewWithClaims(method, c).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// legacyClaims turns the claims into a legacy Secret-based token's: legacy
// issuer and private claims, no audience, no expiry.
func legacyClaims(c jwt.MapClaims) {
	delete(c, "kubernetes.io")
	delete(c, "aud")
	delete(c, "exp")
	c["iss"] = "kubernetes/serviceaccount"
	c["kubernetes.io/serviceaccount/namespace"] = "ns1"
	c["kubernetes.io/serviceaccount/service-account.name"] = "builder"
}

func TestServiceAccountTokens(t *testing.T) {
	dir := t.TempDir()
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	otherKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ecPub, _ := x509.MarshalPKIXPublicKey(&ecKey.PublicKey)
	rsaDER := x509.MarshalPKCS1PrivateKey(rsaKey) // a private key file works too
	files := writeFile(t, filepath.Join(dir, "ec.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: ecPub})) + "," +
		writeFile(t, filepath.Join(dir, "rsa.key"), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: rsaDER}))
	s, _ := testServer(t, "", func(c *Config) { c.SAKeyFiles = files })
	ecPubBytes := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: ecPub})
	for _, tc := range []struct {
		name string
		tok  string
		ok   bool
	}{
		{"ES256", saToken(t, jwt.SigningMethodES256, ecKey, nil), true},
		{"RS256", saToken(t, jwt.SigningMethodRS256, rsaKey, nil), true},
		{"legacy", saToken(t, jwt.SigningMethodES256, ecKey, legacyClaims), false}, // legacy issuer not configured
		{"expired", saToken(t, jwt.SigningMethodES256, ecKey, func(c jwt.MapClaims) { c["exp"] = time.Now().Add(-time.Hour).Unix() }), false},
		{"not yet valid", saToken(t, jwt.SigningMethodES256, ecKey, func(c jwt.MapClaims) { c["nbf"] = time.Now().Add(time.Hour).Unix() }), false},
		{"unknown key", saToken(t, jwt.SigningMethodES256, otherKey, nil), false},
		{"HS256 with the public key as secret", saToken(t, jwt.SigningMethodHS256, ecPubBytes, nil), false},
		{"alg none", saToken(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, nil), false},
		{"wrong issuer", saToken(t, jwt.SigningMethodES256, ecKey, func(c jwt.MapClaims) { c["iss"] = "https://evil" }), false},
		{"wrong audience", saToken(t, jwt.SigningMethodES256, ecKey, func(c jwt.MapClaims) { c["aud"] = []string{"vault"} }), false},
		{"not a service account", saToken(t, jwt.SigningMethodES256, ecKey, func(c jwt.MapClaims) { c["sub"] = "admin" }), false},
		{"claims disagree", saToken(t, jwt.SigningMethodES256, ecKey, func(c jwt.MapClaims) { c["sub"] = "system:serviceaccount:kube-system:builder" }), false},
		{"tampered", func() string {
			p := strings.Split(saToken(t, jwt.SigningMethodES256, ecKey, nil), ".")
			return p[0] + "." + strings.TrimRight(p[1], "=") + "x." + p[2]
		}(), false},
	} {
		req, _ := http.NewRequest(http.MethodGet, "/api", nil)
		req.Header.Set("Authorization", "Bearer "+tc.tok)
		u, err := s.authn.Authenticate(req)
		if (err == nil) != tc.ok {
			t.Errorf("%s: err %v, want ok=%v", tc.name, err, tc.ok)
			continue
		}
		if tc.ok {
			want := []string{"system:serviceaccounts", "system:serviceaccounts:ns1", "system:authenticated"}
			if u.Name != "system:serviceaccount:ns1:builder" || !slices.Equal(u.Groups, want) || u.Method != "serviceaccount" {
				t.Errorf("%s: user %+v", tc.name, u)
			}
		}
	}
}

func TestClientCertificates(t *testing.T) {
	dir := t.TempDir()
	ca, other := newTestCA(t, "client-ca"), newTestCA(t, "other-ca")
	caFile := writeFile(t, filepath.Join(dir, "ca.crt"), ca.pem)
	s, _ := testServer(t, "", func(c *Config) { c.ClientCAFile = caFile; c.TokenFile = "" })
	good, _, _ := ca.issue(t, "carol", []string{"dev", "ops"}, x509.ExtKeyUsageClientAuth, 10)
	serverOnly, _, _ := ca.issue(t, "carol", nil, x509.ExtKeyUsageServerAuth, 11)
	foreign, _, _ := other.issue(t, "carol", nil, x509.ExtKeyUsageClientAuth, 12)
	for _, tc := range []struct {
		name string
		cert *x509.Certificate
		ok   bool
	}{
		{"valid", good, true},
		{"server certificate", serverOnly, false},
		{"other CA", foreign, false},
	} {
		req, _ := http.NewRequest(http.MethodGet, "/api", nil)
		req.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{tc.cert}}
		u, err := s.authn.Authenticate(req)
		if (err == nil) != tc.ok {
			t.Errorf("%s: err %v, want ok=%v", tc.name, err, tc.ok)
			continue
		}
		if tc.ok && (u.Name != "carol" || !slices.Equal(u.Groups, []string{"dev", "ops", "system:authenticated"})) {
			t.Errorf("%s: user %+v", tc.name, u)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, "/api", nil)
	if _, err := s.authn.Authenticate(req); err != authn.ErrNoCredentials {
		t.Errorf("no certificate: %v, want authn.ErrNoCredentials", err)
	}
}

func TestAnonymous(t *testing.T) {
	s, _ := testServer(t, "", func(c *Config) { c.AnonymousAuth = true })
	if code, body, _ := do(s, "", "/api/v1/namespaces/ns1/pods"); code != 403 || !strings.Contains(string(body), `User \"system:anonymous\" cannot list`) {
		t.Fatalf("anonymous: %d %s", code, body)
	}
	if code, _, _ := do(s, "bad", "/api"); code != 401 {
		t.Fatalf("a bad token with anonymous on: %d, want 401", code)
	}
}

// TestReload: RBAC manifests and tokens take effect when their files
// change; a broken change grants nothing (fail closed).
func TestReload(t *testing.T) {
	s, dir := testServer(t, "", nil)
	check := func() {
		for _, c := range s.checks {
			c()
		}
	}
	if code, _, _ := do(s, tokBob, "/api/v1/namespaces/ns2/pods"); code != 403 {
		t.Fatalf("bob before his binding: %d", code)
	}
	writeFile(t, filepath.Join(dir, "rbac", "bob.yaml"), []byte(`{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"RoleBinding",
"metadata":{"name":"bob","namespace":"ns2"},"roleRef":{"kind":"ClusterRole","name":"pod-reader"},"subjects":[{"kind":"User","name":"bob"}]}`))
	check()
	if code, body, _ := do(s, tokBob, "/api/v1/namespaces/ns2/pods"); code != 200 {
		t.Fatalf("bob after his binding: %d %s", code, body)
	}
	writeFile(t, filepath.Join(dir, "rbac", "broken.yaml"), []byte("kind: [\n"))
	check()
	if code, _, _ := do(s, tokBob, "/api/v1/namespaces/ns2/pods"); code != 403 {
		t.Fatalf("a broken manifest kept the policy: %d, want 403", code)
	}
	writeFile(t, filepath.Join(dir, "tokens.csv"), []byte("new-token,dave,9,\"system:masters\"\n"))
	check()
	if code, _, _ := do(s, "new-token", "/api"); code != 200 {
		t.Fatalf("new token: %d", code)
	}
	if code, _, _ := do(s, tokAdmin, "/api"); code != 401 {
		t.Fatalf("removed token: %d", code)
	}
}
