// Package frontdoor owns Herald's only public door: TLS, authentication,
// RBAC authorization, request limits, the Kubernetes-compatible HTTP API
// (discovery, LIST, GET), and routing of watches to fanout replicas. It
// keeps no state a client depends on.
//
// Every request goes through the same steps, in this order, and is logged
// once (the audit line: user, verb, resource, namespace, code, duration;
// never a credential):
//
//  1. size limits (headers by net/http, bodies here: 413);
//  2. /livez, /readyz, /healthz answer anyone;
//  3. authentication (authn.go): 401 unless some credential is valid;
//  4. only GET and HEAD (405);
//  5. discovery and /version for every authenticated user; /metrics and
//     /debug/pprof only when RBAC allows the path (nonResourceURLs);
//  6. the resource path against the registry (404/400), a list's or
//     watch's selectors (400: unparsable or past max-selector-bytes), then
//     RBAC for the attributes kube-apiserver's request info gives
//     (attributes.go; rbac.go): 403;
//  7. the limits (limits.go): 429 with Retry-After, per user and overall,
//     watches and other requests separately;
//  8. content negotiation (negotiate.go): 406 for what kube-apiserver
//     refuses; then option validation (resourceVersion, selectors, continue,
//     limit): 400 or 422 before any backend is asked (errors from here on in
//     the negotiated media type);
//  9. LIST/GET from the cache over gRPC, encoded as negotiated; WATCH
//     proxied to a fanout replica (proxy.go) with the user's identity in
//     headers, never the credential, and the client's Accept.
//
// Every response but a watch's must reach the client within write-timeout
// of its first byte (statusRecorder): a client that stops reading cannot
// hold a request slot, or the body encoded for it, for longer. Forwarded
// long-running requests have their own bounds (longrunning.go).
//
// Errors reach clients as Kubernetes Status objects, mapped in one place
// (errors.go, kube.WriteStatus / kube.FromGRPC).
//
// In cluster mode (--upstream.kubeconfig; upstream.go, delegated.go) step 3
// asks the cluster (TokenReview; no local tokens, keys or RBAC are allowed)
// and refuses a token bound to a pod or node the cache no longer holds
// (bound.go);
// Impersonate-* headers are then authorized by the cluster, every request
// but the reads of step 9 and /metrics, /debug/pprof is forwarded to
// kube-apiserver as the caller (skipping steps 4-9), and steps 5-6 ask the
// cluster (SubjectAccessReview) instead of local RBAC.
package frontdoor

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	auditinternal "k8s.io/apiserver/pkg/apis/audit"

	"herald.dev/libs/cacheclient"
	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/rv"
	"herald.dev/libs/service"
	"herald.dev/libs/storage"
	"herald.dev/libs/watchsession"
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

