// Package upstream is cluster mode's way to kube-apiserver (the upstream):
// the pass-through, every request frontdoor does not serve from
// the cache is reverse-proxied to the upstream, streaming both ways, as the
// caller. The invariants:
//
//   - the upstream only ever sees Herald's own credentials (from the
//     upstream kubeconfig) plus Impersonate-* headers naming the user that
//     frontdoor authenticated (or the user whose impersonation the cluster
//     authorized for the caller, frontdoor's delegated.go). Whatever credential or
//     Impersonate-*/X-Remote-* header the client sent is removed first, so
//     no client header can make Herald act as itself;
//   - bodies over max-request-body-bytes (kube-apiserver's 3 MiB) are
//     refused with 413 before anything is forwarded (frontdoor's body limit);
//   - an upstream that cannot be reached, or fails before its answer
//     starts, gives kube-apiserver's 503 Status (504 on a timeout) within the
//     dial timeout, never a hang; once the answer started, a failure ends the
//     client's stream (the client retries or resumes as with kube-apiserver);
//   - upgrades (exec, attach, portforward, proxy: SPDY and WebSocket) go over
//     HTTP/1.1 to the upstream, whose answer (101, or a refusal) reaches the
//     client as is.
package upstream

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/httpstream"
	auditinternal "k8s.io/apiserver/pkg/apis/audit"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"herald.dev/libs/kube"
	"herald.dev/libs/service"
	"herald.dev/services/frontdoor/internal/apierr"
)

// Config configures cluster mode; without a kubeconfig frontdoor
// serves alone (static tokens, certificates, local RBAC).
type Config struct {
	Kubeconfig string
	// Servers overrides the kubeconfig's server with several addresses
	// (https://host:port), balanced and health-checked.
	Servers         string
	DialTimeout     time.Duration
	ResponseTimeout time.Duration
	HealthInterval  time.Duration

	AuthnCacheTTL         time.Duration
	AuthnNegativeCacheTTL time.Duration
	AuthzAllowCacheTTL    time.Duration
	AuthzDenyCacheTTL     time.Duration
	// AuthzCacheBytes bounds the SubjectAccessReview cache, and
	// AuthzCacheBytesPerUser each user's share of it (internal/authz).
	AuthzCacheBytes        int64
	AuthzCacheBytesPerUser int64
	ReviewTimeout          time.Duration
	// LongRunningTimeout bounds a forwarded long-running request's
	// lifetime (longrunning.go).
	LongRunningTimeout time.Duration

	// Review limits (reviews.go; the new-token pool: internal/authn).
	ReviewQPS                   float64
	ReviewBurst                 int
	MaxReviewsInflight          int
	MaxReviewsInflightPerUser   int
	MaxNewTokenReviews          int
	MaxNewTokenReviewsPerSource int
}

