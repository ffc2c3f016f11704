package service

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// ServerTLS is the server side of mutual TLS on an internal port (the
// cache's gRPC, fanout's HTTP): only peers holding a certificate from the
// internal CA that names a component allowed on the port (frontdoor,
// fanout; AllowedClientNames, peers.go) may connect, which is what lets a
// service trust the identity headers frontdoor sends. The serving
// certificate is re-read when its files change.
//
// Invariant: TLS on means mutual TLS. A serving certificate without a client
// CA is a configuration error, never a server that encrypts but serves
// anyone: an operator who set up TLS expects the port to be closed to
// anonymous peers, and the identity headers to be trustworthy.
type ServerTLS struct {
	CertFile, KeyFile, ClientCAFile string
	// AllowedClientNames (comma-separated) are the peers the port admits,
	// by a name their certificate carries (peers.go); "*": any certificate
	// of the client CA. Registered by RegisterAllowedClientNamesFlag.
	AllowedClientNames string
}

// RegisterFlagsWithPrefix registers prefix.tls.cert-file,
// prefix.tls.key-file and prefix.tls.client-ca-file.
func (t *ServerTLS) RegisterFlagsWithPrefix(prefix string, fs *flag.FlagSet) {
	fs.StringVar(&t.CertFile, prefix+".tls.cert-file", "", "Serving certificate (PEM) of the "+prefix+" server; empty: plaintext (loopback or a trusted network only).")
	fs.StringVar(&t.KeyFile, prefix+".tls.key-file", "", "Key of "+prefix+".tls.cert-file.")
	fs.StringVar(&t.ClientCAFile, prefix+".tls.client-ca-file", "", "CA bundle (PEM) client certificates must chain to; required with "+prefix+".tls.cert-file: clients without such a certificate are refused (mutual TLS).")
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
	if t.CertFile != "" && t.ClientCAFile == "" {
		return fmt.Errorf("%s.tls.client-ca-file is required with %s.tls.cert-file: without it the port would serve anonymous peers", prefix, prefix)
	}
	return validatePeerNames(prefix, t.AllowedClientNames)
}

// Config builds the server's TLS configuration; nil when TLS is off. The
// certificate is re-read on a handshake when its files changed (internal
// peers connect rarely and hold their connections); reloads (may be nil)
// counts the reloads.
func (t ServerTLS) Config(log *slog.Logger, reloads *prometheus.CounterVec) (*tls.Config, error) {
	if !t.Enabled() {
		return nil, nil
	}
	if t.ClientCAFile == "" {
		return nil, errors.New("a serving certificate without a client CA would serve anonymous peers")
	}
	crt, err := LoadKeyPair("serving certificate", t.CertFile, t.KeyFile)
	if err != nil {
		return nil, err
	}
	pool, err := LoadCertPool(t.ClientCAFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			crt.Check(log, reloads)
			return crt.Get(), nil
		}}, nil
}

// ClientTLS is the client side of mutual TLS to an internal service (the
// cache over gRPC, fanout over HTTPS). Empty files mean plaintext (the
// service is reached over loopback or a trusted network); frontdoor still
// tells it who the user is in headers.
type ClientTLS struct {
	CertFile, KeyFile, CAFile, ServerName string
}

// RegisterFlagsWithPrefix registers prefix.tls.cert-file,
// prefix.tls.key-file and prefix.tls.ca-file; what names the service in the
// flags' help.
func (t *ClientTLS) RegisterFlagsWithPrefix(prefix, what string, fs *flag.FlagSet) {
	fs.StringVar(&t.CertFile, prefix+".tls.cert-file", "", "Client certificate (PEM) presented to "+what+" (mutual TLS).")
	fs.StringVar(&t.KeyFile, prefix+".tls.key-file", "", "Key of "+prefix+".tls.cert-file.")
	fs.StringVar(&t.CAFile, prefix+".tls.ca-file", "", "CA bundle (PEM) that signed "+what+"'s serving certificate; set to use TLS.")
}

// RegisterServerNameFlag registers prefix.tls.server-name, for clients that
// reach the service by an address its certificate does not name.
func (t *ClientTLS) RegisterServerNameFlag(prefix, what string, fs *flag.FlagSet) {
	fs.StringVar(&t.ServerName, prefix+".tls.server-name", "", "Name to verify in "+what+"'s certificate (default: the host dialled).")
}

// Enabled says whether TLS is configured.
func (t ClientTLS) Enabled() bool { return t.CAFile != "" || t.CertFile != "" }

// Validate reports incomplete settings.
func (t ClientTLS) Validate(prefix string) error {
	if (t.CertFile == "") != (t.KeyFile == "") {
		return fmt.Errorf("%s.tls.cert-file and %s.tls.key-file go together", prefix, prefix)
	}
	if t.CertFile != "" && t.CAFile == "" {
		return fmt.Errorf("%s.tls.ca-file is required with %s.tls.cert-file", prefix, prefix)
	}
	return nil
}

// Config builds the client's TLS configuration; nil when TLS is off. The
// client certificate is re-read on a handshake when its files changed: a
// handshake is rare next to the calls and watches a connection carries.
// reloads (may be nil) counts the reloads.
func (t ClientTLS) Config(log *slog.Logger, reloads *prometheus.CounterVec) (*tls.Config, error) {
	if !t.Enabled() {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		pool, err := LoadCertPool(t.CAFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	if t.CertFile != "" {
		crt, err := LoadKeyPair("client certificate", t.CertFile, t.KeyFile)
		if err != nil {
			return nil, err
		}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			crt.Check(log, reloads)
			return crt.Get(), nil
		}
	}
	return cfg, nil
}

// GRPCCredentials are the transport credentials of a gRPC client:
// plaintext when TLS is off.
func (t ClientTLS) GRPCCredentials(log *slog.Logger, reloads *prometheus.CounterVec) (credentials.TransportCredentials, error) {
	tc, err := t.Config(log, reloads)
	if err != nil || tc == nil {
		return insecure.NewCredentials(), err
	}
	return credentials.NewTLS(tc), nil
}

// LoadCertPool reads a PEM bundle of CA certificates.
func LoadCertPool(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: no PEM certificates", file)
	}
	return pool, nil
}
