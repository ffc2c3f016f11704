package service

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// An internal port admits a peer by the component its certificate names,
// not merely by the CA that signed it: every Herald component (and NATS,
// and etcd) holds a certificate of the internal CA, and the caches' gRPC
// port serves decrypted Secrets. Each port has an allowlist of names
// (ServerTLS.AllowedClientNames: only fanout and frontdoor may read a
// cache, only frontdoor may open fanout's watch port), checked during the
// handshake (tls.Config.VerifyConnection, after the chain was verified
// against the client CA): a refused peer's handshake fails and it gets
// no byte of data. A name matches one of the certificate's DNS names
// (subject alternative names) or its Common Name, exactly: a wildcard in a
// certificate (NATS's *.herald-nats) matches nothing but itself.

// AnyPeer in an allowlist admits every certificate of the client CA.
const AnyPeer = "*"

// RegisterAllowedClientNamesFlag registers prefix.tls.allowed-client-names
// with the port's default allowlist (comma-separated component names).
func (t *ServerTLS) RegisterAllowedClientNamesFlag(prefix, def string, fs *flag.FlagSet) {
	fs.StringVar(&t.AllowedClientNames, prefix+".tls.allowed-client-names", def, "With "+prefix+".tls.cert-file: the peers this port admits, comma-separated, by a DNS name (SAN) or the Common Name of their client certificate; a certificate of the client CA naming none of them is refused at the handshake. \"*\" admits any certificate of the client CA.")
}

func validatePeerNames(prefix, list string) error {
	names := SplitList(list)
	if list != "" && len(names) == 0 {
		return fmt.Errorf("%s.tls.allowed-client-names names no peer", prefix)
	}
	if len(names) > 1 && slices.Contains(names, AnyPeer) {
		return fmt.Errorf("%s.tls.allowed-client-names: %q admits every peer, it cannot be combined with names", prefix, AnyPeer)
	}
	for _, n := range names {
		if strings.ContainsAny(n, " /") {
			return fmt.Errorf("%s.tls.allowed-client-names: %q is not a certificate name", prefix, n)
		}
	}
	return nil
}

// PeerNames are the names a certificate gives its holder: its DNS names,
// then its Common Name.
func PeerNames(c *x509.Certificate) []string {
	names := slices.Clone(c.DNSNames)
	if c.Subject.CommonName != "" {
		names = append(names, c.Subject.CommonName)
	}
	return names
}

// peerCheck is one port's allowlist.
type peerCheck struct {
	port    string
	allowed []string
	log     *slog.Logger
	refused prometheus.Counter

	mu     sync.Mutex
	logged map[[32]byte]struct{} // refused certificates already logged
}

// maxLoggedPeers bounds the refused certificates remembered so that each
// is logged once: past it, the set starts again (a peer may then be logged
// again, never unboundedly remembered).
const maxLoggedPeers = 1024

// verify is the port's tls.Config.VerifyConnection.
func (p *peerCheck) verify(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("no client certificate") // RequireAndVerifyClientCert refused it already
	}
	leaf := cs.PeerCertificates[0]
	names := PeerNames(leaf)
	for _, n := range names {
		if slices.Contains(p.allowed, n) {
			return nil
		}
	}
	p.refused.Inc()
	sum := sha256.Sum256(leaf.Raw)
	p.mu.Lock()
	_, seen := p.logged[sum]
	if !seen {
		if len(p.logged) >= maxLoggedPeers {
			clear(p.logged)
		}
		p.logged[sum] = struct{}{}
	}
	p.mu.Unlock()
	if !seen {
		p.log.Warn("refused a peer whose certificate names no allowed client", "port", p.port,
			"names", names, "allowed", p.allowed, "serial", leaf.SerialNumber.String(), "issuer", leaf.Issuer.String())
	}
	return fmt.Errorf("certificate names %q, none allowed on this port", names)
}

// refusedPeers is herald_tls_refused_peers_total, registered once per
// registry (a process may have several ports).
func refusedPeers(reg prometheus.Registerer) *prometheus.CounterVec {
	cv := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "herald_tls_refused_peers_total",
		Help: "Handshakes refused on an internal port because the client certificate (of the internal CA) names no peer allowed there (--*.tls.allowed-client-names)."},
		[]string{"port"})
	if reg == nil {
		return cv
	}
	if err := reg.Register(cv); err != nil {
		if are, ok := err.(prometheus.AlreadyRegisteredError); ok {
			if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
				return existing
			}
		}
	}
	return cv
}

// PeerConfig is Config with the port's allowlist: the handshake of a peer
// whose certificate names none of AllowedClientNames fails (logged once
// per certificate, counted in herald_tls_refused_peers_total{port} of reg,
// which may be nil). An empty allowlist is an error: the caller registers
// the flag with the port's default.
func (t ServerTLS) PeerConfig(port string, log *slog.Logger, reg prometheus.Registerer) (*tls.Config, error) {
	cfg, err := t.Config(log, nil)
	if err != nil || cfg == nil {
		return cfg, err
	}
	if err := validatePeerNames(port, t.AllowedClientNames); err != nil {
		return nil, err
	}
	allowed := SplitList(t.AllowedClientNames)
	if len(allowed) == 0 {
		return nil, fmt.Errorf("%s.tls.allowed-client-names is empty: the port would admit no peer", port)
	}
	if slices.Equal(allowed, []string{AnyPeer}) {
		return cfg, nil
	}
	p := &peerCheck{port: port, allowed: allowed, log: log, refused: refusedPeers(reg).WithLabelValues(port), logged: map[[32]byte]struct{}{}}
	cfg.VerifyConnection = p.verify
	return cfg, nil
}
