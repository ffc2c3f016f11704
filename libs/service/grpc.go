package service

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/resolver"
)

// DialCache opens a client connection to one cache shard's replicas,
// balancing calls round-robin over them. target is a gRPC target: host:port,
// dns:///name:port (a headless Service: one address per replica) or
// static:///a:port,b:port (a fixed list, for local stacks). creds nil means
// plaintext. opts are added to the connection's (e.g. tracing from
// Telemetry.GRPCDialOptions).
func DialCache(target string, creds credentials.TransportCredentials, maxRecv int, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	base := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithResolvers(staticBuilder{}),
		grpc.WithDefaultServiceConfig(cacheServiceConfig),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRecv)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}),
		// Reconnect to a restarted replica within a second (gRPC's default
		// backoff grows to two minutes): replicas restart, they do not
		// vanish.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}),
	}
	// Fixed flow-control windows. With gRPC's dynamic windows, every message
	// that arrives after a quiet moment triggers a bandwidth-estimation ping
	// and its ack: on a follow stream that carries one event every few
	// milliseconds, that is two more frames, writes and wake-ups per event
	// on both ends.
	base = append(base, StaticWindows()...)
	conn, err := grpc.NewClient(target, append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("cache client for %s: %w", target, err)
	}
	return conn, nil
}

// Flow-control windows of Herald's internal gRPC clients: large enough for
// a LIST of many megabytes to stream at memory speed, fixed so that no
// bandwidth-estimation pings are sent (see DialCache).
const (
	streamWindow = 4 << 20
	connWindow   = 16 << 20
)

// StaticWindows are the dial options that set Herald's fixed flow-control
// windows; the etcd clients in ingest and cache use them too.
func StaticWindows() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithStaticStreamWindowSize(streamWindow), grpc.WithStaticConnWindowSize(connWindow)}
}

// cacheServiceConfig balances round-robin over a shard's replicas and
// retries calls that failed with UNAVAILABLE (a replica that just died or is
// still loading) on another replica: every Cache call is a read, so a retry
// is always safe. Streams are retried only before their first message.
const cacheServiceConfig = `{
  "loadBalancingConfig": [{"round_robin": {}}],
  "methodConfig": [{
    "name": [{"service": "herald.v1.Cache"}],
    "retryPolicy": {
      "maxAttempts": 5,
      "initialBackoff": "0.1s",
      "maxBackoff": "1s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }]
}`

// staticBuilder resolves static:///a,b,c to those addresses once.
type staticBuilder struct{}

func (staticBuilder) Scheme() string { return "static" }

func (staticBuilder) Build(t resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	var eps []resolver.Endpoint
	for _, a := range strings.Split(t.Endpoint(), ",") {
		if a = strings.TrimSpace(a); a != "" {
			eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: a}}})
		}
	}
	if len(eps) == 0 {
		return nil, fmt.Errorf("static target %q names no address", t.URL.String())
	}
	if err := cc.UpdateState(resolver.State{Endpoints: eps}); err != nil {
		return nil, err
	}
	return staticResolver{}, nil
}

type staticResolver struct{}

func (staticResolver) ResolveNow(resolver.ResolveNowOptions) {}
func (staticResolver) Close()                                {}

// CacheConns are a client's connections to the cache shards, one per shard
// target, made on first use. Its readiness (Connected) is "every shard has
// been reached once": a replica that cannot reach a shard yet must not take
// traffic, but one that lost a shard later stays in, since it retries and a
// shard's outage would otherwise take every client replica out at once.
type CacheConns struct {
	creds   credentials.TransportCredentials
	maxRecv int
	opts    []grpc.DialOption

	mu      sync.Mutex
	targets []string
	conns   map[string]*grpc.ClientConn
	reached map[string]bool
}

// NewCacheConns makes connections with DialCache's arguments.
func NewCacheConns(creds credentials.TransportCredentials, maxRecv int, opts ...grpc.DialOption) *CacheConns {
	return &CacheConns{creds: creds, maxRecv: maxRecv, opts: opts, conns: map[string]*grpc.ClientConn{}, reached: map[string]bool{}}
}

// Dial returns the connection to target, opening it (and starting to
// connect at once) on first use.
func (c *CacheConns) Dial(target string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if conn, ok := c.conns[target]; ok {
		return conn, nil
	}
	conn, err := DialCache(target, c.creds, c.maxRecv, c.opts...)
	if err != nil {
		return nil, err
	}
	conn.Connect()
	c.targets = append(c.targets, target)
	c.conns[target] = conn
	return conn, nil
}

// Connected is the readiness check: nil once every shard dialled has had a
// ready connection. It never blocks.
func (c *CacheConns) Connected() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var waiting []string
	for _, t := range c.targets {
		if c.reached[t] {
			continue
		}
		conn := c.conns[t]
		if st := conn.GetState(); st == connectivity.Ready {
			c.reached[t] = true
		} else {
			conn.Connect() // an idle channel connects only when asked
			waiting = append(waiting, fmt.Sprintf("%s (%s)", t, st))
		}
	}
	if len(waiting) > 0 {
		return fmt.Errorf("cache shards not reached yet: %s", strings.Join(waiting, ", "))
	}
	return nil
}

// Close closes every connection.
func (c *CacheConns) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for _, conn := range c.conns {
		errs = append(errs, conn.Close())
	}
	return errors.Join(errs...)
}
