// Package frontdoor owns Herald's only public door: TLS, authentication,
// RBAC authorization, request limits, the Kubernetes-compatible HTTP API
// (discovery, LIST, GET), and routing of watches to fanout replicas. It
// keeps no state a client depends on.
//
// Every request goes through the same steps, in this order, each a filter
// of the handler's chain (handler.go), and is logged once (the audit line:
// user, verb, resource, namespace, code, duration; never a credential):
//
//  1. withAudit: the audit ID, the audit event, the status recorder and
//     the audit line;
//  2. withBodyLimit: size limits (headers by net/http, bodies here: 413);
//  3. withHealth: /livez, /readyz, /healthz answer anyone;
//  4. withAuthentication (internal/authn): 401 unless some credential is valid;
//  5. withReadOnly: only GET and HEAD (405);
//  6. withRequestInfo: discovery and /version, /metrics and /debug/pprof,
//     or the resource path against the registry (404/400) and a list's or
//     watch's selectors (400: unparsable or past max-selector-bytes);
//  7. withAuthorization: RBAC for the attributes kube-apiserver's request
//     info gives (internal/authz): 403; discovery and /version are
//     every authenticated user's, /metrics and /debug/pprof only when RBAC
//     allows the path (nonResourceURLs);
//  8. withOptions: content negotiation (negotiate.go): 406 for what
//     kube-apiserver refuses; then option validation (resourceVersion,
//     selectors, continue, limit): 400 or 422 before any backend is asked
//     (errors from step 6 on in the negotiated media type);
//  9. withLimits (internal/limits): 429 with Retry-After, per user and overall,
//     watches and other requests separately;
//  10. route: LIST/GET from the cache over gRPC, encoded as negotiated;
//     WATCH proxied to a fanout replica (proxy.go) with the user's
//     identity in headers, never the credential, and the client's Accept.
//
// Every response but a watch's must reach the client within write-timeout
// of its first byte (statusRecorder): a client that stops reading cannot
// hold a request slot, or the body encoded for it, for longer. Forwarded
// long-running requests have their own bounds (longrunning.go,
// upstream.StreamWriter).
//
// Errors reach clients as Kubernetes Status objects, mapped in one place
// (internal/apierr, kube.WriteStatus / kube.FromGRPC).
//
// In cluster mode (--upstream.kubeconfig; internal/upstream, delegated.go)
// step 4 asks the cluster (TokenReview; no local tokens, keys or RBAC are
// allowed) and refuses a token bound to a pod or node the cache no longer
// holds (authn.CheckBound); then withClusterRouting has Impersonate-* headers authorized by the
// cluster and forwards every request but the reads of step 10 and /metrics,
// /debug/pprof to kube-apiserver as the caller (skipping steps 5-10), and
// step 7 asks the cluster (SubjectAccessReview) instead of local RBAC.
package frontdoor

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
	auditinternal "k8s.io/apiserver/pkg/apis/audit"

	"herald.dev/libs/cacheclient"
	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/service"
	"herald.dev/libs/watchsession"
	"herald.dev/services/frontdoor/internal/audit"
	"herald.dev/services/frontdoor/internal/authn"
	"herald.dev/services/frontdoor/internal/authz"
	"herald.dev/services/frontdoor/internal/discovery"
	"herald.dev/services/frontdoor/internal/limits"
	"herald.dev/services/frontdoor/internal/reads"
	"herald.dev/services/frontdoor/internal/trust"
)

