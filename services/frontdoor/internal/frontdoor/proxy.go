package frontdoor

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"herald.dev/libs/kube"
)

// Identity headers on the internal hop to fanout, kube-apiserver's
// request-header authentication convention. Frontdoor removes any a client
// sent and sets them from the authenticated user; a fanout replica must only
// be reachable from frontdoors (loopback, a network policy, or mutual TLS
// with fanout.tls.*).
const (
	hdrRemoteUser  = "X-Remote-User"
	hdrRemoteGroup = "X-Remote-Group"
	hdrRemoteUID   = "X-Remote-Uid"
)

// fanoutPool routes watches to fanout replicas: the least loaded one that
// is not marked down (ties broken round-robin). A replica that refuses the
// connection, times out or answers 503 before the response starts is
// marked down for a while and the watch is retried on the next one; nothing
// has reached the client yet, and a watch request has no body, so the retry
// is invisible to it. Once the response has started, a replica's failure
// ends the client's stream; the client resumes from its last
// resourceVersion on any replica (they keep no per-client state).
type fanoutPool struct {
	log *slog.Logger
	// backends are the replicas: one per configured URL whose host is an
	// address, one per address a configured name resolves to (refreshed by
	// resolve, so a scaled-out replica starts taking watches within a
	// refresh). newBackend builds one.
	mu         sync.RWMutex
	backends   []*backend
	names      []*url.URL // configured URLs with a DNS name
	newBackend func(u *url.URL) *backend
	next       atomic.Uint64
	downFor    time.Duration
	retries    func(host string)
	tracer     trace.Tracer // nil: tracing off
}

// backend is one fanout replica.
type backend struct {
	url    *url.URL
	origin *url.URL // the configured URL it comes from
	proxy  *httputil.ReverseProxy
	open   atomic.Int64
	down   atomic.Int64 // unix nanos until which it is skipped
}

type attemptKey struct{}

// attempt is the outcome of proxying a watch to one replica.
type attempt struct {
	user *User
	last bool  // no replica left to retry on: pass a 503 through
	err  error // the replica failed before the response started
}

var errReplicaUnavailable = errors.New("replica answered 503")

func newFanoutPool(cfg Config, log *slog.Logger, m *metrics) (*fanoutPool, error) {
	p := &fanoutPool{log: log, downFor: cfg.FanoutRetryDown, retries: func(host string) { m.fanoutRetries.WithLabelValues(host).Inc() }}
	var tlsCfg *tls.Config
	if cfg.FanoutTLS.Enabled() {
		var err error
		if tlsCfg, err = ClientTLSConfig(cfg.FanoutTLS, log, m.reloads); err != nil {
			return nil, fmt.Errorf("fanout.tls: %w", err)
		}
	}
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: cfg.FanoutDialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       tlsCfg,
		TLSHandshakeTimeout:   cfg.FanoutDialTimeout,
		ResponseHeaderTimeout: cfg.FanoutResponseTimeout,
		// Watches to one replica share HTTP/2 connections (h2c in
		// plaintext): per-connection buffers would otherwise cost every
		// watch. Spreading does not depend on connections: the pool picks
		// the replica (by address) for every watch.
		Protocols:           fanoutProtocols(),
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
		// Watches are already compressed or not by the client's choice; the
		// proxy must not add its own Accept-Encoding.
		DisableCompression: true,
	}
	p.newBackend = func(u *url.URL) *backend {
		b := &backend{url: u}
		b.proxy = &httputil.ReverseProxy{
			Transport:     tr,
			FlushInterval: -1, // every write of a watch goes out at once
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.SetURL(u)
				// Forward the query as frontdoor parsed and validated it,
				// re-encoded: fanout cannot read anything else into it.
				pr.Out.URL.RawQuery = pr.In.URL.Query().Encode()
				at := pr.In.Context().Value(attemptKey{}).(*attempt)
				setIdentity(pr.Out.Header, at.user)
				p.rewriteTrace(pr)
			},
			ModifyResponse: func(resp *http.Response) error {
				at := resp.Request.Context().Value(attemptKey{}).(*attempt)
				if resp.StatusCode == http.StatusServiceUnavailable && !at.last {
					resp.Body.Close()
					return errReplicaUnavailable
				}
				p.traceResponse(resp)
				return nil
			},
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
				at := r.Context().Value(attemptKey{}).(*attempt)
				if r.Context().Err() != nil {
					return // the client left; nothing to retry
				}
				at.err = err
			},
		}
		return b
	}
	for _, a := range cfg.fanouts() {
		u, err := url.Parse(a)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			return nil, fmt.Errorf("fanout.addrs: bad URL %q", a)
		}
		if net.ParseIP(u.Hostname()) == nil {
			p.names = append(p.names, u)
			continue
		}
		b := p.newBackend(u)
		b.origin = u
		p.backends = append(p.backends, b)
	}
	if len(p.names) > 0 {
		p.refresh(context.Background())
	}
	return p, nil
}

