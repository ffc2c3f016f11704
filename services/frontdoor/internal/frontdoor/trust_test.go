package frontdoor

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/golang-jwt/jwt/v5"
)

// remove deletes path (a file or a directory) and runs the reload checks.
func (r *reloader) remove(path string) {
	r.t.Helper()
	if err := os.RemoveAll(path); err != nil {
		r.t.Fatal(err)
	}
	for _, c := range r.s.checks {
		c()
	}
}

// logCounter counts the records of a message by their "what".
type logCounter struct {
	mu    sync.Mutex
	msg   string
	count map[string]int
}

func (c *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (c *logCounter) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *logCounter) WithGroup(string) slog.Handler            { return c }
func (c *logCounter) Handle(_ context.Context, r slog.Record) error {
	if r.Message != c.msg {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "what" {
			c.mu.Lock()
			c.count[a.Value.String()]++
			c.mu.Unlock()
		}
		return true
	})
	return nil
}

func (c *logCounter) of(what string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.count[what]
}

// TestTokenFileFailsClosed: a token file that is deleted, or changed into
// one that does not load, refuses every token it held (401) until a file
// that loads is back; each broken change is logged once, however many
// checks see it, and shown by the gauges and the readiness check.
func TestTokenFileFailsClosed(t *testing.T) {
	s, dir := testServer(t, "", nil)
	logs := &logCounter{msg: "reload failed; its trust is removed until it loads", count: map[string]int{}}
	s.log = slog.New(logs)
	r := newReloader(t, s)
	check := func() {
		for _, c := range s.checks {
			c()
		}
	}
	path := filepath.Join(dir, "tokens.csv")
	good := tokAdmin + ",admin,1,\"system:masters\"\n" + tokOps + ",olga,4,ops\n"
	r.write(path, good)
	r.expect(tokOps, "/api", 200, "loaded")
	r.expectLoaded("token file", true, 0)
	r.write(path, "\"unterminated,olga\n")
	r.expect(tokOps, "/api", 401, "token file that does not parse")
	r.expect(tokAdmin, "/api", 401, "token file that does not parse")
	r.expectLoaded("token file", false, 1)
	check()
	check()
	if n := logs.of("token file"); n != 1 {
		t.Errorf("a broken change checked three times: logged %d times, want once", n)
	}
	r.write(path, good)
	r.expect(tokOps, "/api", 200, "fixed")
	r.expectLoaded("token file", true, 1)
	r.remove(path)
	r.expect(tokOps, "/api", 401, "token file deleted")
	r.expect(tokAdmin, "/api", 401, "token file deleted")
	r.expectLoaded("token file", false, 2)
	if err := s.TrustErrors(); err == nil || !strings.Contains(err.Error(), "token file: ") || !strings.Contains(err.Error(), "its tokens are refused") {
		t.Errorf("readiness check while the token file is deleted: %v", err)
	}
	check()
	if n := logs.of("token file"); n != 2 {
		t.Errorf("two broken changes: logged %d times, want twice", n)
	}
	r.write(path, good)
	r.expect(tokAdmin, "/api", 200, "back")
	r.expectLoaded("token file", true, 2)
}

// TestRBACFailsClosed: an RBAC directory whose manifests do not load, or
// that is deleted, grants nothing (403) until it loads again; only
// system:masters, which no manifest grants, is still allowed.
func TestRBACFailsClosed(t *testing.T) {
	s, dir := testServer(t, "", nil)
	r := newReloader(t, s)
	rbacDir := filepath.Join(dir, "rbac")
	policy := filepath.Join(rbacDir, "policy.yaml")
	r.expect(tokReader, "/api/v1/pods", 200, "loaded")
	r.write(filepath.Join(rbacDir, "broken.yaml"), "kind: [\n")
	r.expect(tokReader, "/api/v1/pods", 403, "a manifest that does not parse")
	r.expect(tokAlice, "/api/v1/namespaces/ns1/pods", 403, "a manifest that does not parse")
	r.expect(tokAdmin, "/api/v1/pods", 200, "system:masters while the manifests do not parse")
	r.expectLoaded("rbac", false, 1)
	r.remove(filepath.Join(rbacDir, "broken.yaml"))
	r.expect(tokReader, "/api/v1/pods", 200, "fixed")
	r.expectLoaded("rbac", true, 1)
	r.remove(rbacDir)
	r.expect(tokReader, "/api/v1/pods", 403, "directory deleted")
	r.expect(tokAdmin, "/api/v1/pods", 200, "system:masters while the directory is gone")
	r.expectLoaded("rbac", false, 2)
	if err := os.Mkdir(rbacDir, 0o700); err != nil {
		t.Fatal(err)
	}
	r.write(policy, testRBAC)
	r.expect(tokReader, "/api/v1/pods", 200, "back")
	r.expectLoaded("rbac", true, 2)
}

