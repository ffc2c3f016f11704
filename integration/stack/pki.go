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
	}
	if b, err := os.ReadFile(p.CAFile); err == nil {
		if _, err := os.Stat(p.ClientKeyFile); err == nil {
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
	issue := func(serial int64, cn string, usage x509.ExtKeyUsage, certFile, keyFile string) error {
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
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
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
	if err := errors.Join(
		os.WriteFile(p.CAFile, p.CAPEM, 0o644),
		issue(2, "frontdoor", x509.ExtKeyUsageServerAuth, p.CertFile, p.KeyFile),
		issue(3, "herald-internal", x509.ExtKeyUsageServerAuth, p.InternalCertFile, p.InternalKeyFile),
		issue(4, "herald-internal-client", x509.ExtKeyUsageClientAuth, p.ClientCertFile, p.ClientKeyFile),
	); err != nil {
		return nil, fmt.Errorf("writing certificates: %w", err)
	}
	return p, nil
}