// resolve keeps the replicas behind configured names current until ctx
// ends.
func (p *fanoutPool) resolve(ctx context.Context, every time.Duration) {
	if len(p.names) == 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.refresh(ctx)
		}
	}
}

// refresh resolves every configured name and replaces its replicas, keeping
// the backends (and their load) of addresses that remain. A failed lookup
// keeps the previous replicas.
func (p *fanoutPool) refresh(ctx context.Context) {
	p.mu.RLock()
	byURL := map[string]*backend{}
	for _, b := range p.backends {
		byURL[b.url.String()] = b
	}
	p.mu.RUnlock()
	keep := map[string]bool{}
	var next []*backend
	for _, b := range byURL {
		if net.ParseIP(b.origin.Hostname()) != nil {
			next = append(next, b) // configured as an address
			keep[b.url.String()] = true
		}
	}
	for _, u := range p.names {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		addrs, err := net.DefaultResolver.LookupHost(rctx, u.Hostname())
		cancel()
		if err != nil {
			p.log.Warn("resolving fanout replicas failed; keeping the previous ones", "name", u.Host, "err", err)
			for _, b := range byURL {
				if b.origin == u && !keep[b.url.String()] {
					next = append(next, b)
					keep[b.url.String()] = true
				}
			}
			continue
		}
		sort.Strings(addrs)
		for _, a := range addrs {
			ru := *u
			ru.Host = net.JoinHostPort(a, u.Port())
			if b, ok := byURL[ru.String()]; ok {
				next = append(next, b)
				continue
			}
			b := p.newBackend(&ru)
			b.origin = u
			next = append(next, b)
		}
	}
	p.mu.Lock()
	p.backends = next
	p.mu.Unlock()
}

// setIdentity replaces every identity header with the user's. Credentials
// never go to fanout.
func setIdentity(h http.Header, u *User) {
	for k := range h {
		lk := strings.ToLower(k)
		if strings.HasPrefix(lk, "x-remote-") || strings.HasPrefix(lk, "impersonate-") {
			delete(h, k)
		}
	}
	h.Del("Authorization")
	h.Del("Cookie")
	h.Set(hdrRemoteUser, u.Name)
	if u.UID != "" {
		h.Set(hdrRemoteUID, u.UID)
	}
	for _, g := range u.Groups {
		h.Add(hdrRemoteGroup, g)
	}
}

// order returns the replicas to try: up ones by load, then down ones (a
// replica may have come back; trying it beats failing).
func (p *fanoutPool) order() []*backend {
	now := time.Now().UnixNano()
	p.mu.RLock()
	backends := p.backends
	p.mu.RUnlock()
	n := len(backends)
	if n == 0 {
		return nil
	}
	off := int(p.next.Add(1) % uint64(n))
	out := make([]*backend, 0, n)
	for i := range n {
		out = append(out, backends[(off+i)%n])
	}
	slices.SortStableFunc(out, func(a, b *backend) int {
		ad, bd := a.down.Load() > now, b.down.Load() > now
		if ad != bd {
			if ad {
				return 1
			}
			return -1
		}
		return int(a.open.Load() - b.open.Load())
	})
	return out
}

// serve proxies one authorized watch.
func (p *fanoutPool) serve(w http.ResponseWriter, r *http.Request, u *User) {
	order := p.order()
	for i, b := range order {
		at := &attempt{user: u, last: i == len(order)-1}
		b.open.Add(1)
		b.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), attemptKey{}, at)))
		b.open.Add(-1)
		if at.err == nil {
			return
		}
		b.down.Store(time.Now().Add(p.downFor).UnixNano())
		p.log.Warn("fanout replica failed, trying the next", "fanout", b.url.Host, "err", at.err)
		if p.retries != nil {
			p.retries(b.url.Host)
		}
	}
	kube.WriteStatus(w, errUnavailable("no watch server is reachable, please try again"))
}

func fanoutProtocols() *http.Protocols {
	p := new(http.Protocols)
	p.SetHTTP2(true)
	p.SetUnencryptedHTTP2(true)
	return p
}

// ClientTLSConfig is the client side of mutual TLS to an internal service
// (fanout over HTTPS, the cache over gRPC). The client certificate is
// re-read when its files change.
func ClientTLSConfig(c ClientTLS, log *slog.Logger, reloads *prometheus.CounterVec) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName}
	if c.CAFile != "" {
		b, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("%s: no PEM certificates", c.CAFile)
		}
		cfg.RootCAs = pool
	}
	if c.CertFile != "" {
		certs, err := newReloadable("client certificate", staticFiles(c.CertFile, c.KeyFile), func() (*tls.Certificate, error) {
			crt, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
			return &crt, err
		})
		if err != nil {
			return nil, err
		}
		// Re-read on each new connection when the files changed: a
		// handshake is rare next to the watches it carries.
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			certs.check(log, reloads)
			return certs.Get(), nil
		}
	}
	return cfg, nil
}
