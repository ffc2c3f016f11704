package service

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Reloadable holds what was loaded from some files (certificates, tokens,
// keys, RBAC manifests) and reloads it when one of them changes.
//
// Invariants: readers always see a complete, validated value (an atomic
// pointer swap); a change that fails to load keeps the previous value, is
// logged once and counted, is reported by Err until a later change loads,
// and is retried only when the files change again.
// Files are polled (size, mtime, inode): no inotify, which misses the
// symlink swaps Kubernetes uses for mounted Secrets and ConfigMaps.
type Reloadable[T any] struct {
	name  string
	files func() ([]string, error)
	load  func() (*T, error)
	cur   atomic.Pointer[T]

	mu      sync.Mutex // serialises checks
	sig     string
	failing atomic.Pointer[error] // the last load's error; nil once one succeeds
}

// NewReloadable loads the value once; an error here is a configuration
// error (the process must not start). files lists the files the value is
// read from (it is called again on every check: a directory's contents may
// change).
func NewReloadable[T any](name string, files func() ([]string, error), load func() (*T, error)) (*Reloadable[T], error) {
	r := &Reloadable[T]{name: name, files: files, load: load}
	r.sig = r.signature()
	v, err := load()
	if err != nil {
		return nil, err
	}
	r.cur.Store(v)
	return r, nil
}

// StaticFiles is a files func for a fixed list of paths.
func StaticFiles(paths ...string) func() ([]string, error) {
	return func() ([]string, error) { return paths, nil }
}

// LoadKeyPair loads a certificate and its key, reloaded when either file
// changes.
func LoadKeyPair(name, certFile, keyFile string) (*Reloadable[tls.Certificate], error) {
	return NewReloadable(name, StaticFiles(certFile, keyFile), func() (*tls.Certificate, error) {
		crt, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		return &crt, nil
	})
}

// Get returns the current value.
func (r *Reloadable[T]) Get() *T { return r.cur.Load() }

// Name is what the value is (the name given to NewReloadable).
func (r *Reloadable[T]) Name() string { return r.name }

// Err is the error of the last reload when it failed: the files on disk are
// not what is served (Get returns the last value that loaded). Nil once a
// later change loads.
func (r *Reloadable[T]) Err() error {
	if e := r.failing.Load(); e != nil {
		return *e
	}
	return nil
}

// signature summarises the files' identities; any change triggers a reload.
// A file that cannot be read changes the signature too, so that its
// return is noticed.
func (r *Reloadable[T]) signature() string {
	paths, err := r.files()
	if err != nil {
		return "error: " + err.Error()
	}
	var b strings.Builder
	for _, p := range paths {
		// Stat follows symlinks: a swapped ..data link changes the target.
		fi, err := os.Stat(p)
		if err != nil {
			fmt.Fprintf(&b, "%s:missing;", p)
			continue
		}
		fmt.Fprintf(&b, "%s:%d:%d:%v;", p, fi.Size(), fi.ModTime().UnixNano(), inode(fi))
	}
	return b.String()
}

// Check reloads when the files changed; it reports whether it did. reloads
// (may be nil) counts reloads by what and result (success, error).
func (r *Reloadable[T]) Check(log *slog.Logger, reloads *prometheus.CounterVec) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	sig := r.signature()
	if sig == r.sig {
		return false
	}
	r.sig = sig
	v, err := r.load()
	if err != nil {
		if reloads != nil {
			reloads.WithLabelValues(r.name, "error").Inc()
		}
		log.Error("reload failed; keeping the previous configuration", "what", r.name, "err", err)
		r.failing.Store(&err)
		return false
	}
	r.cur.Store(v)
	r.failing.Store(nil)
	if reloads != nil {
		reloads.WithLabelValues(r.name, "success").Inc()
	}
	log.Info("reloaded", "what", r.name)
	return true
}

// WatchFiles polls every checker until ctx ends.
func WatchFiles(ctx context.Context, every time.Duration, checks ...func() bool) {
	Every(ctx, every, func() {
		for _, c := range checks {
			c()
		}
	})
}

// Every calls f every period until ctx ends (the first call after one
// period).
func Every(ctx context.Context, period time.Duration, f func()) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}

func inode(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}
