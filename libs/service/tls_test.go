package service

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testCA issues certificates for the tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string
}

func newTestCA(t *testing.T, dir string) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &testCA{cert: cert, key: key, file: filepath.Join(dir, "ca.crt")}
	writePEM(t, ca.file, "CERTIFICATE", der)
	return ca
}

// issue writes a key pair for cn (a server for localhost and 127.0.0.1,
// and a client) to dir/name.crt and dir/name.key.
func (ca *testCA) issue(t *testing.T, dir, name, cn string, serial int64) (certFile, keyFile string) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
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

// writePEM replaces path atomically (a rename, as Kubernetes swaps mounted
// Secrets), so that a reload never reads half a file.
func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// handshake connects a client with cc to a server with sc and returns the
// common names each side saw of the other.
func handshake(t *testing.T, sc, cc *tls.Config) (serverCN, clientCN string, err error) {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", sc)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	seen := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			seen <- ""
			return
		}
		defer c.Close()
		tc := c.(*tls.Conn)
		if tc.Handshake() != nil || len(tc.ConnectionState().PeerCertificates) == 0 {
			seen <- ""
			return
		}
		seen <- tc.ConnectionState().PeerCertificates[0].Subject.CommonName
		io.Copy(io.Discard, c)
	}()
	c, err := tls.Dial("tcp", ln.Addr().String(), cc)
	if err != nil {
		<-seen
		return "", "", err
	}
	serverCN = c.ConnectionState().PeerCertificates[0].Subject.CommonName
	// TLS 1.3: the server verifies the client's certificate after the
	// client's handshake returns; a round trip makes it finish.
	c.Write([]byte("x"))
	clientCN = <-seen
	c.Close()
	return serverCN, clientCN, nil
}

// Mutual TLS between ServerTLS and ClientTLS, and both certificates
// reloaded once their files change.
func TestMutualTLSWithReload(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir)
	srvCert, srvKey := ca.issue(t, dir, "server", "server-1", 2)
	cliCert, cliKey := ca.issue(t, dir, "client", "client-1", 3)
	log := slog.New(slog.DiscardHandler)

	server := ServerTLS{CertFile: srvCert, KeyFile: srvKey, ClientCAFile: ca.file}
	client := ClientTLS{CertFile: cliCert, KeyFile: cliKey, CAFile: ca.file, ServerName: "localhost"}
	if err := server.Validate("grpc"); err != nil {
		t.Fatal(err)
	}
	if err := client.Validate("cache"); err != nil {
		t.Fatal(err)
	}
	sc, err := server.Config(log, nil)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := client.Config(log, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, c, err := handshake(t, sc, cc)
	if err != nil || s != "server-1" || c != "client-1" {
		t.Fatalf("handshake: server %q client %q err %v", s, c, err)
	}

	ca.issue(t, dir, "server", "server-2", 4)
	ca.issue(t, dir, "client", "client-2", 5)
	s, c, err = handshake(t, sc, cc)
	if err != nil || s != "server-2" || c != "client-2" {
		t.Fatalf("after the files changed: server %q client %q err %v", s, c, err)
	}

	// A client without a certificate is refused.
	anon, err := ClientTLS{CAFile: ca.file, ServerName: "localhost"}.Config(log, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, c, err := handshake(t, sc, anon); err == nil && c != "" {
		t.Errorf("a client without a certificate was accepted as %q", c)
	}
}

func TestTLSOffAndValidation(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	if tc, err := (ClientTLS{}).Config(log, nil); tc != nil || err != nil {
		t.Errorf("client TLS off: %v %v", tc, err)
	}
	if tc, err := (ServerTLS{}).Config(log, nil); tc != nil || err != nil {
		t.Errorf("server TLS off: %v %v", tc, err)
	}
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"client cert without key", ClientTLS{CertFile: "c", CAFile: "ca"}.Validate("cache")},
		{"client cert without CA", ClientTLS{CertFile: "c", KeyFile: "k"}.Validate("cache")},
		{"server key without cert", ServerTLS{KeyFile: "k"}.Validate("grpc")},
		{"server client CA without cert", ServerTLS{ClientCAFile: "ca"}.Validate("grpc")},
		{"server cert without client CA", ServerTLS{CertFile: "c", KeyFile: "k"}.Validate("grpc")},
	} {
		if tc.err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	// TLS without client certificates would serve anonymous peers as
	// trusted internal ones: refused, with the flag to set.
	err := ServerTLS{CertFile: "c", KeyFile: "k"}.Validate("http")
	if err == nil || !strings.Contains(err.Error(), "http.tls.client-ca-file is required with http.tls.cert-file") {
		t.Errorf("server cert without client CA: %v", err)
	}
	dir := t.TempDir()
	crt, key := newTestCA(t, dir).issue(t, dir, "server", "server", 2)
	if tc, err := (ServerTLS{CertFile: crt, KeyFile: key}).Config(log, nil); tc != nil || err == nil {
		t.Errorf("Config built a server TLS configuration without a client CA: %v %v", tc, err)
	}
	if _, err := (ClientTLS{CAFile: filepath.Join(t.TempDir(), "missing")}).Config(log, nil); err == nil {
		t.Error("a missing CA file was accepted")
	}
}
