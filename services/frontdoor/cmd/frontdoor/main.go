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
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"herald.dev/libs/kube"
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

	tel, err := service.NewTelemetry(ctx, "frontdoor")
	if err != nil {
		return err
	}
	defer shutdownTelemetry(tel)
	admin := service.NewAdmin()
	creds := insecure.NewCredentials()
	if cfg.CacheTLS.Enabled() {
		tc, err := frontdoor.ClientTLSConfig(cfg.CacheTLS, log, nil)
		if err != nil {
			return fmt.Errorf("cache.tls: %w", err)
		}
		creds = credentials.NewTLS(tc)
	}
	reg, err := kube.LoadRegistry(cfg.ResourcesFile, cfg.Prefix)
	if err != nil {
		return err
	}
	shards, err := kube.ParseShardMap(cfg.ShardMap(), reg)
	if err != nil {
		return err
	}
	clients := map[string]heraldv1.CacheClient{}
	for _, target := range shards.Targets() {
		conn, err := service.DialCache(target, creds, cfg.MaxListResponse, tel.GRPCDialOptions()...)
		if err != nil {
			return err
		}
		defer conn.Close()
		clients[target] = heraldv1.NewCacheClient(conn)
	}
	handler, err := frontdoor.NewServer(cfg, log, frontdoor.NewShardedCache(reg, shards, clients), admin.Registry, admin.Registry,
		frontdoor.WithTracer(tel.Tracer("herald.dev/services/frontdoor")))
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
	if tel.Enabled {
		// One span per request (LIST, GET, WATCH), whose context the cache
		// calls carry in gRPC metadata. A public endpoint: a client's
		// trace context is linked, never trusted as the parent (it could
		// force sampling).
		srv.Handler = otelhttp.NewHandler(srv.Handler, "frontdoor",
			otelhttp.WithTracerProvider(tel.TracerProvider), otelhttp.WithPropagators(tel.Propagator),
			otelhttp.WithPublicEndpointFn(func(*http.Request) bool { return true }), otelhttp.WithSpanNameFormatter(frontdoor.RequestSpanName))
	}
	go func() {
		<-ctx.Done()
		cancelRequests() // end watches; clients resume elsewhere
		sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGracePeriod)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	log.Info("frontdoor starting", "addr", ln.Addr().String(), "admin", admin.Addr(), "cache", cfg.ShardMap(), "fanouts", cfg.FanoutAddrs)
	if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	log.Info("frontdoor stopped")
	return nil
}

// shutdownTelemetry flushes the spans still buffered (bounded).
func shutdownTelemetry(tel *service.Telemetry) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tel.Shutdown(ctx)
}
