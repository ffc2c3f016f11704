// Command frontdoor serves the Kubernetes list/watch API over HTTPS:
// authentication, RBAC, limits, LIST/GET from the cache, WATCH through
// fanout replicas.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/service"
	"herald.dev/services/frontdoor/internal/frontdoor"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "frontdoor:", err)
		os.Exit(1)
	}
}

func run() error {
	var cfg frontdoor.Config
	var logCfg service.LogConfig
	fs := flag.NewFlagSet("frontdoor", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	logCfg.RegisterFlags(fs)
	if err := service.ParseFlags(fs, os.Args[1:]); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	log, err := logCfg.NewLogger(os.Stderr, "frontdoor")
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	admin := service.NewAdmin()
	creds := insecure.NewCredentials()
	if cfg.CacheTLS.Enabled() {
		tc, err := frontdoor.ClientTLSConfig(cfg.CacheTLS, log, nil)
		if err != nil {
			return fmt.Errorf("cache.tls: %w", err)
		}
		creds = credentials.NewTLS(tc)
	}
	conn, err := grpc.NewClient(cfg.CacheAddr,
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(cfg.MaxListResponse)),
	)
	if err != nil {
		return fmt.Errorf("cache client: %w", err)
	}
	defer conn.Close()
	handler, err := frontdoor.NewServer(cfg, log, heraldv1.NewCacheClient(conn), admin.Registry, admin.Registry)
	if err != nil {
		return err
	}
	go handler.Run(ctx)
	admin.AddReadyCheck("frontdoor", func() error { return nil })
	if err := admin.Serve(ctx, cfg.AdminAddr); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return err
	}
	srvCtx, cancelRequests := context.WithCancel(context.Background())
	defer cancelRequests()
	srv := handler.HTTPServer(srvCtx)
	go func() {
		<-ctx.Done()
		cancelRequests() // end watches; clients resume elsewhere
		sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGracePeriod)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	log.Info("frontdoor starting", "addr", ln.Addr().String(), "admin", admin.Addr(), "cache", cfg.CacheAddr, "fanouts", cfg.FanoutAddrs)
	if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	log.Info("frontdoor stopped")
	return nil
}
