// Command cache runs one cache shard replica: current objects and a window
// of recent revisions, served over gRPC.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/service"
	"herald.dev/services/cache/internal/cache"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "cache:", err)
		os.Exit(1)
	}
}

func run() error {
	var cfg cache.Config
	var logCfg service.LogConfig
	fs := flag.NewFlagSet("cache", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	logCfg.RegisterFlags(fs)
	if err := service.ParseFlags(fs, os.Args[1:]); err != nil {
		return err
	}
	log, err := logCfg.NewLogger(os.Stderr, "cache")
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	tel, err := service.NewTelemetry(ctx, "cache")
	if err != nil {
		return err
	}
	defer shutdownTelemetry(tel)
	admin := service.NewAdmin()
	shard, err := cache.New(cfg, log, admin.Registry, cache.WithTracer(tel.Tracer("herald.dev/services/cache")))
	if err != nil {
		return err
	}
	admin.AddReadyCheck("shard", shard.Ready)
	if err := admin.Serve(ctx, cfg.AdminAddr); err != nil {
		return err
	}
	var serverOpts []grpc.ServerOption
	if cfg.GRPCTLS.Enabled() {
		tc, err := cfg.GRPCTLS.Config()
		if err != nil {
			return fmt.Errorf("grpc.tls: %w", err)
		}
		serverOpts = append(serverOpts, grpc.Creds(credentials.NewTLS(tc)))
	}
	serverOpts = append(serverOpts,
		grpc.MaxRecvMsgSize(cfg.MaxRecvBytes),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)
	srv := grpc.NewServer(append(serverOpts, tel.GRPCServerOptions()...)...)
	heraldv1.RegisterCacheServer(srv, cache.NewServer(shard))
	// Serve gRPC only once the snapshot is loaded: clients balance over
	// replicas by connection, and a replica that is still loading must not
	// be picked.
	go func() {
		select {
		case <-ctx.Done():
			return
		case <-shard.FirstReady():
		}
		ln, err := net.Listen("tcp", cfg.GRPCAddr)
		if err != nil {
			log.Error("gRPC listener", "err", err)
			stop()
			return
		}
		log.Info("serving gRPC", "grpc", ln.Addr().String())
		srv.Serve(ln)
	}()
	log.Info("cache starting", "grpc", cfg.GRPCAddr, "admin", admin.Addr())
	err = shard.Run(ctx)
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		srv.Stop()
	}
	log.Info("cache stopped")
	return err
}

// shutdownTelemetry flushes the spans still buffered (bounded).
func shutdownTelemetry(tel *service.Telemetry) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tel.Shutdown(ctx)
}
