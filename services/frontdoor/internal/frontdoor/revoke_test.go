package frontdoor

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// reloader rewrites the server's files and runs its reload checks, every
// version of a file with its own mtime (a reload is noticed by size, mtime
// or inode).
type reloader struct {
	t       *testing.T
	s       *Server
	version time.Time
}

func newReloader(t *testing.T, s *Server) *reloader {
	return &reloader{t: t, s: s, version: time.Now().Add(-time.Hour)}
}

func (r *reloader) write(path, content string) {
	r.t.Helper()
	writeFile(r.t, path, []byte(content))
	r.version = r.version.Add(time.Second)
	if err := os.Chtimes(path, r.version, r.version); err != nil {
		r.t.Fatal(err)
	}
	for _, c := range r.s.checks {
		c()
	}
}

// expect serves a request with token and checks its code.
func (r *reloader) expect(token, path string, code int, why string) {
	r.t.Helper()
	if got, body, _ := do(r.s, token, path); got != code {
		r.t.Fatalf("%s: GET %s: %d, want %d: %s", why, path, got, code, body)
	}
}

// expectLoaded checks the loud signs of a trust file that failed to load
// (its trust removed): the gauges, the error counter and the readiness
// check naming it; or their absence. A trust file is never "serving the
// last good one" (the config-files readiness detail).
func (r *reloader) expectLoaded(what string, ok bool, errors float64) {
	r.t.Helper()
	gauge := testutil.ToFloat64(r.s.m.reloadOK.WithLabelValues(what))
	broken := testutil.ToFloat64(r.s.trust.broken.WithLabelValues(what))
	counted := testutil.ToFloat64(r.s.m.reloads.WithLabelValues(what, "error"))
	check := r.s.TrustErrors()
	if (gauge == 1) != ok || (broken == 0) != ok || counted != errors || (check == nil) != ok || (!ok && !strings.Contains(check.Error(), what+": ")) {
		r.t.Fatalf("%s: last_reload_successful %v, trust_source_broken %v, %v errors counted, readiness check %v; want ok=%v and %v errors", what, gauge, broken, counted, check, ok, errors)
	}
	if err := r.s.ConfigErrors(); err != nil {
		r.t.Fatalf("%s: config-files detail %v: a trust file is never served from its last good version", what, err)
	}
}

// revision is one version of a reloaded file and what it must lead to:
// the codes of some requests, and whether it loaded (with the errors
// counted so far).
type revision struct {
	content string
	want    []answer
	loaded  bool
	errors  float64
}

type answer struct {
	token, path string
	code        int
}

// apply writes every revision of the file in turn and checks its effects.
func (r *reloader) apply(path, what string, revs []revision) {
	r.t.Helper()
	for i, rev := range revs {
		r.write(path, rev.content)
		for _, a := range rev.want {
			r.expect(a.token, a.path, a.code, fmt.Sprintf("%s revision %d", what, i))
		}
		r.expectLoaded(what, rev.loaded, rev.errors)
	}
}

// TestTokensRevoked: removing a token from the file or emptying the file
// revokes on reload; a file that fails to parse refuses every token (fail
// closed) and says so.
func TestTokensRevoked(t *testing.T) {
	s, dir := testServer(t, "", nil)
	newReloader(t, s).apply(filepath.Join(dir, "tokens.csv"), "token file", []revision{
		{content: tokAdmin + ",admin,1,\"system:masters\"\n" + tokOps + ",olga,4,ops\n", loaded: true,
			want: []answer{{tokAlice, "/api", 401}, {tokOps, "/api", 200}}},
		{content: "\"unterminated,olga\n", errors: 1, want: []answer{{tokOps, "/api", 401}, {tokAdmin, "/api", 401}}},
		{content: "record-without-a-user\n", errors: 2, want: []answer{{tokOps, "/api", 401}}},
		{content: "", loaded: true, errors: 2, want: []answer{{tokAdmin, "/api", 401}, {tokOps, "/api", 401}}},
	})
}