// RegisterFlags registers the upstream flags on fs. The cache TTLs default
// to kube-apiserver's for its own token cache (10 s positive) and to the
// delegating authorizer's of aggregated API servers (10 s either way).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Kubeconfig, "upstream.kubeconfig", "", "Cluster mode: kubeconfig of the kube-apiserver that writes, subresources, discovery and everything not cached go to (as the caller, by impersonation), and that authenticates (TokenReview) and authorizes (SubjectAccessReview) callers. Its credentials are Herald's own.")
	fs.StringVar(&c.Servers, "upstream.servers", "", "Comma-separated kube-apiserver URLs used instead of the kubeconfig's server, balanced and health-checked (/readyz); TLS settings and credentials still come from the kubeconfig.")
	fs.DurationVar(&c.DialTimeout, "upstream.dial-timeout", 3*time.Second, "Timeout to connect to the upstream; beyond it the client gets 503.")
	fs.DurationVar(&c.ResponseTimeout, "upstream.response-timeout", 70*time.Second, "Time the upstream has to start answering (response headers; watches, logs and exec stream as long as they last); beyond it the client gets 504. Above kube-apiserver's own 60 s request timeout.")
	fs.DurationVar(&c.LongRunningTimeout, "upstream.long-running-timeout", 24*time.Hour, "Longest a forwarded long-running request (what kube-apiserver counts as one: watch, exec, attach, port-forward, logs, proxy) may last; then its response ends cleanly (a watch client watches again, kubectl logs -f returns) and an upgraded stream (exec, attach, port-forward) is closed. Such requests are exempt from write-timeout from their first byte, but each of their writes must complete within write-timeout (a client that stops reading is cut); an idle stream is not cut here.")
	fs.DurationVar(&c.HealthInterval, "upstream.health-interval", 5*time.Second, "How often each upstream server's /readyz is checked.")
	fs.DurationVar(&c.AuthnCacheTTL, "upstream.authentication-cache-ttl", 10*time.Second, "How long a token the cluster accepted (TokenReview) is trusted without asking again.")
	fs.DurationVar(&c.AuthnNegativeCacheTTL, "upstream.authentication-negative-cache-ttl", 10*time.Second, "How long a token the cluster refused is refused without asking again (0: ask every time).")
	fs.DurationVar(&c.AuthzAllowCacheTTL, "upstream.authorization-allow-cache-ttl", 10*time.Second, "How long an allowed SubjectAccessReview is cached (per user, verb, resource, namespace, name, selectors).")
	fs.DurationVar(&c.AuthzDenyCacheTTL, "upstream.authorization-deny-cache-ttl", 10*time.Second, "How long a denied SubjectAccessReview is cached.")
	fs.Int64Var(&c.AuthzCacheBytes, "upstream.authorization-cache-bytes", 16<<20, "Memory of the SubjectAccessReview cache (decisions kept by a hash of the review, about 350 bytes each; least recently used evicted first); 0 caches nothing.")
	fs.Int64Var(&c.AuthzCacheBytesPerUser, "upstream.authorization-cache-bytes-per-user", 1<<20, "Part of upstream.authorization-cache-bytes one user's decisions may hold (its own least recently used are evicted first): a user asking many different reviews evicts its own, not others'.")
	fs.DurationVar(&c.ReviewTimeout, "upstream.review-timeout", 10*time.Second, "Timeout of one TokenReview or SubjectAccessReview (a TokenReview's is at most 5 s: k8s.io/apiserver's token cache).")
	fs.Float64Var(&c.ReviewQPS, "upstream.review-qps", 500, "TokenReviews per second sent to kube-apiserver, and separately SubjectAccessReviews (cache misses only). A review waits for its turn only as long as its deadline allows; beyond, the request gets 429 with Retry-After.")
	fs.IntVar(&c.ReviewBurst, "upstream.review-burst", 1000, "Reviews of each kind sent at once above upstream.review-qps.")
	fs.IntVar(&c.MaxReviewsInflight, "upstream.max-reviews-inflight", 1000, "TokenReviews in flight to kube-apiserver at once, and separately SubjectAccessReviews; more get 429 with Retry-After.")
	fs.IntVar(&c.MaxReviewsInflightPerUser, "upstream.max-reviews-inflight-per-user", 16, "SubjectAccessReviews of one user in flight at once (fairness: another user's are not delayed); more get 429.")
	fs.IntVar(&c.MaxNewTokenReviews, "upstream.max-new-token-reviews-inflight", 500, "Requests whose bearer token the cluster has not accepted in the last 15 minutes (new tokens, bad ones) reviewed at once; more get 429. At most half of upstream.max-reviews-inflight: tokens the cluster accepted are reviewed outside this pool, so a flood of bad tokens cannot delay them.")
	fs.IntVar(&c.MaxNewTokenReviewsPerSource, "upstream.max-new-token-reviews-inflight-per-source", 250, "Of upstream.max-new-token-reviews-inflight, how many one client address may hold; more get 429.")
}

func (c *Config) Enabled() bool { return c.Kubeconfig != "" }

