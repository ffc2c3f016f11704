package service

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// Config is a component's configuration as Main needs it: its flags, their
// validation, and the admin server's address (AdminConfig provides it).
type Config interface {
	RegisterFlags(fs *flag.FlagSet)
	Validate() error
	AdminAddress() string
}

// Process is what every Herald process has, built by Main and handed to the
// component it runs: its logger, tracing and admin server (with the
// registry its metrics go to).
type Process struct {
	Name      string
	Log       *slog.Logger
	Telemetry *Telemetry
	Admin     *Admin
}

// Build builds a process's component (nothing runs yet). It may add
// readiness checks to p.Admin; /readyz also requires the service to be
// Running.
type Build func(p *Process) (*Service, error)

// telemetryFlush bounds how long the spans still buffered may take to leave
// when the process ends.
const telemetryFlush = 5 * time.Second

// Main is the whole main of a Herald process named name: it parses cfg's
// flags (and the logger's) from the command line and HERALD_*, validates
// them, serves the admin port, builds the component, runs it until SIGINT
// or SIGTERM (or its failure), stops it gracefully and flushes the spans.
// It exits with status 1 on any error. Before anything, a process whose
// GODEBUG does not set schedtrace re-executes itself with SysmonAwake
// (keepSysmonAwake).
func Main(name string, cfg Config, build Build) {
	if err := keepSysmonAwake(); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
	}
	if err := Run(context.Background(), name, cfg, os.Args[1:], os.Stderr, build); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

// ProcessConfig is what every process is configured with besides its
// component's flags: the logger and its Ps.
type ProcessConfig struct {
	Log   LogConfig
	Procs ProcsConfig
}

// Configure reads a process's configuration as Run does: cfg's flags and
// the process's own from args and HERALD_*, then cfg.Validate. An error is
// why the process refuses to start.
func Configure(name string, cfg Config, args []string) (ProcessConfig, error) {
	var pc ProcessConfig
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	pc.Log.RegisterFlags(fs)
	pc.Procs.RegisterFlags(fs)
	if err := ParseFlags(fs, args); err != nil {
		return pc, err
	}
	return pc, cfg.Validate()
}

// Run is Main without the exit, for tests: it returns when ctx ends or a
// signal arrives (after a graceful stop) or the component fails.
func Run(ctx context.Context, name string, cfg Config, args []string, logTo io.Writer, build Build) error {
	pc, err := Configure(name, cfg, args)
	if err != nil {
		return err
	}
	log, err := pc.Log.NewLogger(logTo, name)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	tel, err := NewTelemetry(ctx, name)
	if err != nil {
		return err
	}
	defer func() {
		fctx, cancel := context.WithTimeout(context.Background(), telemetryFlush)
		defer cancel()
		tel.Shutdown(fctx)
	}()

	p := &Process{Name: name, Log: log, Telemetry: tel, Admin: NewAdmin()}
	svc, err := build(p)
	if err != nil {
		return err
	}
	p.Admin.AddReadyCheck("lifecycle", svc.Ready)
	adminCtx, stopAdmin := context.WithCancel(context.Background())
	defer stopAdmin()
	if err := p.Admin.Serve(adminCtx, cfg.AdminAddress()); err != nil {
		return err
	}
	log.Info(name+" starting", "admin", p.Admin.Addr())
	if !sysmonAwake() {
		log.Info("GODEBUG has no schedtrace: the runtime's sysmon sleeps deeply between events and is woken for each one; GODEBUG=" + SysmonAwake + " spares that (docs/operations.md, Cores)")
	}
	// After build: what a component sizes by its Ps (fanout's pacers) sees
	// them all.
	pc.Procs.adaptProcs(ctx, log)
	if err := svc.StartAsync(context.Background()); err != nil {
		return err
	}
	go func() {
		if svc.AwaitRunning(ctx) == nil {
			log.Info(name + " running")
		}
	}()
	select {
	case <-ctx.Done():
		log.Info(name + " stopping")
		svc.StopAsync()
	case <-svc.terminated:
	}
	err = svc.AwaitTerminated(context.Background())
	log.Info(name+" stopped", "state", svc.State())
	return err
}