// TestRBACRevoked: removing a binding, or emptying the manifests, takes
// effect on reload; a manifest that fails to parse grants nothing (only
// system:masters is allowed) and says so.
func TestRBACRevoked(t *testing.T) {
	s, dir := testServer(t, "", nil)
	r := newReloader(t, s)
	r.expect(tokAlice, "/api/v1/namespaces/ns1/pods", 200, "alice before")
	var withoutAlice []string
	for _, doc := range strings.Split(testRBAC, "---\n") {
		if !strings.Contains(doc, "name: alice") {
			withoutAlice = append(withoutAlice, doc)
		}
	}
	r.apply(filepath.Join(dir, "rbac", "policy.yaml"), "rbac", []revision{
		{content: strings.Join(withoutAlice, "---\n"), loaded: true,
			want: []answer{{tokAlice, "/api/v1/namespaces/ns1/pods", 403}, {tokReader, "/api/v1/pods", 200}}},
		{content: "kind: [\n", errors: 1, want: []answer{{tokReader, "/api/v1/pods", 403}, {tokAdmin, "/api/v1/pods", 200}}},
		{content: "", loaded: true, errors: 1, want: []answer{{tokReader, "/api/v1/pods", 403}, {tokAdmin, "/api/v1/pods", 200}}},
	})
}

// TestClientCARevoked: removing a CA from the bundle, or emptying it,
// refuses its certificates on reload; a bundle that fails to parse refuses
// every certificate and says so.
func TestClientCARevoked(t *testing.T) {
	dir := t.TempDir()
	one, two := newTestCA(t, "one"), newTestCA(t, "two")
	bundle := writeFile(t, filepath.Join(dir, "ca.crt"), append(append([]byte{}, one.pem...), two.pem...))
	s, _ := testServer(t, "", func(c *Config) { c.ClientCAFile = bundle })
	r := newReloader(t, s)
	certOne, _, _ := one.issue(t, "carol", nil, x509.ExtKeyUsageClientAuth, 10)
	certTwo, _, _ := two.issue(t, "dan", nil, x509.ExtKeyUsageClientAuth, 11)
	accepted := func(c *x509.Certificate) bool {
		req, _ := http.NewRequest(http.MethodGet, "/api", nil)
		req.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{c}}
		_, err := s.authn.Authenticate(req)
		return err == nil
	}
	if !accepted(certOne) || !accepted(certTwo) {
		t.Fatal("both CAs' certificates should be accepted at first")
	}
	r.write(bundle, string(one.pem))
	if !accepted(certOne) || accepted(certTwo) {
		t.Fatalf("CA two removed: one accepted %v, two accepted %v", accepted(certOne), accepted(certTwo))
	}
	r.expectLoaded("client CA", true, 0)

	r.write(bundle, "not PEM at all\n")
	if accepted(certOne) {
		t.Fatal("a bundle that does not parse: the certificate is still accepted")
	}
	r.expectLoaded("client CA", false, 1)

	r.write(bundle, "\n")
	if accepted(certOne) {
		t.Fatal("emptied bundle: certificate still accepted")
	}
	r.expectLoaded("client CA", true, 1)
}

// TestJWTWithoutExpiryRefused: a service-account token without exp would
// be valid forever; it is refused.
func TestJWTWithoutExpiryRefused(t *testing.T) {
	dir := t.TempDir()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	pub, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	keyFile := writeFile(t, filepath.Join(dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}))
	s, _ := testServer(t, "", func(c *Config) {
		c.SAKeyFiles = keyFile
		c.SAIssuers = testIssuer + ",kubernetes/serviceaccount"
	})
	for _, tc := range []struct {
		name string
		mod  func(jwt.MapClaims)
		ok   bool
	}{
		{"bound, with exp", nil, true},
		{"bound, no exp", func(c jwt.MapClaims) { delete(c, "exp") }, false},
		{"legacy, no exp", legacyClaims, false},
	} {
		req, _ := http.NewRequest(http.MethodGet, "/api", nil)
		req.Header.Set("Authorization", "Bearer "+saToken(t, jwt.SigningMethodES256, key, tc.mod))
		if _, err := s.authn.Authenticate(req); (err == nil) != tc.ok {
			t.Errorf("%s: err %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}
