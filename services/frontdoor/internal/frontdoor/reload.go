package frontdoor

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// reloadable holds what was loaded from some files (certificates, tokens,
// keys, RBAC manifests) and reloads it when one of them changes.
//
// Invariants: readers always see a complete, validated value (an atomic
// pointer swap); a change that fails to load keeps the previous value, is
// logged and counted, and is retried only when the files change again.
// Files are polled (size, mtime, inode): no inotify, which misses the
// symlink swaps Kubernetes uses for mounted Secrets and ConfigMaps.
type reloadable[T any] struct {
	name  string
	files func() ([]string, error)
	load  func() (*T, error)
	cur   atomic.Pointer[T]

	mu  sync.Mutex // serialises checks
	sig string
}

// newReloadable loads the value once; an error here is a configuration
// error (the process must not start).
func newReloadable[T any](name string, files func() ([]string, error), load func() (*T, error)) (*reloadable[T], error) {
	r := &reloadable[T]{name: name, files: files, load: load}
	r.sig = r.signature()
	v, err := load()
	if err != nil {
		return nil, err
	}
	r.cur.Store(v)
	return r, nil
}

// staticFiles is a files func for a fixed list of paths.
func staticFiles(paths ...string) func() ([]string, error) {
	return func() ([]string, error) { return paths, nil }
}

// Get returns the current value.
func (r *reloadable[T]) Get() *T { return r.cur.Load() }

// signature summarises the files' identities; any change triggers a reload.
// A file that cannot be read changes the signature too, so that its
// return is noticed.
func (r *reloadable[T]) signature() string {
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

// check reloads when the files changed; it reports whether it did.
func (r *reloadable[T]) check(log *slog.Logger, reloads *prometheus.CounterVec) bool {
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
		return false
	}
	r.cur.Store(v)
	if reloads != nil {
		reloads.WithLabelValues(r.name, "success").Inc()
	}
	log.Info("reloaded", "what", r.name)
	return true
}

// watchFiles polls every checker until ctx ends.
func watchFiles(ctx context.Context, every time.Duration, checks ...func() bool) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			for _, c := range checks {
				c()
			}
		}
	}
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

func inode(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}
