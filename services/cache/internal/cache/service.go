package cache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"k8s.io/klog/v2"

	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/service"
)

// grpcDrain bounds how long calls in flight get to finish on stop; watch
// streams never finish on their own, so they are cut after it and their
// clients resume on another replica.
const grpcDrain = 5 * time.Second

// NewService is a cache replica's lifecycle.
//
//   - Starting connects to etcd and NATS, loads the snapshot and catches up
//     with the stream (the shard keeps following it from then on), and only
//     then listens for gRPC: clients balance over replicas by connection,
//     and a replica still loading must never be picked.
//   - Running serves gRPC until the stop, or until the shard stops
//     following or the server fails (a failure).
//   - Stopping stops following, then drains gRPC calls (grpcDrain).
//
// /readyz: Running and the shard's own check ("shard": loaded and
// following).
func NewService(cfg Config, p *service.Process) (*service.Service, error) {
	// klog is k8s.io/apiserver's logger (its value transformers log every
	// value they fail to decrypt): at debug level, so that a skipped value
	// makes one line, the shard's own (decode.go).
	klog.SetSlogLogger(slog.New(debugHandler{p.Log.With("logger", "klog").Handler()}))
	shard, err := New(cfg, p.Log, p.Admin.Registry, WithTracer(p.Telemetry.Tracer("herald.dev/services/cache")))
	if err != nil {
		return nil, err
	}
	p.Admin.AddReadyCheck("shard", shard.Ready)
	tc, err := cfg.GRPCTLS.PeerConfig("grpc", p.Log, p.Admin.Registry)
	if err != nil {
		return nil, fmt.Errorf("grpc.tls: %w", err)
	}
	var opts []grpc.ServerOption
	if tc != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	}
	opts = append(opts,
		grpc.MaxRecvMsgSize(cfg.MaxRecvBytes),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)
	srv := grpc.NewServer(append(opts, p.Telemetry.GRPCServerOptions()...)...)
	heraldv1.RegisterCacheServer(srv, NewServer(shard))
	r := &replica{p: p, cfg: cfg, shard: shard, srv: srv}
	return service.NewService("cache", r.starting, r.running, r.stopping), nil
}

// replica is the state a cache replica's lifecycle functions share.
type replica struct {
	p     *service.Process
	cfg   Config
	shard *Shard
	srv   *grpc.Server
	ln    net.Listener

	stopShard context.CancelFunc
	shardDone chan struct{} // closed when shard.Run has returned, with shardErr
	shardErr  error
	served    chan error
}

func (r *replica) starting(ctx context.Context) error {
	runCtx, cancel := context.WithCancel(ctx)
	r.stopShard, r.shardDone = cancel, make(chan struct{})
	go func() {
		defer close(r.shardDone)
		r.shardErr = r.shard.Run(runCtx)
	}()
	select {
	case <-r.shard.FirstReady():
	case <-r.shardDone:
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("shard stopped while loading: %w", r.shardErr)
	}
	ln, err := net.Listen("tcp", r.cfg.GRPCAddr)
	if err != nil {
		cancel()
		<-r.shardDone
		return fmt.Errorf("gRPC listener: %w", err)
	}
	r.ln = ln
	r.p.Log.Info("serving gRPC", "grpc", ln.Addr().String())
	return nil
}

func (r *replica) running(ctx context.Context) error {
	r.served = make(chan error, 1)
	go func() { r.served <- r.srv.Serve(r.ln) }()
	select {
	case <-ctx.Done():
		return nil
	case <-r.shardDone:
		return errors.Join(errors.New("the shard stopped following the stream"), r.shardErr)
	case err := <-r.served:
		return fmt.Errorf("gRPC server: %w", err)
	}
}

func (r *replica) stopping(error) error {
	r.stopShard()
	<-r.shardDone
	stopped := make(chan struct{})
	go func() { r.srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(grpcDrain):
		r.srv.Stop()
	}
	return nil
}