// TestClientCAFailsClosed: a client CA bundle that is deleted, or changed
// into one that does not parse, accepts no certificate until a bundle that
// loads is back.
func TestClientCAFailsClosed(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, "clients")
	bundle := writeFile(t, filepath.Join(dir, "ca.crt"), ca.pem)
	s, _ := testServer(t, "", func(c *Config) { c.ClientCAFile = bundle })
	r := newReloader(t, s)
	cert, _, _ := ca.issue(t, "carol", nil, x509.ExtKeyUsageClientAuth, 10)
	accepted := func() bool {
		req, _ := http.NewRequest(http.MethodGet, "/api", nil)
		req.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}}
		_, err := s.authn.Authenticate(req)
		return err == nil
	}
	if !accepted() {
		t.Fatal("certificate refused at first")
	}
	r.write(bundle, "not PEM at all\n")
	if accepted() {
		t.Error("a bundle that does not parse: the certificate is still accepted")
	}
	r.expectLoaded("client CA", false, 1)
	r.write(bundle, string(ca.pem))
	if !accepted() {
		t.Fatal("fixed bundle: certificate refused")
	}
	r.remove(bundle)
	if accepted() {
		t.Error("bundle deleted: the certificate is still accepted")
	}
	r.expectLoaded("client CA", false, 2)
	r.write(bundle, string(ca.pem))
	if !accepted() {
		t.Error("bundle back: certificate refused")
	}
	r.expectLoaded("client CA", true, 2)
}

// TestSAKeysFailClosed: a service-account key file that is deleted, or
// changed into one that does not load, accepts no service-account token
// (of any key: the keys are one source) until the files load again.
func TestSAKeysFailClosed(t *testing.T) {
	dir := t.TempDir()
	one, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	two, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	pemOf := func(k *ecdsa.PrivateKey) string {
		b, _ := x509.MarshalPKIXPublicKey(&k.PublicKey)
		return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: b}))
	}
	fileOne := writeFile(t, filepath.Join(dir, "one.pub"), []byte(pemOf(one)))
	fileTwo := writeFile(t, filepath.Join(dir, "two.pub"), []byte(pemOf(two)))
	s, _ := testServer(t, "", func(c *Config) { c.SAKeyFiles = fileOne + "," + fileTwo })
	r := newReloader(t, s)
	tokOne, tokTwo := saToken(t, jwt.SigningMethodES256, one, nil), saToken(t, jwt.SigningMethodES256, two, nil)
	accepted := func(tok string) bool {
		req, _ := http.NewRequest(http.MethodGet, "/api", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		_, err := s.authn.Authenticate(req)
		return err == nil
	}
	if !accepted(tokOne) || !accepted(tokTwo) {
		t.Fatal("tokens refused at first")
	}
	r.write(fileTwo, "-----BEGIN PUBLIC KEY-----\nnot base64\n-----END PUBLIC KEY-----\n")
	if accepted(tokOne) || accepted(tokTwo) {
		t.Errorf("a key file that does not load: tokens accepted (one %v, two %v)", accepted(tokOne), accepted(tokTwo))
	}
	r.expectLoaded("service account keys", false, 1)
	r.write(fileTwo, pemOf(two))
	if !accepted(tokOne) || !accepted(tokTwo) {
		t.Fatal("fixed key file: tokens refused")
	}
	r.remove(fileOne)
	if accepted(tokOne) || accepted(tokTwo) {
		t.Errorf("key file deleted: tokens accepted (one %v, two %v)", accepted(tokOne), accepted(tokTwo))
	}
	r.expectLoaded("service account keys", false, 2)
	r.write(fileOne, pemOf(one))
	if !accepted(tokOne) || !accepted(tokTwo) {
		t.Error("key file back: tokens refused")
	}
	r.expectLoaded("service account keys", true, 2)
}