// Validate reports configuration errors of cluster mode.
func (c *Config) Validate() error {
	if !c.Enabled() {
		if c.Servers != "" {
			return errors.New("upstream.servers needs upstream.kubeconfig")
		}
		return nil
	}
	var errs []error
	for _, s := range service.SplitList(c.Servers) {
		if u, err := url.Parse(s); err != nil || u.Scheme != "https" || u.Host == "" {
			errs = append(errs, fmt.Errorf("upstream.servers: %q is not an https:// URL", s))
		}
	}
	if c.DialTimeout <= 0 || c.ResponseTimeout <= 0 || c.HealthInterval <= 0 || c.ReviewTimeout <= 0 || c.LongRunningTimeout <= 0 {
		errs = append(errs, errors.New("upstream.dial-timeout, upstream.response-timeout, upstream.health-interval, upstream.review-timeout and upstream.long-running-timeout must be positive"))
	}
	if c.AuthnCacheTTL < 0 || c.AuthnNegativeCacheTTL < 0 || c.AuthzAllowCacheTTL < 0 || c.AuthzDenyCacheTTL < 0 {
		errs = append(errs, errors.New("upstream cache TTLs must not be negative"))
	}
	if c.AuthzCacheBytes < 0 || c.AuthzCacheBytesPerUser < 0 {
		errs = append(errs, errors.New("upstream.authorization-cache-bytes and upstream.authorization-cache-bytes-per-user must not be negative"))
	}
	errs = append(errs, c.validateReviews())
	return errors.Join(errs...)
}

