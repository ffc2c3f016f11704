// Package service owns what every Herald process has in common: reading
// flags from HERALD_* environment variables, the logger, and the admin HTTP
// server with /livez, /readyz, /metrics and /debug/pprof.
//
// It holds no package state: every process builds its own Admin with its own
// prometheus.Registry.
package service

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// EnvName is the environment variable that sets a flag: HERALD_ and the
// flag's name in upper case with dashes and dots as underscores.
func EnvName(flagName string) string {
	return "HERALD_" + strings.NewReplacer("-", "_", ".", "_").Replace(strings.ToUpper(flagName))
}

// ParseFlags parses args into fs, then sets every flag not given on the
// command line from its environment variable, if present.
func ParseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] {
			return
		}
		if v, ok := os.LookupEnv(EnvName(f.Name)); ok {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", EnvName(f.Name), err))
			}
		}
	})
	return errors.Join(errs...)
}

// LogConfig configures the process logger.
type LogConfig struct {
	Level  string
	Format string
}

func (c *LogConfig) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Level, "log.level", "info", "Log level: debug, info, warn, error.")
	fs.StringVar(&c.Format, "log.format", "text", "Log format: text or json.")
}

// NewLogger builds the logger of a process named component. Records logged
// with a context that carries a span get its trace_id and span_id.
func (c *LogConfig) NewLogger(w io.Writer, component string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.Level)); err != nil {
		return nil, fmt.Errorf("log.level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler
	switch c.Format {
	case "json":
		h = slog.NewJSONHandler(w, opts)
	case "text":
		h = slog.NewTextHandler(w, opts)
	default:
		return nil, fmt.Errorf("log.format %q: want text or json", c.Format)
	}
	return slog.New(traceHandler{h}).With("component", component), nil
}

// Admin is a process's operational HTTP server.
type Admin struct {
	Registry *prometheus.Registry

	mu     sync.Mutex
	checks map[string]func() error
	mux    *http.ServeMux
	srv    *http.Server
	ln     net.Listener
}

// NewAdmin creates the admin server's registry (with Go and process
// collectors) and handlers. Call Serve to start it.
func NewAdmin() *Admin {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	a := &Admin{Registry: reg, checks: map[string]func() error{}, mux: mux}
	mux.HandleFunc("/livez", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("/readyz", a.readyz)
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
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

func (a *Admin) readyz(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var b strings.Builder
	ok := true
	for name, check := range a.checks {
		if err := check(); err != nil {
			ok = false
			fmt.Fprintf(&b, "[-]%s failed: %v\n", name, err)
		} else {
			fmt.Fprintf(&b, "[+]%s ok\n", name)
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
