// Package service owns the plumbing every Herald process shares, so that it
// is written once:
//
//   - the process (process.go): flags read from the command line and
//     HERALD_* environment variables, the logger, tracing, the admin server,
//     and running one component until a signal (Main);
//   - the lifecycle (lifecycle.go): New -> Starting -> Running -> Stopping ->
//     Terminated (or Failed), dskit's services.Service in small; /readyz
//     passes only while the component is Running and its own checks pass;
//   - the admin HTTP server (admin.go): /livez, /readyz, /metrics,
//     /debug/pprof;
//   - TLS (tls.go) on internal hops, server and client side, certificates
//     reloaded when their files change (reload.go);
//   - HTTP (http.go): HTTP/2 in plaintext (h2c), gzip negotiation, and an
//     http.Server run as a lifecycle's parts; gRPC clients of the cache
//     (grpc.go);
//   - the option groups several services share (options.go), so that a
//     flag means the same everywhere;
//   - the process's Ps (procs.go): one while it is quiet, all of them while
//     it is busy.
//
// It holds no package state: every process builds its own Admin with its own
// prometheus.Registry, its own Telemetry, its own lifecycle. It must never
// know what a component does: components hand it functions.
package service

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
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
