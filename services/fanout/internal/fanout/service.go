package fanout

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"google.golang.org/grpc"

	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/service"
	"herald.dev/libs/watchsession"
)

// Bounds of the internal watch server.
const (
	// maxStreamsPerConn: each HTTP/2 connection has one writer, and 1,000
	// broadcast watchers on a single one measured p99 9.3 s against 1.6 s
	// with 100 (herald-load broadcast-1000x100).
	maxStreamsPerConn = 100
	// shutdownGrace: watches end at once on stop (clients resume
	// elsewhere); this bounds the rest.
	shutdownGrace = 5 * time.Second
	// maxCacheMessage is the largest message read from the cache.
	maxCacheMessage = 64 << 20
)

// NewService is a fanout replica's lifecycle: starting listens (the hubs
// start on the first watch of each resource), running serves watches,
// stopping ends them (clients resume on another replica) and closes the
// cache connections.
//
// /readyz: Running and "cache-connection": every cache shard has been
// reached once. It does not hold the start (hubs retry a shard that is
// down), and a shard lost later keeps the replica ready: every replica
// would lose it alike.
func NewService(cfg Config, p *service.Process) (*service.Service, error) {
	creds, err := cfg.CacheTLS.GRPCCredentials(p.Log, nil)
	if err != nil {
		return nil, fmt.Errorf("cache.tls: %w", err)
	}
	serverTLS, err := cfg.HTTPTLS.PeerConfig("http", p.Log, p.Admin.Registry)
	if err != nil {
		return nil, fmt.Errorf("http.tls: %w", err)
	}
	// Every catch-up holds a stream per cache shard, and reads one while
	// the others wait (the merge, libs/cacheclient): what a waiting stream
	// holds is its window, so fanout's are smaller than Herald's default.
	dialOpts := append(p.Telemetry.GRPCDialOptions(), grpc.WithStaticStreamWindowSize(int32(cfg.CacheStreamWindow)))
	conns := service.NewCacheConns(creds, maxCacheMessage, dialOpts...)
	dial := func(target string) (heraldv1.CacheClient, error) {
		conn, err := conns.Dial(target)
		if err != nil {
			return nil, err
		}
		return heraldv1.NewCacheClient(conn), nil
	}
	hubsCtx, stopHubs := context.WithCancel(context.Background())
	handler, err := NewServer(hubsCtx, cfg, p.Log, dial, p.Admin.Registry, WithTracer(p.Telemetry.Tracer("herald.dev/services/fanout")))
	if err != nil {
		stopHubs()
		conns.Close()
		return nil, err
	}
	p.Admin.AddReadyCheck("cache-connection", conns.Connected)
	// Frontdoor carries its watches as streams of sessions
	// (libs/watchsession), each on a connection of its own; every other
	// request (a watch asked for directly) is served as it comes.
	sessions := &watchsession.Server{Handler: handler, Fallback: handler, Log: p.Log}
	promauto.With(p.Admin.Registry).NewGaugeFunc(prometheus.GaugeOpts{Name: "herald_fanout_watchmux_shared_bytes",
		Help: "Bytes of events shared by several watches that frontdoor's sessions keep, at each end, for watches to refer to (up to the window frontdoor asks for; forgotten after 30-45 s unused)."},
		func() float64 { return float64(sessions.SharedBytes()) })
	srv := &service.HTTPServer{
		Server: &http.Server{
			Handler:           sessions,
			TLSConfig:         serverTLS,
			Protocols:         service.ServerProtocols(),
			HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: maxStreamsPerConn},
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       90 * time.Second,
			MaxHeaderBytes:    1 << 20,
		},
		Addr:      cfg.HTTPAddr,
		TLS:       serverTLS != nil,
		Grace:     shutdownGrace,
		WriteHold: cfg.WriteHold,
	}
	srv.Server.RegisterOnShutdown(sessions.Shutdown)
	starting := func(context.Context) error {
		if err := srv.Listen(); err != nil {
			return err
		}
		p.Log.Info("serving watches", "http", srv.ListenAddr(), "cache", cfg.ShardMap())
		return nil
	}
	stopping := func(error) error {
		stopHubs()
		err := srv.Shutdown()
		// The sessions' connections are their own, which the HTTP
		// server's shutdown does not wait for: their watches have ended
		// with it, and they end once they have sent that.
		sessions.Shutdown() // as the server's shutdown does, before waiting
		if !sessions.Wait(shutdownGrace) {
			sessions.Close()
		}
		return errors.Join(err, conns.Close())
	}
	return service.NewService("fanout", starting, srv.Serve, stopping), nil
}