type metrics struct {
	requests        *prometheus.CounterVec
	duration        *prometheus.HistogramVec
	longrunning     *prometheus.GaugeVec
	currentInflight *prometheus.GaugeVec
	rejected        *prometheus.CounterVec
	authnFailures   *prometheus.CounterVec
	reloads         *prometheus.CounterVec
	reloadOK        *prometheus.GaugeVec
	writeTimeouts   prometheus.Counter
	fanoutRetries   *prometheus.CounterVec
	fanoutShed      *prometheus.CounterVec
	olderThanWindow *prometheus.CounterVec
	forwarded       *prometheus.CounterVec
	// sessions: the fanout pool's, once it exists (its shared bytes).
	sessions atomic.Pointer[watchsession.Client]
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{Name: "apiserver_request_total", Help: "Requests by verb, resource and HTTP code."}, []string{"verb", "resource", "code"}),
		duration: f.NewHistogramVec(prometheus.HistogramOpts{Name: "apiserver_request_duration_seconds", Help: "Non-watch request latency by verb and resource.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"verb", "resource"}),
		longrunning:     f.NewGaugeVec(prometheus.GaugeOpts{Name: "apiserver_longrunning_requests", Help: "Open long-running requests (watches)."}, []string{"verb", "resource"}),
		currentInflight: f.NewGaugeVec(prometheus.GaugeOpts{Name: "apiserver_current_inflight_requests", Help: "Requests holding a slot of the in-flight limits, by kind (readOnly, watch)."}, []string{"request_kind"}),
		rejected:        f.NewCounterVec(prometheus.CounterOpts{Name: "herald_frontdoor_rejected_requests_total", Help: "Requests refused with 429 by kind (readOnly, watch) and limit (total, per-user, fair-share)."}, []string{"request_kind", "limit"}),
		authnFailures:   f.NewCounterVec(prometheus.CounterOpts{Name: "authentication_attempts_failed_total", Help: "Requests answered 401, by whether they carried credentials."}, []string{"credentials"}),
		reloads:         f.NewCounterVec(prometheus.CounterOpts{Name: "herald_frontdoor_config_reloads_total", Help: "Reloads of changed files (certificate, tokens, client CA, keys, RBAC) by result."}, []string{"what", "result"}),
		reloadOK: f.NewGaugeVec(prometheus.GaugeOpts{Name: "herald_frontdoor_config_last_reload_successful",
			Help: "0 while a changed file (certificate, tokens, client CA, keys, RBAC) fails to load and the last good one is served; 1 otherwise."}, []string{"what"}),
		writeTimeouts: f.NewCounter(prometheus.CounterOpts{Name: "herald_frontdoor_response_write_timeouts_total",
			Help: "Non-watch responses cut because the client did not read them within write-timeout."}),
		fanoutRetries: f.NewCounterVec(prometheus.CounterOpts{Name: "herald_frontdoor_fanout_retries_total", Help: "Watches retried on another fanout replica, by the replica that failed."}, []string{"fanout"}),
		fanoutShed:    f.NewCounterVec(prometheus.CounterOpts{Name: "herald_frontdoor_fanout_rebalanced_watches_total", Help: "Watches ended (the client resumes) to move them off a fanout replica holding more than its share, by that replica."}, []string{"fanout"}),
		olderThanWindow: f.NewCounterVec(prometheus.CounterOpts{Name: "herald_frontdoor_lists_older_than_window_total",
			Help: "Lists at a revision older than the cache's window (or, split over shards, a shard's window; exact, paged or continued), forwarded to kube-apiserver in cluster mode, by resource."}, []string{"resource"}),
		forwarded: f.NewCounterVec(prometheus.CounterOpts{Name: "herald_frontdoor_forwarded_requests_total",
			Help: "Requests answered by kube-apiserver in cluster mode (everything but the reads frontdoor serves), by verb and HTTP code."}, []string{"verb", "code"}),
	}
	f.NewGaugeFunc(prometheus.GaugeOpts{Name: "herald_frontdoor_watchmux_shared_bytes",
		Help: "Bytes of events shared by several watches that sessions to fanout replicas keep for them to refer to (up to fanout.shared-window each; fanout forgets those no watch used for 30-45 s)."},
		func() float64 {
			if c := m.sessions.Load(); c != nil {
				return float64(c.SharedBytes())
			}
			return 0
		})
	return m
}

// User is an authenticated identity (authn.User).
type User = authn.User