// RestConfig loads Herald's own client configuration for the upstream.
func (c *Config) RestConfig() (*rest.Config, error) {
	if _, err := os.Stat(c.Kubeconfig); err != nil {
		return nil, fmt.Errorf("upstream.kubeconfig: %w", err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("upstream.kubeconfig %s: %w", c.Kubeconfig, err)
	}
	if cfg.Impersonate.UserName != "" || len(cfg.Impersonate.Groups) > 0 {
		return nil, fmt.Errorf("upstream.kubeconfig %s: must not impersonate (Herald impersonates its callers)", c.Kubeconfig)
	}
	cfg.Dial = (&net.Dialer{Timeout: c.DialTimeout, KeepAlive: 30 * time.Second}).DialContext
	// The client chose its encoding; the proxy must not add gzip of its own.
	cfg.DisableCompression = true
	cfg.UserAgent = "herald-frontdoor"
	return cfg, nil
}

// upstreamServer is one kube-apiserver address.
type upstreamServer struct {
	url  *url.URL
	open atomic.Int64
	// downSince is when it failed (unix nanos; 0: up). It is avoided until
	// a /readyz check started after that answers.
	downSince atomic.Int64
}

func (s *upstreamServer) markDown() { s.downSince.Store(time.Now().UnixNano()) }

// Proxy forwards requests to the kube-apiserver(s).
type Proxy struct {
	log     *slog.Logger
	servers []*upstreamServer
	next    atomic.Uint64
	// rt carries normal requests (HTTP/2 when the upstream offers it);
	// upgradeRT carries upgrades, which only HTTP/1.1 has.
	rt, upgradeRT http.RoundTripper
	proxy         *httputil.ReverseProxy
	// responseTimeout bounds the wait for the response headers only.
	responseTimeout time.Duration
}

// errUpstreamTimeout: the upstream did not start answering in time.
var errUpstreamTimeout = errors.New("upstream response timeout")

type forwardKey struct{}

// forward is one request on its way upstream.
type forward struct {
	user    user.Info
	server  *upstreamServer
	auditID string // frontdoor's answer carries it (withAuditID)
}

// New returns the proxy to c's servers, with Herald's own client
// configuration cfg.
func New(c Config, cfg *rest.Config, log *slog.Logger) (*Proxy, error) {
	u := &Proxy{log: log, responseTimeout: c.ResponseTimeout}
	addrs := service.SplitList(c.Servers)
	if len(addrs) == 0 {
		addrs = []string{cfg.Host}
	} else if cfg.TLSClientConfig.ServerName == "" {
		// The servers are addresses of the kubeconfig's server: its
		// certificate is for the kubeconfig's name.
		if h, err := url.Parse(cfg.Host); err == nil {
			cfg = rest.CopyConfig(cfg)
			cfg.TLSClientConfig.ServerName = h.Hostname()
		}
	}
	for _, a := range addrs {
		pu, err := url.Parse(strings.TrimRight(a, "/"))
		if err != nil || pu.Host == "" {
			return nil, fmt.Errorf("upstream server %q: not a URL", a)
		}
		u.servers = append(u.servers, &upstreamServer{url: pu})
	}
	var err error
	if u.rt, err = rest.TransportFor(cfg); err != nil {
		return nil, fmt.Errorf("upstream transport: %w", err)
	}
	h1 := rest.CopyConfig(cfg)
	h1.TLSClientConfig.NextProtos = []string{"http/1.1"}
	if u.upgradeRT, err = rest.TransportFor(h1); err != nil {
		return nil, fmt.Errorf("upstream transport: %w", err)
	}
	u.proxy = &httputil.ReverseProxy{
		Transport:      roundTripperFunc(u.roundTrip),
		FlushInterval:  -1, // watches, logs, exec: every write goes out at once
		Rewrite:        u.rewrite,
		ModifyResponse: setAuditID,
		ErrorHandler:   u.fail,
	}
	return u, nil
}

// setAuditID gives kube-apiserver's answer the request's audit ID, once:
// kube-apiserver echoes the one it was sent.
func setAuditID(resp *http.Response) error {
	fw := resp.Request.Context().Value(forwardKey{}).(*forward)
	resp.Header.Set(auditinternal.HeaderAuditID, fw.auditID)
	return nil
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// roundTrip sends r on the transport its kind needs and gives the upstream
// responseTimeout to start answering; once it has, the answer streams for
// as long as the client's request lasts (its context ends this one's).
func (u *Proxy) roundTrip(r *http.Request) (*http.Response, error) {
	rt := u.rt
	if httpstream.IsUpgradeRequest(r) {
		rt = u.upgradeRT
	}
	ctx, cancel := context.WithCancel(r.Context())
	var fired atomic.Bool
	timer := time.AfterFunc(u.responseTimeout, func() { fired.Store(true); cancel() })
	resp, err := rt.RoundTrip(r.WithContext(ctx))
	if !timer.Stop() && fired.Load() {
		if resp != nil {
			resp.Body.Close()
		}
		return nil, errUpstreamTimeout
	}
	if err != nil {
		cancel()
		return nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		resp.Body = &endAtLifetime{ReadCloser: resp.Body, ctx: r.Context()}
	}
	return resp, nil
}

// rewrite aims the outgoing request at the chosen server and replaces every
// identity header with the caller's impersonation.
func (u *Proxy) rewrite(pr *httputil.ProxyRequest) {
	fw := pr.In.Context().Value(forwardKey{}).(*forward)
	pr.SetURL(fw.server.url)
	pr.SetXForwarded()
	setImpersonation(pr.Out.Header, fw.user)
	// frontdoor's server tells a client that expects it to continue, as it
	// reads the body to forward it: kube-apiserver's 100 would be a second.
	pr.Out.Header.Del("Expect")
	if fw.auditID != "" {
		pr.Out.Header.Set(auditinternal.HeaderAuditID, fw.auditID)
	}
}

// setImpersonation removes every credential and identity header a client
// sent and names u by impersonation; Herald's own credentials are added by
// the transport (which only adds them when no Authorization is present:
// removing the client's is what keeps its token from reaching the upstream).
func setImpersonation(h http.Header, u user.Info) {
	DropIdentity(h)
	h.Set(authenticationv1.ImpersonateUserHeader, u.GetName())
	if u.GetUID() != "" {
		h.Set(authenticationv1.ImpersonateUIDHeader, u.GetUID())
	}
	for _, g := range u.GetGroups() {
		h.Add(authenticationv1.ImpersonateGroupHeader, g)
	}
	for k, vs := range u.GetExtra() {
		hk := extraHeaderName(k) // identity.go
		for _, v := range vs {
			h.Add(hk, v)
		}
	}
}

// DropIdentity removes every credential and identity header a client may
// send (Authorization, Cookie, Impersonate-*, X-Remote-*) before a request
// leaves frontdoor, upstream or to fanout.
func DropIdentity(h http.Header) {
	for k := range h {
		lk := strings.ToLower(k)
		if strings.HasPrefix(lk, "impersonate-") || strings.HasPrefix(lk, "x-remote-") {
			delete(h, k)
		}
	}
	h.Del("Authorization")
	h.Del("Cookie")
}

// fail answers a request the upstream did not answer.
func (u *Proxy) fail(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return // the client left
	}
	fw := r.Context().Value(forwardKey{}).(*forward)
	// What serve took off for kube-apiserver's answer.
	w.Header().Set(auditinternal.HeaderAuditID, fw.auditID)
	w.Header().Set("Cache-Control", cacheControl)
	var tooLarge *http.MaxBytesError
	var nerr net.Error
	switch {
	case errors.As(err, &tooLarge):
		kube.WriteStatus(w, apierr.BodyTooLarge(tooLarge.Limit))
		return
	case errors.Is(err, errUpstreamTimeout) || (errors.As(err, &nerr) && nerr.Timeout()):
		u.log.Warn("upstream timed out", "server", fw.server.url.Host, "path", r.URL.Path, "err", err)
		kube.WriteStatus(w, apierrors.NewTimeoutError("the upstream kube-apiserver did not answer in time", 1))
	default:
		u.log.Warn("upstream failed", "server", fw.server.url.Host, "path", r.URL.Path, "err", err)
		kube.WriteStatus(w, apierr.Unavailable("the upstream kube-apiserver is unavailable: "+errClass(err)))
	}
	// Whether the server is gone or a pooled connection to it broke, avoid
	// it until its /readyz answers again (with several servers).
	fw.server.markDown()
}

// errClass names a transport error without details a client should not see
// (addresses of the upstream).
func errClass(err error) string {
	switch {
	case isConnectError(err):
		return "connection refused or unreachable"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	}
	return "connection failed"
}

func isConnectError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// pick returns the server for one request: the least busy of those that
// are up, round-robin among equals; when all are down, the next in turn (it
// may have come back).
func (u *Proxy) pick() *upstreamServer {
	n := len(u.servers)
	off := int(u.next.Add(1) % uint64(n))
	var best *upstreamServer
	for i := range n {
		s := u.servers[(off+i)%n]
		if s.downSince.Load() != 0 {
			continue
		}
		if best == nil || s.open.Load() < best.open.Load() {
			best = s
		}
	}
	if best == nil {
		best = u.servers[off]
	}
	return best
}

// Serve forwards r as who.
func (u *Proxy) Serve(w http.ResponseWriter, r *http.Request, who user.Info) {
	if !forwardable(who) {
		// The transport would refuse the request, which would look like
		// the upstream's failure (and mark it down for everyone).
		kube.WriteStatus(w, apierrors.NewInternalError(errIdentityNotForwardable))
		return
	}
	s := u.pick()
	s.open.Add(1)
	defer s.open.Add(-1)
	// The audit ID goes upstream with the request and comes back on the
	// final answer (ModifyResponse, fail); until then it stays off w,
	// whose headers the proxy writes, and then clears, with a 1xx.
	fw := &forward{user: who, server: s, auditID: w.Header().Get(auditinternal.HeaderAuditID)}
	w.Header().Del(auditinternal.HeaderAuditID)
	// kube-apiserver's answer carries its own.
	w.Header().Del("Cache-Control")
	u.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), forwardKey{}, fw)))
}

