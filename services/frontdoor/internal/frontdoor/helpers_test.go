package frontdoor

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"flag"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/watchsession"
)

// testCA is a certificate authority for tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t testing.TB, name string) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return &testCA{cert: c, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a leaf certificate and its key as PEM.
func (ca *testCA) issue(t testing.TB, cn string, orgs []string, usage x509.ExtKeyUsage, serial int64) (*x509.Certificate, []byte, []byte) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	kd, _ := x509.MarshalECPrivateKey(key)
	return c, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})
}

func writeFile(t testing.TB, path string, b []byte) string {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// fakeCache answers every LIST with one pod and GET with that pod.
type fakeCache struct{}

func (fakeCache) List(_ context.Context, req *heraldv1.ListRequest, _ ...grpc.CallOption) (*heraldv1.ListResponse, error) {
	if req.Name == "missing" {
		return nil, status.Error(codes.NotFound, "not found")
	}
	if req.Name == "expired" {
		return nil, status.Error(codes.OutOfRange, "too old resource version: 1 (5)")
	}
	if req.LabelSelector == "cache=unavailable" {
		return nil, status.Error(codes.Unavailable, "no cache replica")
	}
	if req.LabelSelector == "cache=compacted" {
		// A continued list whose revision etcd compacted.
		return nil, kube.CompactedError(compactedToken)
	}
	if req.ResourceVersion == "2" && req.ResourceVersionMatch == "Exact" {
		return nil, kube.CompactedError("")
	}
	if req.ResourceVersion == "1" && req.ResourceVersionMatch == "Exact" {
		// Older than the cache's window.
		return nil, status.Error(codes.OutOfRange, "too old resource version: 1 (5)")
	}
	if req.Name == "older" {
		// Last written before the cache's revision.
		return &heraldv1.ListResponse{Revision: 7, Items: [][]byte{[]byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"older","namespace":"ns1","resourceVersion":"5"}}`)}}, nil
	}
	return &heraldv1.ListResponse{Revision: 7, Items: [][]byte{[]byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"ns1","resourceVersion":"7"}}`)}}, nil
}

func (fakeCache) Watch(context.Context, *heraldv1.WatchRequest, ...grpc.CallOption) (grpc.ServerStreamingClient[heraldv1.WatchResponse], error) {
	return nil, status.Error(codes.Unimplemented, "no watch")
}

// Tokens of the test token file.
const (
	tokAdmin  = "admin-token"
	tokAlice  = "alice-token"  // bound in ns1 only
	tokBob    = "bob-token"    // no binding
	tokOps    = "ops-token"    // cluster-wide reader, may read /metrics
	tokReader = "reader-token" // reads every resource everywhere, no paths
)

const testRBAC = `
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: pod-reader}
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: alice, namespace: ns1}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: pod-reader}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: alice}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: ops}
rules:
- apiGroups: ["*"]
  resources: ["*"]
  verbs: [get, list, watch]
- nonResourceURLs: ["/metrics", "/debug/pprof/*"]
  verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: ops}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: ops}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: Group, name: ops}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: all-reader}
rules:
- {apiGroups: ["*"], resources: ["*"], verbs: [get, list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: readers}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: all-reader}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: Group, name: readers}
`

