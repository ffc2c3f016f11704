// Command ingest tails etcd and appends every revision to the JetStream
// stream. Several replicas run; one leads.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"herald.dev/libs/service"
	"herald.dev/services/ingest/internal/ingest"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "ingest:", err)
		os.Exit(1)
	}
}

func run() error {
	var cfg ingest.Config
	var logCfg service.LogConfig
	fs := flag.NewFlagSet("ingest", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	logCfg.RegisterFlags(fs)
	if err := service.ParseFlags(fs, os.Args[1:]); err != nil {
		return err
	}
	log, err := logCfg.NewLogger(os.Stderr, "ingest")
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	tel, err := service.NewTelemetry(ctx, "ingest")
	if err != nil {
		return err
	}
	defer shutdownTelemetry(tel)
	admin := service.NewAdmin()
	in, err := ingest.New(cfg, log, admin.Registry, ingest.WithTracer(tel.Tracer("herald.dev/services/ingest")))
	if err != nil {
		return err
	}
	admin.AddReadyCheck("ingest", in.Ready)
	if cfg.FaultInjection {
		for path, h := range in.FaultHandlers() {
			admin.Handle(path, h)
		}
	}
	if err := admin.Serve(ctx, cfg.AdminAddr); err != nil {
		return err
	}
	log.Info("ingest starting", "admin", admin.Addr(), "etcd", cfg.EtcdEndpoints, "nats", cfg.NATSURL)
	err = in.Run(ctx)
	log.Info("ingest stopped")
	return err
}

// shutdownTelemetry flushes the spans still buffered (bounded).
func shutdownTelemetry(tel *service.Telemetry) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tel.Shutdown(ctx)
}
