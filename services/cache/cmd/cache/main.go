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

	admin := service.NewAdmin()
	shard, err := cache.New(cfg, log, admin.Registry)
	if err != nil {
		return err
	}
	admin.AddReadyCheck("shard", shard.Ready)
	if err := admin.Serve(ctx, cfg.AdminAddr); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.GRPCAddr)
	if err != nil {
		return err
	}
	srv := grpc.NewServer(
		grpc.MaxRecvMsgSize(cfg.MaxRecvBytes),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)
	heraldv1.RegisterCacheServer(srv, cache.NewServer(shard))
	go srv.Serve(ln)
	log.Info("cache starting", "grpc", ln.Addr().String(), "admin", admin.Addr())
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