// testServer builds a Server on files in a temp dir; fanout is the URL of
// the fanout replicas (comma-separated), mod adjusts the config.
func testServer(t testing.TB, fanout string, mod func(*Config)) (*Server, string) {
	t.Helper()
	dir := t.TempDir()
	ca := newTestCA(t, "serving-ca")
	_, crt, key := ca.issue(t, "frontdoor", nil, x509.ExtKeyUsageServerAuth, 2)
	rbacDir := filepath.Join(dir, "rbac")
	os.Mkdir(rbacDir, 0o700)
	writeFile(t, filepath.Join(rbacDir, "policy.yaml"), []byte(testRBAC))
	var cfg Config
	fs := newFlagSet()
	cfg.RegisterFlags(fs)
	cfg.TLSCertFile = writeFile(t, filepath.Join(dir, "tls.crt"), crt)
	cfg.TLSKeyFile = writeFile(t, filepath.Join(dir, "tls.key"), key)
	cfg.TokenFile = writeFile(t, filepath.Join(dir, "tokens.csv"), []byte(
		tokAdmin+",admin,1,\"system:masters\"\n"+tokAlice+",alice,2\n"+tokBob+",bob,3\n"+tokOps+",olga,4,ops\n"+tokReader+",rita,5,readers\n"))
	cfg.AuthorizationDir = rbacDir
	if fanout != "" {
		cfg.FanoutAddrs = fanout
	}
	cfg.FanoutRetryDown = time.Minute
	if mod != nil {
		mod(&cfg)
	}
	s, err := NewServer(cfg, slog.New(slog.DiscardHandler), fakeCache{}, prometheus.NewRegistry(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return s, dir
}

// do serves one request in process and returns the code and body.
func do(s http.Handler, token, target string) (int, []byte, http.Header) {
	req := httptest.NewRequest(http.MethodGet, target, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	b, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, b, rec.Result().Header
}

// statusOf decodes a Status body.
func statusOf(t testing.TB, b []byte) (int32, string, string) {
	t.Helper()
	var st struct {
		Kind    string `json:"kind"`
		Code    int32  `json:"code"`
		Reason  string `json:"reason"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(b, &st); err != nil || st.Kind != "Status" {
		t.Fatalf("not a Status: %s", b)
	}
	return st.Code, st.Reason, st.Message
}

func newFlagSet() *flag.FlagSet { return flag.NewFlagSet("test", flag.ContinueOnError) }

// fanoutFake is a stand-in fanout replica speaking what the real one does:
// sessions (libs/watchsession) on an HTTP/1.1 and h2c port, h serving each
// watch as a GET of its path (built from the stream request) with the
// request's Accept header.
type fanoutFake struct {
	*httptest.Server
	sessions *watchsession.Server
	// served: the watches h served; reqs, the stream requests.
	served atomic.Int64
	mu     sync.Mutex
	reqs   []*heraldv1.WatchStreamRequest
}

// servedAs fails t unless the replica served at least one watch.
func (f *fanoutFake) servedAs(t *testing.T) {
	t.Helper()
	if f.served.Load() == 0 {
		t.Fatal("the replica served no watch")
	}
}

// requests are the stream requests the replica received.
func (f *fanoutFake) requests() []*heraldv1.WatchStreamRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reqs)
}

// Close ends the sessions (frontdoor keeps them open between watches), then
// the server.
func (f *fanoutFake) Close() {
	f.sessions.Close()
	f.Server.Close()
}

// fakeWatch serves a fanoutFake's watches with its handler.
type fakeWatch struct {
	f *fanoutFake
	h http.Handler
}

func (fw fakeWatch) ServeWatch(ctx context.Context, w http.ResponseWriter, req *heraldv1.WatchStreamRequest) {
	fw.f.served.Add(1)
	fw.f.mu.Lock()
	fw.f.reqs = append(fw.f.reqs, req)
	fw.f.mu.Unlock()
	path := "/api/" + req.Version
	if req.Group != "" {
		path = "/apis/" + req.Group + "/" + req.Version
	}
	if req.Namespace != "" {
		path += "/namespaces/" + req.Namespace
	}
	path += "/" + req.Resource
	if req.Name != "" {
		path += "/" + req.Name
	}
	r := httptest.NewRequest(http.MethodGet, path+"?watch=true", nil).WithContext(ctx)
	r.Header.Set("Accept", req.Accept)
	if req.AcceptGzip {
		r.Header.Set("Accept-Encoding", "gzip")
	}
	fw.h.ServeHTTP(w, r)
}

// newFanoutFake starts a fanoutFake.
func newFanoutFake(h http.Handler) *fanoutFake {
	f := &fanoutFake{}
	f.sessions = &watchsession.Server{Handler: fakeWatch{f, h}}
	srv := httptest.NewUnstartedServer(f.sessions)
	srv.Config.RegisterOnShutdown(f.sessions.Shutdown)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	f.Server = srv
	return f
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
