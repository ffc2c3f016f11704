// Command frontdoor serves the Kubernetes list/watch API over HTTPS:
// authentication, LIST/GET from the cache, WATCH through fanout replicas.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"google.golang.org/grpc"
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
	log, err := logCfg.NewLogger(os.Stderr, "frontdoor")
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	conn, err := grpc.NewClient(cfg.CacheAddr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(cfg.MaxListResponse)),
	)
	if err != nil {
		return fmt.Errorf("cache client: %w", err)
	}
	defer conn.Close()
	admin := service.NewAdmin()
	handler, err := frontdoor.NewServer(cfg, log, heraldv1.NewCacheClient(conn), admin.Registry)
	if err != nil {
		return err
	}
	admin.AddReadyCheck("frontdoor", func() error { return nil })
	if err := admin.Serve(ctx, cfg.AdminAddr); err != nil {
		return err
	}
	cert, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
	if err != nil {
		return fmt.Errorf("serving certificate: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return err
	}
	srvCtx, cancelRequests := context.WithCancel(context.Background())
	defer cancelRequests()
	srv := &http.Server{
		Handler:           handler,
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}},
		ReadHeaderTimeout: cfg.ReadHeaderTime,
		IdleTimeout:       90 * time.Second,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		BaseContext:       func(net.Listener) context.Context { return srvCtx },
	}
	go func() {
		<-ctx.Done()
		cancelRequests() // end watches; clients resume elsewhere
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
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
