package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"herald.dev/integration/stack"
)

// The security fixtures: a client CA and a foreign one, a service-account
// signing key, and an RBAC policy.
//
//	alice   token, RoleBinding pod-reader in team-a only
//	bob     token, no binding
//	carol   x509 certificate (O=readers), ClusterRoleBinding pod-reader
//	builder service account team-a/builder (JWT), ClusterRoleBinding pod-reader
const securityRBAC = `
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: pod-reader}
rules:
- {apiGroups: [""], resources: [pods], verbs: [get, list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: alice-pods, namespace: team-a}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: pod-reader}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: alice}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: readers}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: pod-reader}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: Group, name: readers}
- {kind: ServiceAccount, name: builder, namespace: team-a}
`

const saIssuer = "https://kubernetes.default.svc.cluster.local"

type securityFixture struct {
	dir       string
	clientCA  *certAuthority
	foreignCA *certAuthority
	saKey     *ecdsa.PrivateKey
	flags     []string
}

func newSecurityFixture(t *testing.T, rbac string) *securityFixture {
	t.Helper()
	dir := t.TempDir()
	f := &securityFixture{dir: dir, clientCA: newCertAuthority(t, "herald-clients"), foreignCA: newCertAuthority(t, "somebody-else")}
	f.saKey, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	pub, _ := x509.MarshalPKIXPublicKey(&f.saKey.PublicKey)
	rbacDir := filepath.Join(dir, "rbac")
	must(t, os.Mkdir(rbacDir, 0o700))
	must(t, os.WriteFile(filepath.Join(rbacDir, "policy.yaml"), []byte(rbac), 0o600))
	must(t, os.WriteFile(filepath.Join(dir, "clients-ca.crt"), f.clientCA.pem, 0o600))
	must(t, os.WriteFile(filepath.Join(dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600))
	f.flags = []string{
		"--client-ca-file=" + filepath.Join(dir, "clients-ca.crt"),
		"--service-account-key-file=" + filepath.Join(dir, "sa.pub"),
		"--service-account-issuer=" + saIssuer,
		"--authorization.rbac-dir=" + rbacDir,
		"--reload-interval=200ms",
	}
	return f
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

type certAuthority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCertAuthority(t testing.TB, cn string) *certAuthority {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	must(t, err)
	c, _ := x509.ParseCertificate(der)
	return &certAuthority{cert: c, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// clientCert issues a client certificate: CN is the user, O the groups.
func (ca *certAuthority) clientCert(t testing.TB, cn string, groups ...string) tls.Certificate {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn, Organization: groups},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	must(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// serviceAccountJWT signs a bound service-account token (ES256) by hand:
// the test does not share the verifier's JWT library.
func serviceAccountJWT(t testing.TB, key *ecdsa.PrivateKey, ns, name string, exp time.Time) string {
	enc := base64.RawURLEncoding
	hdr, _ := json.Marshal(map[string]string{"alg": "ES256", "typ": "JWT", "kid": "test"})
	claims, _ := json.Marshal(map[string]any{
		"iss": saIssuer, "aud": []string{saIssuer}, "sub": "system:serviceaccount:" + ns + ":" + name,
		"iat": exp.Add(-time.Hour).Unix(), "nbf": exp.Add(-time.Hour).Unix(), "exp": exp.Unix(),
		"kubernetes.io": map[string]any{"namespace": ns, "serviceaccount": map[string]string{"name": name, "uid": "uid-" + name}},
	})
	input := enc.EncodeToString(hdr) + "." + enc.EncodeToString(claims)
	sum := sha256.Sum256([]byte(input))
	r, s, err := ecdsa.Sign(rand.Reader, key, sum[:])
	must(t, err)
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	s.FillBytes(sig[32:])
	return input + "." + enc.EncodeToString(sig)
}

// addTokens appends users to the stack's token file and waits until
// frontdoor has reloaded it (the first token authenticates).
func addTokens(t *testing.T, e *env, lines ...string) {
	t.Helper()
	path := filepath.Join(filepath.Dir(e.Kubeconfig), "tokens.csv")
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	must(t, err)
	_, err = f.WriteString(strings.Join(lines, "\n") + "\n")
	must(t, err)
	f.Close()
	tok, _, _ := strings.Cut(lines[0], ",")
	c := e.client(tok, nil)
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := c.Get(e.FrontdoorURL + "/api")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("frontdoor did not reload the token file: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // polling a condition with a deadline
	}
}

// client is an HTTP/2-capable client trusting the stack's CA, sending token
// (if any) and presenting cert (if any).
func (e *env) client(token string, cert *tls.Certificate) *http.Client {
	tr := e.TLSTransport()
	if cert != nil {
		tr.TLSClientConfig.Certificates = []tls.Certificate{*cert}
	}
	var rt http.RoundTripper = tr
	if token != "" {
		rt = bearer{token: token, base: tr}
	}
	return &http.Client{Transport: rt, Timeout: 30 * time.Second}
}

type bearer struct {
	token string
	base  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}

type statusBody struct {
	Kind    string `json:"kind"`
	Status  string `json:"status"`
	Code    int    `json:"code"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// request performs GET path and returns the code and, for errors, the
// Status. A 200 watch is closed after its headers.
func request(t *testing.T, c *http.Client, url string) (int, statusBody) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	var st statusBody
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		if err := json.Unmarshal(b, &st); err != nil || st.Kind != "Status" || st.Code != resp.StatusCode || st.Status != "Failure" {
			t.Fatalf("GET %s: %d with a body that is not its Status: %s", url, resp.StatusCode, b)
		}
	}
	return resp.StatusCode, st
}

// TestSecurityMatrix: every identity x verb through the real stack gives
// kube-apiserver's exact answer, and a watcher never sees an event of a
// namespace it may not read.
func TestSecurityMatrix(t *testing.T) {
	fx := newSecurityFixture(t, securityRBAC)
	e := startStack(t, stack.Options{Flags: map[string][]string{"frontdoor": fx.flags}})
	addTokens(t, e, "alice-token,alice,u-alice", "bob-token,bob,u-bob")
	ctx := testContext(t, 50*time.Second)
	e.put(t, ctx, "team-a", "web-0", podJSON("team-a", "web-0", "node-1", 0), true)
	e.put(t, ctx, "team-b", "db-0", podJSON("team-b", "db-0", "node-1", 0), true)

	carol := fx.clientCA.clientCert(t, "carol", "readers")
	mallory := fx.foreignCA.clientCert(t, "carol", "readers", "system:masters")
	type identity struct {
		name   string
		client *http.Client
		user   string // for 403 messages
	}
	ids := map[string]identity{
		"no credentials": {"no credentials", e.client("", nil), ""},
		"bad token":      {"bad token", e.client("not-a-token", nil), ""},
		"expired JWT":    {"expired JWT", e.client(serviceAccountJWT(t, fx.saKey, "team-a", "builder", time.Now().Add(-time.Hour)), nil), ""},
		"wrong-CA cert":  {"wrong-CA cert", e.client("", &mallory), ""},
		"forged JWT":     {"forged JWT", e.client(serviceAccountJWT(t, mustKey(), "team-a", "builder", time.Now().Add(time.Hour)), nil), ""},
		"no binding":     {"no binding", e.client("bob-token", nil), "bob"},
		"namespaced":     {"namespaced", e.client("alice-token", nil), "alice"},
		"x509 reader":    {"x509 reader", e.client("", &carol), "carol"},
		"sa reader":      {"sa reader", e.client(serviceAccountJWT(t, fx.saKey, "team-a", "builder", time.Now().Add(time.Hour)), nil), "system:serviceaccount:team-a:builder"},
	}
	paths := map[string]string{ // verb -> path in team-a / cluster-wide
		"get":   "/api/v1/namespaces/team-a/pods/web-0",
		"list":  "/api/v1/namespaces/team-a/pods",
		"watch": "/api/v1/namespaces/team-a/pods?watch=true&resourceVersion=0",
	}
	clusterPaths := map[string]string{
		"list":  "/api/v1/pods",
		"watch": "/api/v1/pods?watch=true&resourceVersion=0",
	}
	unauthorized := func(string, string) (int, string, string) { return 401, "Unauthorized", "Unauthorized" }
	forbidden := func(user, verb, scope string) (int, string, string) {
		target := "pods"
		if verb == "get" {
			target = `pods "web-0"`
		}
		return 403, "Forbidden", fmt.Sprintf(`%s is forbidden: User %q cannot %s resource "pods" in API group "" %s`, target, user, verb, scope)
	}
	type row struct {
		id, verb, path string
		code           int
		reason, msg    string
	}
	var rows []row
	for _, verb := range []string{"get", "list", "watch"} {
		for _, id := range []string{"no credentials", "bad token", "expired JWT", "wrong-CA cert", "forged JWT"} {
			c, r, m := unauthorized("", verb)
			rows = append(rows, row{id, verb, paths[verb], c, r, m})
		}
		c, r, m := forbidden("bob", verb, `in the namespace "team-a"`)
		rows = append(rows, row{"no binding", verb, paths[verb], c, r, m})
		rows = append(rows, row{"namespaced", verb, paths[verb], 200, "", ""})
		rows = append(rows, row{"x509 reader", verb, paths[verb], 200, "", ""})
		rows = append(rows, row{"sa reader", verb, paths[verb], 200, "", ""})
		if verb != "get" {
			c, r, m := forbidden("alice", verb, "at the cluster scope")
			rows = append(rows, row{"namespaced", verb, clusterPaths[verb], c, r, m})
			rows = append(rows, row{"x509 reader", verb, clusterPaths[verb], 200, "", ""})
			rows = append(rows, row{"sa reader", verb, clusterPaths[verb], 200, "", ""})
		}
	}
	for _, r := range rows {
		code, st := request(t, ids[r.id].client, e.FrontdoorURL+r.path)
		if code != r.code || st.Reason != r.reason || st.Message != r.msg {
			t.Errorf("%-14s %-5s %s: %d %s %q, want %d %s %q", r.id, r.verb, r.path, code, st.Reason, st.Message, r.code, r.reason, r.msg)
		}
	}

	// Isolation: alice's watch of team-a and carol's cluster-wide watch run
	// while both namespaces change; alice must see team-a only.
	_, aliceEvents := openWatchAs(t, ctx, ids["namespaced"].client, e.FrontdoorURL+"/api/v1/namespaces/team-a/pods?watch=true&resourceVersion=0")
	_, carolEvents := openWatchAs(t, ctx, ids["x509 reader"].client, e.FrontdoorURL+"/api/v1/pods?watch=true&resourceVersion=0")
	var lastA, last int64
	for i := range 20 {
		ns := []string{"team-a", "team-b"}[i%2]
		ev := e.put(t, ctx, ns, fmt.Sprintf("p-%d", i), podJSON(ns, fmt.Sprintf("p-%d", i), "node-1", i), true)
		if ns == "team-a" {
			lastA = ev.RV
		}
		last = ev.RV
	}
	// carol first: once she has seen the last write, every event alice
	// could get has been dispatched.
	all := collect(t, ctx, carolEvents, last)
	seenB := 0
	for _, ev := range all {
		if strings.HasPrefix(ev.Key, "team-b/p-") {
			seenB++
		}
	}
	if seenB != 10 {
		t.Errorf("the cluster-wide reader saw %d team-b creations, want 10", seenB)
	}
	for _, ev := range collect(t, ctx, aliceEvents, lastA) {
		if !strings.HasPrefix(ev.Key, "team-a/") {
			t.Errorf("alice's watch delivered %s of another namespace", ev.Key)
		}
	}
drain: // whatever else reached alice's stream by now
	for {
		select {
		case ev, ok := <-aliceEvents:
			if !ok {
				break drain
			}
			if ev.Type != "BOOKMARK" && !strings.HasPrefix(ev.toCheck().Key, "team-a/") {
				t.Errorf("alice's watch delivered %+v of another namespace", ev.toCheck())
			}
		default:
			break drain
		}
	}

	// RBAC reload: a new binding lets bob in, without a restart.
	must(t, os.WriteFile(filepath.Join(fx.dir, "rbac", "bob.yaml"), []byte(`{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"RoleBinding",
"metadata":{"name":"bob","namespace":"team-b"},"roleRef":{"kind":"ClusterRole","name":"pod-reader"},"subjects":[{"kind":"User","name":"bob"}]}`), 0o600))
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, _ := request(t, ids["no binding"].client, e.FrontdoorURL+"/api/v1/namespaces/team-b/pods")
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("bob's new RoleBinding not in effect after 20s: %d", code)
		}
		time.Sleep(50 * time.Millisecond) // polling a condition with a deadline
	}
	if code, _ := request(t, ids["no binding"].client, e.FrontdoorURL+"/api/v1/namespaces/team-a/pods"); code != 403 {
		t.Errorf("bob in team-a after a team-b binding: %d, want 403", code)
	}

	// Non-resource paths: pprof and metrics need RBAC; health is public.
	for _, tc := range []struct {
		id, path string
		code     int
	}{
		{"namespaced", "/debug/pprof/", 403},
		{"namespaced", "/metrics", 403},
		{"no credentials", "/readyz", 200},
		{"no credentials", "/debug/pprof/", 401},
	} {
		if code, st := request(t, ids[tc.id].client, e.FrontdoorURL+tc.path); code != tc.code {
			t.Errorf("%s %s: %d %s, want %d", tc.id, tc.path, code, st.Message, tc.code)
		}
	}
	if code, _ := request(t, e.http, e.FrontdoorURL+"/debug/pprof/"); code != 200 {
		t.Errorf("admin (system:masters) /debug/pprof/: %d", code)
	}
}

func mustKey() *ecdsa.PrivateKey {
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	return k
}

// openWatchAs opens a watch with client c and returns its events.
func openWatchAs(t testing.TB, ctx context.Context, c *http.Client, url string) (*http.Response, <-chan watchEvent) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	hc := *c
	hc.Timeout = 0
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("watch %s: %d %s", url, resp.StatusCode, b)
	}
	return resp, decodeWatch(resp.Body)
}

// decodeWatch decodes a watch stream's lines until it ends.
func decodeWatch(body io.ReadCloser) <-chan watchEvent {
	ch := make(chan watchEvent, 10000)
	go func() {
		defer close(ch)
		defer body.Close()
		dec := json.NewDecoder(body)
		for {
			var ev watchEvent
			if err := dec.Decode(&ev); err != nil {
				return
			}
			ch <- ev
		}
	}()
	return ch
}