// Server is the frontdoor's HTTP handler.
type Server struct {
	cfg     Config
	log     *slog.Logger
	reg     *kube.Registry
	authn   *authn.Authenticator
	cluster *cluster                    // nil: standalone; else in front of kube-apiserver (delegated.go)
	rbac    *trust.Source[authz.Policy] // nil: no manifests, only system:masters
	trust   *trustSources               // the trust files, failing closed (reload.go)
	cert    *service.Reloadable[tls.Certificate]
	cache   heraldv1.CacheClient
	reads   *reads.Reads // LIST and GET from the cache
	tracer  trace.Tracer // nil: tracing off
	disc    *discovery.Docs
	// deprecations: the Warning header of a deprecated API version.
	deprecations *discovery.Deprecations
	m            *metrics
	fanout       *fanoutPool
	requests     *limits.Limiter
	watches      *limits.Limiter
	checks       []func() bool
	loaded       []reloadable
	metricsH     http.Handler
	debugH       http.Handler
	audit        *audit.Log // nil: no audit log (internal/audit)
	chain        http.Handler
}

// WithRegistry makes the server serve reg's resources (the registry its
// cache client routes with, so that both see the same custom resources)
// instead of loading its own from the configuration.
func WithRegistry(reg *kube.Registry) Option { return func(s *Server) { s.reg = reg } }

// NewServer builds the handler and loads every file it depends on; gather
// (may be nil) serves /metrics on the public port to authorized users.
func NewServer(cfg Config, log *slog.Logger, cache heraldv1.CacheClient, promReg prometheus.Registerer, gather prometheus.Gatherer, opts ...Option) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rd, err := reads.New(log, cfg.GzipMinBytes, cfg.Upstream.Enabled())
	if err != nil {
		return nil, err
	}
	m := newMetrics(promReg)
	s := &Server{cfg: cfg, log: log, cache: cache, m: m, reads: rd,
		requests: limits.New(cfg.MaxInflight, cfg.MaxInflightPerUser),
		watches:  limits.New(cfg.MaxWatches, cfg.MaxWatchesPerUser),
	}
	s.requests.InUseGauge = m.currentInflight.WithLabelValues("readOnly")
	s.watches.InUseGauge = m.currentInflight.WithLabelValues("watch")
	watch := func(r reloadable) {
		s.loaded = append(s.loaded, r)
		ok := m.reloadOK.WithLabelValues(r.Name())
		ok.Set(1)
		s.checks = append(s.checks, func() bool {
			changed := r.Check(log, m.reloads)
			if r.Err() != nil {
				ok.Set(0)
			} else {
				ok.Set(1)
			}
			return changed
		})
	}
	if s.cert, err = service.LoadKeyPair("serving certificate", cfg.TLSCertFile, cfg.TLSKeyFile); err != nil {
		return nil, err
	}
	watch(s.cert)
	a := &authn.Authenticator{Anonymous: cfg.AnonymousAuth, Now: time.Now, Issuers: service.SplitList(cfg.SAIssuers), Audiences: service.SplitList(cfg.APIAudiences)}
	if len(a.Audiences) == 0 {
		a.Audiences = a.Issuers
	}
	if err := s.loadTrust(cfg, a, promReg); err != nil { // reload.go: fail closed
		return nil, err
	}
	s.authn = a
	s.deprecations = discovery.NewDeprecations(discovery.StandaloneVersion)
	if cfg.Upstream.Enabled() {
		if s.cluster, err = newCluster(cfg.Upstream, log, promReg); err != nil {
			return nil, err
		}
		s.deprecations = discovery.NewDeprecations(s.cluster.version)
	}
	if s.fanout, err = newFanoutPool(cfg, log, m); err != nil {
		return nil, err
	}
	for _, o := range opts {
		o(s)
	}
	if s.reg == nil {
		if s.reg, err = kube.LoadRegistry(cfg.ResourcesFile, cfg.Prefix); err != nil {
			return nil, err
		}
	}
	s.disc = discovery.New(s.reg)
	s.fanout.tracer = s.tracer
	if gather != nil {
		s.metricsH = promhttp.HandlerFor(gather, promhttp.HandlerOpts{})
	}
	s.debugH = service.PprofHandler()
	if s.audit, err = audit.New(cfg.Audit, log, promReg); err != nil {
		return nil, err
	}
	s.chain = s.handler()
	return s, nil
}

