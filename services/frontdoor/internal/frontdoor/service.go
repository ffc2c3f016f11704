package frontdoor

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

	"herald.dev/libs/cacheclient"
	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/service"
)

// NewService is a frontdoor replica's lifecycle. Building it loads every
// file the replica depends on (certificate, tokens, keys, RBAC: a bad one
// fails the start); starting listens; running serves and reloads changed
// files; stopping ends watches at once (clients resume elsewhere) and gives
// other requests shutdown-grace-period.
//
// /readyz: Running and "cache-connection": every cache shard has been
// reached once (LIST and GET need them; watches go to fanout replicas,
// which report their own readiness). A shard lost later keeps the replica
// ready: every replica would lose it alike, and LISTs of other shards still
// work. A changed serving certificate that fails to load is a
// "config-files" warning on /readyz, not a failure: the last good one is
// served, and every replica reading the same broken file would otherwise
// leave the API at once. A trust file (tokens, client CA, service-account
// keys, RBAC) that is deleted or fails to load fails "trust-files": its
// trust is removed (reload.go), so the replica refuses credentials it
// would have accepted, and says so until the file loads again.
func NewService(cfg Config, p *service.Process) (*service.Service, error) {
	creds, err := cfg.CacheTLS.GRPCCredentials(p.Log, nil)
	if err != nil {
		return nil, fmt.Errorf("cache.tls: %w", err)
	}
	reg, shards, err := kube.LoadShards(cfg.ResourcesFile, cfg.Prefix, cfg.ShardMap())
	if err != nil {
		return nil, err
	}
	conns := service.NewCacheConns(creds, cfg.MaxListResponse, p.Telemetry.GRPCDialOptions()...)
	clients := map[string]heraldv1.CacheClient{}
	for _, target := range shards.Targets() {
		conn, err := conns.Dial(target)
		if err != nil {
			conns.Close()
			return nil, err
		}
		clients[target] = heraldv1.NewCacheClient(conn)
	}
	handler, err := NewServer(cfg, p.Log, cacheclient.New(reg, shards, clients), p.Admin.Registry, p.Admin.Registry,
		WithTracer(p.Telemetry.Tracer("herald.dev/services/frontdoor")), WithRegistry(reg))
	if err != nil {
		conns.Close()
		return nil, err
	}
	p.Admin.AddReadyCheck("cache-connection", conns.Connected)
	p.Admin.AddReadyDetail("config-files", handler.ConfigErrors)
	p.Admin.AddReadyCheck("trust-files", handler.TrustErrors)
	srv := &service.HTTPServer{Server: handler.HTTPServer(), Addr: cfg.Addr, TLS: true, Grace: cfg.ShutdownGracePeriod}
	if p.Telemetry.Enabled {
		// One span per request (LIST, GET, WATCH), whose context the cache
		// calls carry in gRPC metadata. A public endpoint: a client's
		// trace context is linked, never trusted as the parent (it could
		// force sampling).
		srv.Server.Handler = otelhttp.NewHandler(srv.Server.Handler, "frontdoor",
			otelhttp.WithTracerProvider(p.Telemetry.TracerProvider), otelhttp.WithPropagators(p.Telemetry.Propagator),
			otelhttp.WithPublicEndpointFn(func(*http.Request) bool { return true }), otelhttp.WithSpanNameFormatter(RequestSpanName))
	}
	starting := func(context.Context) error {
		if err := srv.Listen(); err != nil {
			return err
		}
		p.Log.Info("serving the Kubernetes API", "addr", srv.ListenAddr(), "cache", cfg.ShardMap(), "fanouts", cfg.FanoutAddrs)
		return nil
	}
	running := func(ctx context.Context) error {
		go handler.Run(ctx)
		return srv.Serve(ctx)
	}
	stopping := func(error) error {
		err := srv.Shutdown()
		// Detached watches end with Shutdown, cleanly unless their client
		// does not read (then within the grace period): not cut by the
		// process's exit.
		if !handler.WaitWatches(cfg.ShutdownGracePeriod + time.Second) {
			p.Log.Warn("watches still open after the shutdown grace period")
		}
		handler.CloseAudit()
		return errors.Join(err, conns.Close())
	}
	return service.NewService("frontdoor", starting, running, stopping), nil
}
