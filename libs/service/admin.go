package service

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Admin is a process's operational HTTP server.
type Admin struct {
	Registry *prometheus.Registry

	mu      sync.Mutex
	checks  map[string]func() error
	details map[string]func() error
	mux     *http.ServeMux
	srv     *http.Server
	ln      net.Listener
}

// NewAdmin creates the admin server's registry (with Go and process
// collectors) and handlers. Call Serve to start it.
func NewAdmin() *Admin {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	a := &Admin{Registry: reg, checks: map[string]func() error{}, details: map[string]func() error{}, mux: mux}
	mux.HandleFunc("/livez", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("/readyz", a.readyz)
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.Handle("/debug/pprof/", PprofHandler())
	a.srv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		MaxHeaderBytes:    64 << 10,
	}
	return a
}

// Handle adds an operational endpoint (before Serve).
func (a *Admin) Handle(pattern string, h http.Handler) { a.mux.Handle(pattern, h) }

// AddReadyCheck adds a named readiness condition; /readyz fails while any
// check returns an error.
func (a *Admin) AddReadyCheck(name string, check func() error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.checks[name] = check
}

// AddReadyDetail adds a named condition that /readyz reports without
// failing on it: something an operator must see that is no reason to take
// the replica out of service (every replica would be out alike), such as a
// changed file that failed to load while the last good one is served.
func (a *Admin) AddReadyDetail(name string, check func() error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.details[name] = check
}

func (a *Admin) readyz(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var b strings.Builder
	ok := true
	names := make([]string, 0, len(a.checks))
	for name := range a.checks {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if err := a.checks[name](); err != nil {
			ok = false
			fmt.Fprintf(&b, "[-]%s failed: %v\n", name, err)
		} else {
			fmt.Fprintf(&b, "[+]%s ok\n", name)
		}
	}
	names = names[:0]
	for name := range a.details {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if err := a.details[name](); err != nil {
			fmt.Fprintf(&b, "[!]%s warning: %v\n", name, err)
		}
	}
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
		b.WriteString("readyz check failed\n")
	} else {
		b.WriteString("readyz check passed\n")
	}
	io.WriteString(w, b.String())
}

// Serve listens on addr and serves until ctx ends.
func (a *Admin) Serve(ctx context.Context, addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("admin listener: %w", err)
	}
	a.ln = ln
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		a.srv.Shutdown(sctx)
	}()
	go a.srv.Serve(ln)
	return nil
}

// Addr is the listening address once Serve has returned.
func (a *Admin) Addr() string { return a.ln.Addr().String() }

// PprofHandler serves Go's profiles under /debug/pprof/ (the admin port's,
// and frontdoor's for users RBAC allows).
func PprofHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}