// HealthCheck marks servers up or down by their /readyz until ctx ends;
// with one server there is nothing to choose, and its errors reach clients
// as 503 anyway.
func (u *Proxy) HealthCheck(ctx context.Context, every time.Duration) {
	if len(u.servers) < 2 {
		return
	}
	client := &http.Client{Transport: u.rt, Timeout: max(every, 2*time.Second)}
	service.Every(ctx, every, func() {
		for _, s := range u.servers {
			started := time.Now().UnixNano()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.url.String()+"/readyz", nil)
			resp, err := client.Do(req)
			ok := err == nil && resp.StatusCode == http.StatusOK
			if resp != nil {
				resp.Body.Close()
			}
			since := s.downSince.Load()
			switch {
			case ok && since != 0 && since < started:
				s.downSince.CompareAndSwap(since, 0)
			case !ok && since == 0:
				u.log.Warn("upstream server not ready; avoiding it", "server", s.url.Host, "err", err)
				s.markDown()
			}
		}
	})
}

// ServersDown is how many servers are avoided now (marked down until their
// /readyz answers).
func (u *Proxy) ServersDown() int {
	n := 0
	for _, s := range u.servers {
		if s.downSince.Load() != 0 {
			n++
		}
	}
	return n
}

// cacheControl is kube-apiserver's Cache-Control of every answer.
const cacheControl = "no-cache, private"