// Server is the frontdoor's HTTP handler.
type Server struct {
	cfg     Config
	log     *slog.Logger
	reg     *kube.Registry
	authn   *authenticator
	cluster *cluster             // nil: standalone; else in front of kube-apiserver (delegated.go)
	rbac    *trustSource[policy] // nil: no manifests, only system:masters
	trust   *trustSources        // the trust files, failing closed (reload.go)
	cert    *service.Reloadable[tls.Certificate]
	cache   heraldv1.CacheClient
	codec   *storage.Codec      // protobuf and metadata encodings
	neg     *storage.Negotiator // content negotiation
	tracer  trace.Tracer        // nil: tracing off
	disc    *discovery
	// deprecations: the Warning header of a deprecated API version.
	deprecations *deprecations
	m            *metrics
	fanout       *fanoutPool
	requests     *limiter
	watches      *limiter
	checks       []func() bool
	loaded       []reloadable
	metricsH     http.Handler
	debugH       http.Handler
	audit        *auditLog // nil: no audit log (audit.go)
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
	codec, err := storage.NewCodec(nil)
	if err != nil {
		return nil, err
	}
	m := newMetrics(promReg)
	s := &Server{cfg: cfg, log: log, cache: cache, m: m, codec: codec, neg: storage.NewNegotiator(),
		requests: newLimiter(cfg.MaxInflight, cfg.MaxInflightPerUser),
		watches:  newLimiter(cfg.MaxWatches, cfg.MaxWatchesPerUser),
	}
	s.requests.inUseGauge = m.currentInflight.WithLabelValues("readOnly")
	s.watches.inUseGauge = m.currentInflight.WithLabelValues("watch")
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
	a := &authenticator{anonymous: cfg.AnonymousAuth, now: time.Now, issuers: service.SplitList(cfg.SAIssuers), audiences: service.SplitList(cfg.APIAudiences)}
	if len(a.audiences) == 0 {
		a.audiences = a.issuers
	}
	if err := s.loadTrust(cfg, a, promReg); err != nil { // reload.go: fail closed
		return nil, err
	}
	s.authn = a
	s.deprecations = newDeprecations(standaloneVersion)
	if cfg.Upstream.enabled() {
		if s.cluster, err = newCluster(cfg.Upstream, log, promReg); err != nil {
			return nil, err
		}
		s.deprecations = newDeprecations(s.cluster.version)
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
	s.disc = newDiscovery(s.reg)
	s.fanout.tracer = s.tracer
	if gather != nil {
		s.metricsH = promhttp.HandlerFor(gather, promhttp.HandlerOpts{})
	}
	s.debugH = service.PprofHandler()
	if s.audit, err = newAuditLog(cfg.Audit, log, promReg); err != nil {
		return nil, err
	}
	return s, nil
}

// CloseAudit writes the audit events queued and closes the audit log.
func (s *Server) CloseAudit() { s.audit.close() }

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
		go s.cluster.up.healthCheck(ctx, s.cfg.Upstream.HealthInterval)
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
	if s.authn.clientCAs != nil {
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
	// onStatus runs once, on the response's final status (audit.go).
	onStatus func(code int)
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

// auditEntry is what the audit line says about one request.
type auditEntry struct {
	user, authn, verb, resource, ns, reason string
	// forwarded: answered by kube-apiserver (cluster mode). resource is
	// then a metric label only for resources frontdoor knows; the audit
	// line names the request's own, upstreamResource, when set.
	forwarded        bool
	upstreamResource string
	// who: the authenticated user; as: the user it impersonates, in
	// cluster mode (the audit event, audit.go).
	who, as *User
}

// ServeHTTP serves one request; the package comment lists the steps.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	auditID := withAuditID(w, r)
	// kube-apiserver's default for every answer: all are authenticated.
	w.Header().Set("Cache-Control", cacheControl)
	rec := &statusRecorder{ResponseWriter: w, writeTimeout: s.cfg.WriteTimeout}
	var ae auditEntry
	au, r := s.audit.begin(r, auditID, start, &ae)
	rec.onStatus = au.responseStarted
	end := &requestEnd{}
	defer end.handlerReturned()
	path := r.URL.Path // not r: a detached watch's end must not keep the request
	end.add(func() {
		code := rec.code
		if code == 0 {
			code = http.StatusOK
		}
		if ae.verb != "" {
			s.m.requests.WithLabelValues(ae.verb, ae.resource, strconv.Itoa(code)).Inc()
			if ae.verb != string(kube.VerbWatch) {
				s.m.duration.WithLabelValues(ae.verb, ae.resource).Observe(time.Since(start).Seconds())
			}
		}
		if ae.forwarded {
			s.m.forwarded.WithLabelValues(ae.verb, strconv.Itoa(code)).Inc()
		}
		resource := ae.resource
		if ae.upstreamResource != "" {
			resource = ae.upstreamResource
		}
		attrs := []any{"user", ae.user, "verb", ae.verb, "resource", resource, "namespace", ae.ns,
			"path", path, "code", code, "duration", time.Since(start).Round(time.Microsecond), "auditID", auditID}
		if ae.authn != "" {
			attrs = append(attrs, "authn", ae.authn)
		}
		if rec.timedOut {
			s.m.writeTimeouts.Inc()
			ae.reason = "client did not read the response within write-timeout"
		}
		if ae.reason != "" {
			attrs = append(attrs, "reason", ae.reason)
		}
		s.log.Info("audit", attrs...)
		au.complete(code)
	})

	if r.ContentLength > s.cfg.MaxBodyBytes {
		s.writeStatus(rec, r, errBodyTooLarge(s.cfg.MaxBodyBytes))
		return
	}
	if r.Body != nil {
		r.Body = http.MaxBytesReader(rec, r.Body, s.cfg.MaxBodyBytes)
	}
	switch r.URL.Path {
	case "/livez", "/readyz", "/healthz":
		rec.Write([]byte("ok"))
		return
	}
	u, err := s.authenticate(r)
	if err != nil {
		ae.reason = err.Error()
		creds := "invalid"
		if err == errNoCredentials {
			creds = "none"
		}
		if errors.Is(err, errReviewThrottled) {
			kube.WriteStatus(rec, errTooMany("Too many requests, please try again later."))
			return
		}
		if errors.Is(err, errReviewFailed) {
			kube.WriteStatus(rec, errUnavailable("the cluster could not authenticate the request: its TokenReview failed"))
			return
		}
		s.m.authnFailures.WithLabelValues(creds).Inc()
		s.writeStatus(rec, r, errUnauthorized())
		return
	}
	ae.user, ae.authn, ae.who = u.Name, u.Method, u
	if s.cluster != nil && s.clusterRoute(rec, r, &u, &ae) {
		return // forwarded upstream, or impersonation refused
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		s.writeStatus(rec, r, apierrors.NewMethodNotSupported(schema.GroupResource{}, r.Method))
		return
	}
	if h := s.nonResource(r.URL.Path); h != nil {
		a, err := requestAttributes(r, u)
		if err != nil {
			s.writeStatus(rec, r, apierrors.NewInternalError(err))
			return
		}
		if ok, why, fail := s.allowed(r, a); !ok {
			ae.reason = forbiddenReason(a)
			if fail != nil {
				ae.reason = fail.Error()
			}
			s.writeStatus(rec, r, cmp.Or(fail, errForbidden(a, why)))
			return
		}
		release, ok := s.admit(rec, s.requests, "readOnly", u)
		if !ok {
			return
		}
		defer release()
		h.ServeHTTP(rec, r)
		return
	}
	if s.disc.has(r.URL.Path) {
		// Discovery is every authenticated user's (kube-apiserver's
		// system:discovery binding), within the request limits.
		release, ok := s.admit(rec, s.requests, "readOnly", u)
		if !ok {
			return
		}
		defer release()
		s.disc.serve(rec, r.URL.Path)
		return
	}
	q := r.URL.Query()
	info, err := s.reg.ParseRequest(r.URL.Path, q)
	if err != nil {
		s.writeStatus(rec, r, err)
		return
	}
	ae.verb, ae.resource, ae.ns = string(info.Verb), info.Resource.ID(), info.Namespace
	// Selectors are checked (parsed, bounded) before a review carries them.
	if err := checkSelectors(info, q, s.cfg.MaxSelectorBytes); err != nil {
		s.writeStatus(rec, r, err)
		return
	}
	a, err := servedAttributes(r, u, info)
	if err != nil {
		s.writeStatus(rec, r, err)
		return
	}
	if ok, why, fail := s.allowed(r, a); !ok {
		ae.reason = forbiddenReason(a)
		if fail != nil {
			ae.reason = fail.Error()
		}
		s.writeStatus(rec, r, cmp.Or(fail, errForbidden(a, why)))
		return
	}
	if h := s.deprecations.header(info.Resource); h != "" {
		rec.Header().Add("Warning", h)
	}
	// Content negotiation comes first, as in kube-apiserver's handlers.
	n, err := s.negotiate(r, info)
	if err != nil {
		s.writeStatus(rec, r, err)
		return
	}
	if info.Verb == kube.VerbWatch {
		rec.writeTimeout = 0 // nothing written yet; a watch is long-running
		// Validated here, once, so that a bad request costs no connection
		// to a replica; fanout gets the request as parsed.
		wr, err := kube.ParseWatch(info, q)
		if err != nil {
			s.writeStatus(rec, r, err)
			return
		}
		if err := s.negotiateWatch(r, info); err != nil {
			s.writeStatus(rec, r, err)
			return
		}
		// The initialization holds a request slot until a replica has
		// started the stream (at the latest until the handler returns);
		// the established watch only its watch slot (see limiter), which
		// is released when the watch ends (end): after its handler
		// returns if its stream is detached.
		initDone, ok := s.admit(rec, s.requests, "readOnly", u)
		if !ok {
			return
		}
		defer initDone()
		release, ok := s.admit(rec, s.watches, "watch", u)
		if !ok {
			return
		}
		end.add(release)
		open := s.m.longrunning.WithLabelValues("WATCH", info.Resource.ID())
		open.Inc()
		end.add(open.Dec)
		end.detached = func(code int) {
			rec.code = code
			au.responseStarted(code)
			// The recorder outlives the handler (the audit line reads it):
			// it must not keep net/http's response, and through it the
			// connection's buffers, alive.
			rec.ResponseWriter = nil
		}
		s.fanout.serve(rec, r, info, wr, initDone, end)
		return
	}
	req, err := listRequest(info, q)
	if err != nil {
		s.writeStatus(rec, r, err)
		return
	}
	release, ok := s.admit(rec, s.requests, "readOnly", u)
	if !ok {
		return
	}
	defer release()
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	ctx = identityMetadata(ctx, u)
	if s.list(ctx, rec, r, info, req, n) {
		return
	}
	// Older than the cache's window (an exact resourceVersion, a paged list
	// at one, a continue token): kube-apiserver reads etcd for it, and
	// answers as the caller is allowed. Its reply carries its own warnings.
	rec.Header().Del("Warning")
	ae.reason, ae.forwarded = "upstream: older than the cache's window", true
	s.m.olderThanWindow.WithLabelValues(info.Resource.ID()).Inc()
	s.cluster.up.serve(rec, r, u)
}

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
func (s *Server) allowed(r *http.Request, a attributes) (ok bool, why string, fail error) {
	defer func() { auditDecision(r.Context(), ok, why) }()
	if s.cluster != nil {
		return s.cluster.authorize(r.Context(), a)
	}
	if s.rbac == nil {
		return a.user.inGroup(groupMasters), "", nil
	}
	return s.rbac.Get().authorize(a), "", nil
}

// admit takes a slot of l for u, or answers 429. The returned release may
// be called more than once.
func (s *Server) admit(w http.ResponseWriter, l *limiter, kind string, u *User) (func(), bool) {
	release, refused := l.acquire(u.Name) // counted in currentInflight by l
	if refused != "" {
		s.m.rejected.WithLabelValues(kind, refused).Inc()
		msg := "Too many requests, please try again later."
		if kind == "watch" {
			msg = "Too many watches, please try again later."
		}
		kube.WriteStatus(w, errTooMany(msg))
		return nil, false
	}
	return release, true
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

// listRequest validates a LIST or GET's options before the cache sees them.
func listRequest(info kube.RequestInfo, q url.Values) (*heraldv1.ListRequest, error) {
	prefix := info.Resource.NamespacePrefix(info.Namespace)
	if info.Name != "" {
		// A GET reads GetOptions, whose only option is resourceVersion:
		// kube-apiserver ignores a list's (limit, continue, selectors,
		// resourceVersionMatch) on it.
		req := &heraldv1.ListRequest{Resource: info.Resource.ID(), Namespace: info.Namespace, Name: info.Name, ResourceVersion: q.Get("resourceVersion")}
		if _, err := rv.PlanList(req.ResourceVersion, "", "", 0, prefix); err != nil {
			return nil, kube.ListPlanError(err, req.ResourceVersion)
		}
		return req, nil
	}
	var limit int64
	if v := q.Get("limit"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return nil, badRequest("limit must be an integer")
		}
		// kube-apiserver lists everything for a negative limit, as for none.
		limit = max(n, 0)
	}
	req := &heraldv1.ListRequest{
		Resource: info.Resource.ID(), Namespace: info.Namespace, Name: info.Name,
		ResourceVersion: q.Get("resourceVersion"), ResourceVersionMatch: q.Get("resourceVersionMatch"),
		LabelSelector: q.Get("labelSelector"), FieldSelector: q.Get("fieldSelector"),
		Limit: limit, Continue: q.Get("continue"),
	}
	// kube-apiserver's order: the parameters' syntax, their combination
	// (422), the field labels, then what its storage reads (the
	// resourceVersion, the continue token).
	if _, err := kube.ParseSelector(info.Resource, info.Namespace, req.LabelSelector, req.FieldSelector); err != nil {
		return nil, kube.OptionError(err)
	}
	if err := kube.ValidateListOptions(q); err != nil {
		return nil, err
	}
	if _, err := rv.PlanList(req.ResourceVersion, req.ResourceVersionMatch, req.Continue, req.Limit, prefix); err != nil {
		return nil, kube.ListPlanError(err, req.ResourceVersion)
	}
	return req, nil
}

// list serves LIST and GET from the cache. In cluster mode it leaves a list
// older than the cache's window unanswered (false), for kube-apiserver; one
// at a revision etcd has compacted it answers (kube.CompactedError).
func (s *Server) list(ctx context.Context, w http.ResponseWriter, r *http.Request, info kube.RequestInfo, req *heraldv1.ListRequest, n storage.Negotiated) bool {
	resp, err := s.cache.List(ctx, req)
	if err != nil {
		apiErr := kube.FromGRPC(err)
		if s.cluster != nil && info.Name == "" && apierrors.IsResourceExpired(apiErr) && !kube.Compacted(err) {
			return false
		}
		if info.Name != "" && apierrors.IsNotFound(apiErr) {
			apiErr = apierrors.NewNotFound(schema.GroupResource{Group: info.Resource.Group, Resource: info.Resource.Plural}, info.Name)
		}
		if kube.StatusOf(apiErr).Code == http.StatusInternalServerError {
			s.log.Error("cache LIST failed", "resource", info.Resource.ID(), "err", err)
		}
		s.writeStatus(w, r, apiErr)
		return true
	}
	if info.Name != "" && len(resp.Items) == 0 {
		s.writeStatus(w, r, apierrors.NewNotFound(schema.GroupResource{Group: info.Resource.Group, Resource: info.Resource.Plural}, info.Name))
		return true
	}
	ct, body, err := s.body(info, resp, n, kube.IncludeObject(r.URL.Query().Get("includeObject")), time.Now())
	if err != nil {
		if kube.StatusOf(err).Code == http.StatusInternalServerError {
			s.log.Error("encoding a response failed", "resource", info.Resource.ID(), "err", err)
		}
		s.writeStatus(w, r, err)
		return true
	}
	s.write(w, r, ct, body)
	return true
}

// encodeList assembles a list from the items' bytes without re-encoding
// them.
func encodeList(res *kube.Resource, resp *heraldv1.ListResponse) []byte {
	b := listBuffer(resp)
	b.WriteString(`{"kind":"`)
	b.WriteString(res.Kind)
	b.WriteString(`List","apiVersion":"`)
	b.WriteString(res.GroupVersion())
	b.WriteString(`","metadata":{"resourceVersion":"`)
	b.WriteString(strconv.FormatInt(resp.Revision, 10))
	b.WriteByte('"')
	if resp.Continue != "" {
		b.WriteString(`,"continue":"`)
		b.WriteString(resp.Continue)
		b.WriteByte('"')
	}
	if resp.RemainingItemCount != nil {
		b.WriteString(`,"remainingItemCount":`)
		b.WriteString(strconv.FormatInt(*resp.RemainingItemCount, 10))
	}
	b.WriteString(`},"items":[`)
	for i, it := range resp.Items {
		if i > 0 {
			b.WriteByte(',')
		}
		// An item as kube's JSON serializer ends it, with a newline, is
		// embedded without it, and without its TypeMeta: kube-apiserver
		// encodes the list, whose items carry no kind/apiVersion.
		it = bytes.TrimSuffix(it, []byte("\n"))
		if rest, ok := withoutTypeMeta(it); ok {
			b.WriteByte('{')
			b.Write(rest)
		} else {
			b.Write(it)
		}
	}
	b.WriteString("]}")
	return b.Bytes()
}

// listBuffer is a buffer with room for a list of resp's items.
func listBuffer(resp *heraldv1.ListResponse) *bytes.Buffer {
	size := 160
	for _, it := range resp.Items {
		size += len(it) + 1
	}
	return bytes.NewBuffer(make([]byte, 0, size))
}

// encodeUnstructuredList assembles a list of custom resources as
// kube-apiserver writes one (an unstructured.UnstructuredList, encoded as a
// map: keys sorted, "continue" always in the metadata, the items whole),
// from the items' bytes without re-encoding them.
func encodeUnstructuredList(res *kube.Resource, resp *heraldv1.ListResponse) []byte {
	b := listBuffer(resp)
	b.WriteString(`{"apiVersion":"`)
	b.WriteString(res.GroupVersion())
	b.WriteString(`","items":[`)
	for i, it := range resp.Items {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(bytes.TrimSuffix(it, []byte("\n")))
	}
	b.WriteString(`],"kind":"`)
	b.WriteString(res.Kind)
	b.WriteString(`List","metadata":{"continue":"`)
	b.WriteString(resp.Continue)
	b.WriteByte('"')
	if resp.RemainingItemCount != nil {
		b.WriteString(`,"remainingItemCount":`)
		b.WriteString(strconv.FormatInt(*resp.RemainingItemCount, 10))
	}
	b.WriteString(`,"resourceVersion":"`)
	b.WriteString(strconv.FormatInt(resp.Revision, 10))
	b.WriteString(`"}}`)
	return b.Bytes()
}

// withoutTypeMeta returns what follows the leading
// `{"kind":"…","apiVersion":"…",` that kube's JSON serializer writes first in
// an object (the object's other fields and its closing brace), so the cache's
// bytes are shared (encoded once) between GET/watch, which keep TypeMeta, and
// LIST items, which must not carry it. ok is false for anything else
// (hand-written values in another order), which is embedded unchanged.
func withoutTypeMeta(it []byte) (rest []byte, ok bool) {
	rest, ok = bytes.CutPrefix(it, []byte(`{"kind":"`))
	if !ok {
		return nil, false
	}
	i := bytes.IndexByte(rest, '"')
	if i < 0 {
		return nil, false
	}
	rest, ok = bytes.CutPrefix(rest[i+1:], []byte(`,"apiVersion":"`))
	if !ok {
		return nil, false
	}
	i = bytes.IndexByte(rest, '"')
	if i < 0 {
		return nil, false
	}
	rest = rest[i+1:]
	switch {
	case len(rest) > 1 && rest[0] == ',':
		return rest[1:], true
	case len(rest) > 0 && rest[0] == '}':
		return rest, true
	}
	return nil, false
}

func (s *Server) write(w http.ResponseWriter, r *http.Request, contentType string, body []byte) {
	w.Header().Set("Content-Type", contentType)
	if len(body) >= s.cfg.GzipMinBytes && service.AcceptsGzip(r) {
		gz := service.GzipResponse(w)
		w.WriteHeader(http.StatusOK)
		gz.Write(body)
		gz.Close()
		return
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		w.Write(body)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
