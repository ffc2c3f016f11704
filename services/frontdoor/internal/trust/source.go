// Package trust holds the frontdoor's trust files. The files frontdoor
// reloads are checked every reload-interval (size, mtime, inode:
// service.Reloadable). Two kinds, with opposite rules for a
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
package trust

import (
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"herald.dev/libs/service"
)

// Source is a trust file (or directory) that fails closed on reload.
type Source[T any] struct {
	r *service.Reloadable[T]
	// refused says what is refused while the source is broken, for
	// /readyz ("its tokens are refused").
	refused string
	// broken is why the files on disk give no trust (nil: they loaded).
	broken  atomic.Pointer[error]
	started bool
}

// New loads the source once (an error is a configuration
// error); on later changes a load that fails serves none() instead.
func New[T any](name, refused string, files func() ([]string, error), load func() (*T, error), none func() *T) (*Source[T], error) {
	t := &Source[T]{refused: refused}
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
func (t *Source[T]) Get() *T { return t.r.Get() }

// Name is the source's name ("token file", "client CA", ...).
func (t *Source[T]) Name() string { return t.r.Name() }

// Err is why the source gives no trust, nil when its files loaded.
func (t *Source[T]) Err() error {
	if e := t.broken.Load(); e != nil {
		return *e
	}
	return nil
}

// Check reloads the source when its files changed and reports whether
// they did; a change is logged and counted once, whether it loaded or
// broke the source.
func (t *Source[T]) Check(log *slog.Logger, reloads *prometheus.CounterVec) bool {
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

// File is a trust source whatever it holds.
type File interface {
	Name() string
	Check(*slog.Logger, *prometheus.CounterVec) bool
	Err() error
	RefusedWhileBroken() string
}

func (t *Source[T]) RefusedWhileBroken() string { return t.refused }

// ManifestFiles lists the manifests in dir (not recursive, hidden files and
// Kubernetes' ..data directories skipped), sorted.
func ManifestFiles(dir string) func() ([]string, error) {
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