// CloseAudit writes the audit events queued and closes the audit log.
func (s *Server) CloseAudit() { s.audit.Close() }

// reloadable is a file-backed value of the server (service.Reloadable).
type reloadable interface {
	Name() string
	Check(*slog.Logger, *prometheus.CounterVec) bool
	Err() error
}

// ConfigErrors reports the files that changed but failed to load (the last
// good ones are served): a readiness detail, not a reason to stop serving.
func (s *Server) ConfigErrors() error {
	var errs []error
	for _, r := range s.loaded {
		if err := r.Err(); err != nil {
			errs = append(errs, fmt.Errorf("%s: serving the last good one: %w", r.Name(), err))
		}
	}
	return errors.Join(errs...)
}

// Run reloads changed files until ctx ends.
func (s *Server) Run(ctx context.Context) {
	go s.fanout.run(ctx, max(s.cfg.FanoutResolve, 100*time.Millisecond))
	go cacheclient.FollowCRDs(ctx, s.cache, s.reg, s.log, nil)
	if s.cluster != nil {
		go s.cluster.up.HealthCheck(ctx, s.cfg.Upstream.HealthInterval)
	}
	service.WatchFiles(ctx, s.cfg.ReloadInterval, s.checks...)
}

// HTTPServer is the public server: TLS 1.2+, HTTP/2 and HTTP/1.1, the
// serving certificate reloaded when it changes, client certificates
// requested (verified by the authenticator, so a bad one is a 401, not a
// failed handshake), and the slow-client bounds.
func (s *Server) HTTPServer() *http.Server {
	tc := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		NextProtos:     []string{"h2", "http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.cert.Get(), nil },
	}
	if s.authn.ClientCAs != nil {
		tc.ClientAuth = tls.RequestClientCert
	}
	srv := &http.Server{
		Handler:   s,
		TLSConfig: tc,
		// Bounds the TLS handshake and the request headers together: a
		// slowloris connection is closed after this, whatever it sends.
		ReadHeaderTimeout: s.cfg.ReadHeaderTime,
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    s.cfg.MaxHeaderBytes,
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: s.cfg.HTTP2MaxStreams},
		// Handshake failures of scanners and floods are not worth a line
		// each at the default level.
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	// Detached watches (fanoutPool.detach) are no longer net/http's to end.
	srv.RegisterOnShutdown(s.fanout.shutdown)
	return srv
}

// WaitWatches waits, at most timeout, until the watches whose streams
// were detached from net/http (fanoutPool.detach) have ended: the server's
// Shutdown ends them, but does not wait for them as it does for handlers.
func (s *Server) WaitWatches(timeout time.Duration) bool { return s.fanout.waitDetached(timeout) }

// statusRecorder captures the response code for metrics and the audit log,
// and bounds the time the response may take to write.
//
// The write deadline (writeTimeout, when not zero) is set on the first byte
// of the response, per request (HTTP/1.1: the connection's, reset by
// net/http after the request; HTTP/2: the stream's). A client that stops
// reading then fails the handler's writes once it passes, so the handler
// returns and releases its request slot and the response body; the
// connection (HTTP/1.1) or the stream (HTTP/2) is reset. Watches clear
// writeTimeout before anything is written: their slow clients are fanout's
// to cut.
type statusRecorder struct {
	http.ResponseWriter
	code         int
	writeTimeout time.Duration
	deadline     time.Time // zero until the first byte
	timedOut     bool      // a write failed past the deadline
	// onStatus runs once, on the response's final status (audit.Record).
	onStatus func(code int)
	// scope is the request's, for the filters (handler.go).
	scope *requestScope
}

