package service

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
)

// ServerTLS is the server side of mutual TLS on an internal port (the
// cache's gRPC, fanout's HTTP): only peers holding a certificate from the
// internal CA (frontdoor, fanout) may connect, which is what lets a service
// trust the identity headers frontdoor sends.
type ServerTLS struct {
	CertFile, KeyFile, ClientCAFile string
}

// RegisterFlags registers prefix.tls.cert-file, prefix.tls.key-file and
// prefix.tls.client-ca-file.
func (t *ServerTLS) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&t.CertFile, prefix+".tls.cert-file", "", "Serving certificate (PEM) of the "+prefix+" server; empty: plaintext (loopback or a trusted network only).")
	fs.StringVar(&t.KeyFile, prefix+".tls.key-file", "", "Key of "+prefix+".tls.cert-file.")
	fs.StringVar(&t.ClientCAFile, prefix+".tls.client-ca-file", "", "CA bundle (PEM) client certificates must chain to; set, clients without one are refused (mutual TLS).")
}

// Enabled says whether TLS is configured.
func (t ServerTLS) Enabled() bool { return t.CertFile != "" }

// Validate reports incomplete settings.
func (t ServerTLS) Validate(prefix string) error {
	if (t.CertFile == "") != (t.KeyFile == "") {
		return fmt.Errorf("%s.tls.cert-file and %s.tls.key-file go together", prefix, prefix)
	}
	if t.ClientCAFile != "" && t.CertFile == "" {
		return errors.New(prefix + ".tls.client-ca-file needs " + prefix + ".tls.cert-file")
	}
	return nil
}

// Config builds the server's TLS configuration.
func (t ServerTLS) Config() (*tls.Config, error) {
	crt, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{crt}}
	if t.ClientCAFile != "" {
		b, err := os.ReadFile(t.ClientCAFile)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("%s: no PEM certificates", t.ClientCAFile)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// ClientTLS is the client side of mutual TLS to an internal service.
type ClientTLS struct {
	CertFile, KeyFile, CAFile string
}

// RegisterFlags registers prefix.tls.cert-file, prefix.tls.key-file and
// prefix.tls.ca-file.
func (t *ClientTLS) RegisterFlags(fs *flag.FlagSet, prefix, what string) {
	fs.StringVar(&t.CertFile, prefix+".tls.cert-file", "", "Client certificate (PEM) presented to "+what+" (mutual TLS).")
	fs.StringVar(&t.KeyFile, prefix+".tls.key-file", "", "Key of "+prefix+".tls.cert-file.")
	fs.StringVar(&t.CAFile, prefix+".tls.ca-file", "", "CA bundle (PEM) that signed "+what+"'s serving certificate; set to use TLS.")
}

// Config builds the client's TLS configuration; nil when TLS is off.
func (t ClientTLS) Config() (*tls.Config, error) {
	if t.CAFile == "" {
		return nil, nil
	}
	b, err := os.ReadFile(t.CAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: no PEM certificates", t.CAFile)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	if t.CertFile != "" {
		crt, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{crt}
	}
	return cfg, nil
}
