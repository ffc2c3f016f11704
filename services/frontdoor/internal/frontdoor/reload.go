package frontdoor

import (
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"herald.dev/libs/service"
	"herald.dev/services/frontdoor/internal/authn"
	"herald.dev/services/frontdoor/internal/authz"
	"herald.dev/services/frontdoor/internal/trust"
)

// The trust files (tokens, client CA, service-account keys, RBAC) fail
// closed on reload (trust.Source); the serving certificate keeps its last
// good one.

// trustSources are the server's trust files and their gauges.
type trustSources struct {
	files  []trust.File
	broken *prometheus.GaugeVec
}

// loadTrust loads the trust files cfg names into a (tokens, client CA,
// service-account keys) and s.rbac, and adds their reload checks to s.
func (s *Server) loadTrust(cfg Config, a *authn.Authenticator, reg prometheus.Registerer) error {
	s.trust = &trustSources{broken: promauto.With(reg).NewGaugeVec(prometheus.GaugeOpts{Name: "herald_frontdoor_trust_source_broken",
		Help: "1 while a trust file (token file, client CA, service account keys, rbac) is deleted or does not load: its trust is removed (tokens, certificates, service-account tokens refused; RBAC grants nothing) until it loads."}, []string{"what"})}
	var err error
	if cfg.TokenFile != "" {
		if a.Tokens, err = trust.New("token file", "its tokens are refused", service.StaticFiles(cfg.TokenFile),
			func() (*authn.TokenFile, error) { return authn.LoadTokens(cfg.TokenFile) },
			func() *authn.TokenFile { return authn.NoTokens() }); err != nil {
			return err
		}
		s.addTrust(a.Tokens)
	}
	if cfg.ClientCAFile != "" {
		if a.ClientCAs, err = trust.New("client CA", "no client certificate is accepted", service.StaticFiles(cfg.ClientCAFile),
			func() (*x509.CertPool, error) { return authn.LoadCertPool(cfg.ClientCAFile) }, x509.NewCertPool); err != nil {
			return err
		}
		s.addTrust(a.ClientCAs)
	}
	if keys := service.SplitList(cfg.SAKeyFiles); len(keys) > 0 {
		if a.SAKeys, err = trust.New("service account keys", "no service-account token is accepted", service.StaticFiles(keys...),
			func() (*authn.SAKeySet, error) { return authn.LoadSAKeys(keys) },
			func() *authn.SAKeySet { return &authn.SAKeySet{} }); err != nil {
			return err
		}
		s.addTrust(a.SAKeys)
	}
	if cfg.AuthorizationDir != "" {
		files := trust.ManifestFiles(cfg.AuthorizationDir)
		if s.rbac, err = trust.New("rbac", "RBAC grants nothing (only system:masters is allowed)", files,
			func() (*authz.Policy, error) {
				paths, err := files()
				if err != nil {
					return nil, fmt.Errorf("rbac: %w", err)
				}
				return authz.LoadPolicy(paths)
			}, authz.EmptyPolicy); err != nil {
			return err
		}
		s.addTrust(s.rbac)
	}
	return nil
}

// addTrust adds f's reload check: the config gauges as for any file, and
// herald_frontdoor_trust_source_broken.
func (s *Server) addTrust(f trust.File) {
	s.trust.files = append(s.trust.files, f)
	ok := s.m.reloadOK.WithLabelValues(f.Name())
	broken := s.trust.broken.WithLabelValues(f.Name())
	ok.Set(1)
	broken.Set(0)
	s.checks = append(s.checks, func() bool {
		changed := f.Check(s.log, s.m.reloads)
		if f.Err() != nil {
			ok.Set(0)
			broken.Set(1)
		} else {
			ok.Set(1)
			broken.Set(0)
		}
		return changed
	})
}

// TrustErrors names the trust files that are deleted or do not load, and
// what is refused because of it: a readiness check ("trust-files"). The
// replica keeps serving what its other sources vouch for.
func (s *Server) TrustErrors() error {
	if s.trust == nil {
		return nil
	}
	var errs []error
	for _, f := range s.trust.files {
		if err := f.Err(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w: %s", f.Name(), err, f.RefusedWhileBroken()))
		}
	}
	return errors.Join(errs...)
}