func (r *statusRecorder) WriteHeader(code int) {
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		// An informational answer (kube-apiserver's 100 Continue to a
		// forwarded request) is neither the request's status nor its
		// response: the final one follows.
		r.ResponseWriter.WriteHeader(code)
		return
	}
	if r.code == 0 {
		r.code = code
		if r.onStatus != nil {
			r.onStatus(code)
		}
	}
	r.armDeadline()
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
		if r.onStatus != nil {
			r.onStatus(r.code)
		}
	}
	r.armDeadline()
	n, err := r.ResponseWriter.Write(b)
	if err != nil && !r.deadline.IsZero() && !time.Now().Before(r.deadline) {
		r.timedOut = true
	}
	return n, err
}

func (r *statusRecorder) armDeadline() {
	if r.writeTimeout <= 0 || !r.deadline.IsZero() {
		return
	}
	r.deadline = time.Now().Add(r.writeTimeout)
	// Unsupported only by writers that are not a connection's (tests).
	_ = http.NewResponseController(r.ResponseWriter).SetWriteDeadline(r.deadline)
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// requestEnd is what a request does when it ends (release its slots,
// log its audit line): when its handler returns, or, for a watch whose
// stream was detached from its handler (fanoutPool.proxy), when the stream
// ends.
type requestEnd struct {
	fns []func()
	// detached, when not nil, marks a request whose stream may be
	// detached; it is called, with the response's status, when it is.
	detached func(code int)
	// streaming: the stream was detached and runs the request's end.
	streaming bool
}

// add has f run when the request ends, before what was added earlier (as
// defer does).
func (e *requestEnd) add(f func()) { e.fns = append(e.fns, f) }

// detach hands the request's end to a stream that outlives the handler.
func (e *requestEnd) detach(code int) {
	e.streaming = true
	e.detached(code)
}

// handlerReturned ends the request, unless its stream was detached.
func (e *requestEnd) handlerReturned() {
	if !e.streaming {
		e.run()
	}
}

func (e *requestEnd) run() {
	for i := len(e.fns) - 1; i >= 0; i-- {
		e.fns[i]()
	}
}

// ServeHTTP serves one request through the filter chain (handler.go); the
// package comment lists the steps.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.chain.ServeHTTP(w, r) }

// cacheControl is kube-apiserver's Cache-Control of every answer.
const cacheControl = "no-cache, private"

// withAuditID returns r's audit ID, as kube-apiserver chooses it: the
// client's Audit-ID header, or a new UUID. It is set in the response's
// headers, where kube-apiserver echoes it too, and where a request
// forwarded to kube-apiserver takes it from (upstream.serve), so that
// kube-apiserver audits it under the same ID.
func withAuditID(w http.ResponseWriter, r *http.Request) string {
	id := r.Header.Get(auditinternal.HeaderAuditID)
	if id == "" {
		id = uuid.NewString()
	}
	w.Header().Set(auditinternal.HeaderAuditID, id)
	return id
}

// nonResource returns the handler of an RBAC-guarded non-resource path.
func (s *Server) nonResource(path string) http.Handler {
	switch {
	case path == "/metrics" && s.metricsH != nil:
		return s.metricsH
	case path == "/debug/pprof" || strings.HasPrefix(path, "/debug/pprof/"):
		return s.debugH
	}
	return nil
}

// allowed authorizes a; why is the authorizer's reason for a denial (the
// cluster's, in cluster mode), which kube-apiserver appends to its 403;
// fail, when not nil, is the answer instead of a 403 (the cluster could not
// be asked: 429 or 503).
func (s *Server) allowed(r *http.Request, a authz.Attributes) (ok bool, why string, fail error) {
	defer func() { audit.Decision(r.Context(), ok, why) }()
	if s.cluster != nil {
		return s.cluster.authorize(r.Context(), a)
	}
	if s.rbac == nil {
		return authz.Superuser(a), "", nil
	}
	return s.rbac.Get().Authorize(a), "", nil
}

// identityMetadata tells the cache who asks (for its logs and, once it
// authorizes on its own, its decisions); the credential stays here.
func identityMetadata(ctx context.Context, u *User) context.Context {
	kv := []string{"x-remote-user", u.Name}
	for _, g := range u.Groups {
		kv = append(kv, "x-remote-group", g)
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
}
