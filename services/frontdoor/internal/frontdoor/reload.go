package frontdoor

import (
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"herald.dev/libs/service"
)

// The files frontdoor reloads are checked every reload-interval (size,
// mtime, inode: service.Reloadable). Two kinds, with opposite rules for a
// change that does not load:
//
//   - the serving certificate keeps the last good one (serving with it is
//     still correct, and a replica without one could serve nothing): a
//     "config-files" warning on /readyz;
//   - the trust sources (token file, client CA, service-account keys, RBAC
//     manifests) fail closed: a file that is deleted or does not load
//     removes that source's trust at once (its tokens, certificates or
//     service-account tokens are refused with 401; RBAC grants nothing, so
//     every request but system:masters' is 403). The previous value may be
//     exactly what the change meant to revoke, so it is never kept. Such a
//     source is logged once per change (not per check), counted,
//     herald_frontdoor_trust_source_broken{what} is 1, and /readyz fails
//     with the source named ("trust-files") until a change loads again.
//
// Only a reload fails closed: at start, a trust file that does not load is
// a configuration error (the replica does not start).

// trustSource is a trust file (or directory) that fails closed on reload.
type trustSource[T any] struct {
	r *service.Reloadable[T]
	// refused says what is refused while the source is broken, for
	// /readyz ("its tokens are refused").
	refused string
	// broken is why the files on disk give no trust (nil: they loaded).
	broken  atomic.Pointer[error]
	started bool
}

// newTrustSource loads the source once (an error is a configuration
// error); on later changes a load that fails serves none() instead.
func newTrustSource[T any](name, refused string, files func() ([]string, error), load func() (*T, error), none func() *T) (*trustSource[T], error) {
	t := &trustSource[T]{refused: refused}
	r, err := service.NewReloadable(name, files, func() (*T, error) {
		v, err := load()
		switch {
		case err == nil:
			t.broken.Store(nil)
			return v, nil
		case !t.started:
			return nil, err
		}
		t.broken.Store(&err)
		return none(), nil
	})
	if err != nil {
		return nil, err
	}
	t.r, t.started = r, true
	return t, nil
}

// Get returns what the source trusts now (nothing while it is broken).
func (t *trustSource[T]) Get() *T { return t.r.Get() }

// Name is the source's name ("token file", "client CA", ...).
func (t *trustSource[T]) Name() string { return t.r.Name() }

// Err is why the source gives no trust, nil when its files loaded.
func (t *trustSource[T]) Err() error {
	if e := t.broken.Load(); e != nil {
		return *e
	}
	return nil
}

// Check reloads the source when its files changed and reports whether
// they did; a change is logged and counted once, whether it loaded or
// broke the source.
func (t *trustSource[T]) Check(log *slog.Logger, reloads *prometheus.CounterVec) bool {
	if !t.r.Check(slog.New(slog.DiscardHandler), nil) {
		return false // unchanged (the inner load never fails once started)
	}
	result := "success"
	if err := t.Err(); err != nil {
		result = "error"
		log.Error("reload failed; its trust is removed until it loads", "what", t.Name(), "refused", t.refused, "err", err)
	} else {
		log.Info("reloaded", "what", t.Name())
	}
	if reloads != nil {
		reloads.WithLabelValues(t.Name(), result).Inc()
	}
	return true
}

// trustFile is a trust source whatever it holds.
type trustFile interface {
	Name() string
	Check(*slog.Logger, *prometheus.CounterVec) bool
	Err() error
	refusedWhileBroken() string
}

func (t *trustSource[T]) refusedWhileBroken() string { return t.refused }

// trustSources are the server's trust files and their gauges.
type trustSources struct {
	files  []trustFile
	broken *prometheus.GaugeVec
}

// loadTrust loads the trust files cfg names into a (tokens, client CA,
// service-account keys) and s.rbac, and adds their reload checks to s.
func (s *Server) loadTrust(cfg Config, a *authenticator, reg prometheus.Registerer) error {
	s.trust = &trustSources{broken: promauto.With(reg).NewGaugeVec(prometheus.GaugeOpts{Name: "herald_frontdoor_trust_source_broken",
		Help: "1 while a trust file (token file, client CA, service account keys, rbac) is deleted or does not load: its trust is removed (tokens, certificates, service-account tokens refused; RBAC grants nothing) until it loads."}, []string{"what"})}
	var err error
	if cfg.TokenFile != "" {
		if a.tokens, err = newTrustSource("token file", "its tokens are refused", service.StaticFiles(cfg.TokenFile),
			func() (*tokenFile, error) { return loadTokens(cfg.TokenFile) },
			func() *tokenFile { return &tokenFile{users: map[[32]byte]User{}} }); err != nil {
			return err
		}
		s.addTrust(a.tokens)
	}
	if cfg.ClientCAFile != "" {
		if a.clientCAs, err = newTrustSource("client CA", "no client certificate is accepted", service.StaticFiles(cfg.ClientCAFile),
			func() (*x509.CertPool, error) { return loadCertPool(cfg.ClientCAFile) }, x509.NewCertPool); err != nil {
			return err
		}
		s.addTrust(a.clientCAs)
	}
	if keys := service.SplitList(cfg.SAKeyFiles); len(keys) > 0 {
		if a.saKeys, err = newTrustSource("service account keys", "no service-account token is accepted", service.StaticFiles(keys...),
			func() (*saKeySet, error) { return loadSAKeys(keys) },
			func() *saKeySet { return &saKeySet{} }); err != nil {
			return err
		}
		s.addTrust(a.saKeys)
	}
	if cfg.AuthorizationDir != "" {
		files := manifestFiles(cfg.AuthorizationDir)
		if s.rbac, err = newTrustSource("rbac", "RBAC grants nothing (only system:masters is allowed)", files,
			func() (*policy, error) {
				paths, err := files()
				if err != nil {
					return nil, fmt.Errorf("rbac: %w", err)
				}
				return loadPolicy(paths)
			}, emptyPolicy); err != nil {
			return err
		}
		s.addTrust(s.rbac)
	}
	return nil
}

// addTrust adds f's reload check: the config gauges as for any file, and
// herald_frontdoor_trust_source_broken.
func (s *Server) addTrust(f trustFile) {
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
			errs = append(errs, fmt.Errorf("%s: %w: %s", f.Name(), err, f.refusedWhileBroken()))
		}
	}
	return errors.Join(errs...)
}

// manifestFiles lists the manifests in dir (not recursive, hidden files and
// Kubernetes' ..data directories skipped), sorted.
func manifestFiles(dir string) func() ([]string, error) {
	return func() ([]string, error) {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return nil, err
		}
		var out []string
		for _, e := range ents {
			n := e.Name()
			if strings.HasPrefix(n, ".") {
				continue
			}
			switch strings.ToLower(filepath.Ext(n)) {
			case ".yaml", ".yml", ".json":
				out = append(out, filepath.Join(dir, n))
			}
		}
		sort.Strings(out)
		return out, nil
	}
}
