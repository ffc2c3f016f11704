package service

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"log/slog"
	"math/big"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// issueNamed writes a client certificate with Common Name cn and DNS names
// dns to dir/name.crt and dir/name.key.
func (ca *testCA) issueNamed(t *testing.T, dir, name, cn string, dns []string, serial int64) (certFile, keyFile string) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn}, DNSNames: dns,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		KeyUsage:    x509.KeyUsageDigitalSignature, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", kb)
	return certFile, keyFile
}

// syncBuffer is a log destination the TLS server's goroutines write to.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func counterValue(t *testing.T, reg *prometheus.Registry, name, port string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "port" && l.GetValue() == port {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// An internal port's allowlist: a certificate of the client CA is admitted
// only if it names an allowed peer (by DNS name or Common Name); the others
// fail the handshake, are counted each time and logged once.
func TestPeerAllowlist(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir)
	srvCert, srvKey := ca.issue(t, dir, "server", "herald-cache", 2)
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	reg := prometheus.NewRegistry()
	server := ServerTLS{CertFile: srvCert, KeyFile: srvKey, ClientCAFile: ca.file, AllowedClientNames: "herald-fanout, herald-frontdoor"}
	if err := server.Validate("grpc"); err != nil {
		t.Fatal(err)
	}
	sc, err := server.PeerConfig("grpc", log, reg)
	if err != nil {
		t.Fatal(err)
	}
	serial := int64(100)
	client := func(name, cn string, dns ...string) *tls.Config {
		serial++
		crt, key := ca.issueNamed(t, dir, name, cn, dns, serial)
		cc, err := ClientTLS{CertFile: crt, KeyFile: key, CAFile: ca.file, ServerName: "localhost"}.Config(log, nil)
		if err != nil {
			t.Fatal(err)
		}
		return cc
	}
	admitted := func(cc *tls.Config) bool {
		_, seen, err := handshake(t, sc, cc)
		return err == nil && seen != ""
	}
	frontdoor := client("frontdoor", "herald-frontdoor")
	fanoutBySAN := client("fanout", "fanout-7f9c", "herald-fanout")
	nats := client("nats", "herald-nats", "*.herald-nats", "herald-nats-0.herald-nats")
	wildcard := client("wild", "x", "*")
	if !admitted(frontdoor) {
		t.Error("frontdoor's certificate (Common Name) was refused")
	}
	if !admitted(fanoutBySAN) {
		t.Error("fanout's certificate (DNS name) was refused")
	}
	for i := range 3 {
		if admitted(nats) {
			t.Fatalf("attempt %d: NATS's certificate, of the same CA, was admitted", i)
		}
	}
	if admitted(wildcard) {
		t.Error("a certificate naming \"*\" was admitted")
	}
	if n := counterValue(t, reg, "herald_tls_refused_peers_total", "grpc"); n != 4 {
		t.Errorf("refused peers counted: %v, want 4", n)
	}
	if n := strings.Count(logs.String(), "refused a peer"); n != 2 {
		t.Errorf("refusals logged %d times, want once per certificate (2):\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "herald-nats-0.herald-nats") {
		t.Errorf("the refusal does not name the peer:\n%s", logs.String())
	}

	// "*": any certificate of the client CA (the behaviour without an
	// allowlist), a second port on the same registry.
	anyPeer := server
	anyPeer.AllowedClientNames = AnyPeer
	ac, err := anyPeer.PeerConfig("http", log, reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, seen, err := handshake(t, ac, nats); err != nil || seen != "herald-nats" {
		t.Errorf("allowed-client-names=*: NATS's certificate: %q %v", seen, err)
	}

	for _, bad := range []string{"herald-fanout,*", " , ", "herald fanout"} {
		s := server
		s.AllowedClientNames = bad
		if err := s.Validate("grpc"); err == nil {
			t.Errorf("allowed-client-names=%q accepted", bad)
		}
	}
	empty := server
	empty.AllowedClientNames = ""
	if _, err := empty.PeerConfig("grpc", log, nil); err == nil || !strings.Contains(err.Error(), "grpc.tls.allowed-client-names") {
		t.Errorf("an empty allowlist: %v", err)
	}
}
