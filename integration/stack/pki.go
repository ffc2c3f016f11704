package stack

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// PKI is the development certificate authority and the frontdoor's serving
// certificate, kept in a directory so that a restarted stack keeps them.
type PKI struct {
	CAFile, CertFile, KeyFile string
	CAPEM                     []byte
	// Internal hops (mutual TLS): the caches' and fanouts' serving
	// certificate, and the client certificate frontdoor and fanout present.
	InternalCertFile, InternalKeyFile string
	ClientCertFile, ClientKeyFile     string
	dir                               string
}

// Components are the names of the certificates EnsurePKI issues one per
// Herald component, as the prod overlay's certificates name them
// (deploy/k8s/overlays/prod/certificates.yaml): each is for server and
// client auth and names the component (DNS name and Common Name),
// localhost and the loopback addresses. The internal ports' allowlists
// (--grpc.tls.allowed-client-names, --http.tls.allowed-client-names) and
// NATS's verify_and_map read that name.
var Components = []string{"herald-ingest", "herald-cache", "herald-fanout", "herald-frontdoor", "herald-nats", "herald-etcd"}

// Component returns the certificate and key files of a component's
// certificate (one of Components).
func (p *PKI) Component(name string) (certFile, keyFile string) {
	return filepath.Join(p.dir, name+".crt"), filepath.Join(p.dir, name+".key")
}

// EnsurePKI loads the CA and serving certificate from dir, creating them if
// missing.
func EnsurePKI(dir string) (*PKI, error) {
	p := &PKI{
		CAFile:           filepath.Join(dir, "ca.crt"),
		CertFile:         filepath.Join(dir, "frontdoor.crt"),
		KeyFile:          filepath.Join(dir, "frontdoor.key"),
		InternalCertFile: filepath.Join(dir, "internal.crt"),
		InternalKeyFile:  filepath.Join(dir, "internal.key"),
		ClientCertFile:   filepath.Join(dir, "internal-client.crt"),
		ClientKeyFile:    filepath.Join(dir, "internal-client.key"),
		dir:              dir,
	}
	_, lastKey := p.Component(Components[len(Components)-1])
	if b, err := os.ReadFile(p.CAFile); err == nil {
		if _, err := os.Stat(lastKey); err == nil {
			p.CAPEM = b
			return p, nil
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "herald-dev-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	issue := func(serial int64, cn string, usage []x509.ExtKeyUsage, certFile, keyFile string) error {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: cn},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(5 * 365 * 24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  usage,
			DNSNames:     []string{"localhost", cn},
			IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			return err
		}
		keyDER, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			return err
		}
		return errors.Join(
			os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644),
			os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600),
		)
	}
	p.CAPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	server, client := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	errs := []error{
		os.WriteFile(p.CAFile, p.CAPEM, 0o644),
		issue(2, "frontdoor", server, p.CertFile, p.KeyFile),
		issue(3, "herald-internal", server, p.InternalCertFile, p.InternalKeyFile),
		issue(4, "herald-internal-client", client, p.ClientCertFile, p.ClientKeyFile),
	}
	for i, name := range Components {
		crt, key := p.Component(name)
		errs = append(errs, issue(int64(10+i), name, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, crt, key))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("writing certificates: %w", err)
	}
	return p, nil
}
