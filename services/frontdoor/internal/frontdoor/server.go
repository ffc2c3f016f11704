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
//  6. the resource path against the registry (404/400), then RBAC for the
//     verb, resource and namespace (rbac.go): 403;
//  7. the limits (limits.go): 429 with Retry-After, per user and overall,
//     watches and other requests separately;
//  8. option validation (resourceVersion, selectors, continue, limit): 400
//     or 422 before any backend is asked;
//  9. LIST/GET from the cache over gRPC; WATCH proxied to a fanout replica
//     (proxy.go) with the user's identity in headers, never the credential.
//
// Errors reach clients as Kubernetes Status objects, mapped in one place
// (errors.go, kube.WriteStatus / kube.FromGRPC).
package frontdoor

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/rv"
)

type metrics struct {
	requests        *prometheus.CounterVec
	duration        *prometheus.HistogramVec
	longrunning     *prometheus.GaugeVec
	currentInflight *prometheus.GaugeVec
	rejected        *prometheus.CounterVec
	authnFailures   *prometheus.CounterVec
	reloads         *prometheus.CounterVec
	fanoutRetries   *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{Name: "apiserver_request_total", Help: "Requests by verb, resource and HTTP code."}, []string{"verb", "resource", "code"}),
		duration: f.NewHistogramVec(prometheus.HistogramOpts{Name: "apiserver_request_duration_seconds", Help: "Non-watch request latency by verb and resource.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"verb", "resource"}),
		longrunning:     f.NewGaugeVec(prometheus.GaugeOpts{Name: "apiserver_longrunning_requests", Help: "Open long-running requests (watches)."}, []string{"verb", "resource"}),
		currentInflight: f.NewGaugeVec(prometheus.GaugeOpts{Name: "apiserver_current_inflight_requests", Help: "Requests holding a slot of the in-flight limits, by kind (readOnly, watch)."}, []string{"request_kind"}),
		rejected:        f.NewCounterVec(prometheus.CounterOpts{Name: "herald_frontdoor_rejected_requests_total", Help: "Requests refused with 429 by kind (readOnly, watch) and limit (total, per-user, fair-share)."}, []string{"request_kind", "limit"}),
		authnFailures:   f.NewCounterVec(prometheus.CounterOpts{Name: "authentication_attempts_failed_total", Help: "Requests answered 401, by whether they carried credentials."}, []string{"credentials"}),
		reloads:         f.NewCounterVec(prometheus.CounterOpts{Name: "herald_frontdoor_config_reloads_total", Help: "Reloads of changed files (certificate, tokens, client CA, keys, RBAC) by result."}, []string{"what", "result"}),
		fanoutRetries:   f.NewCounterVec(prometheus.CounterOpts{Name: "herald_frontdoor_fanout_retries_total", Help: "Watches retried on another fanout replica, by the replica that failed."}, []string{"fanout"}),
	}
}

// Server is the frontdoor's HTTP handler.
type Server struct {
	cfg      Config
	log      *slog.Logger
	reg      *kube.Registry
	authn    *authenticator
	rbac     *reloadable[policy] // nil: no manifests, only system:masters
	cert     *reloadable[tls.Certificate]
	cache    heraldv1.CacheClient
	tracer   trace.Tracer // nil: tracing off
	disc     *discovery
	m        *metrics
	fanout   *fanoutPool
	requests *limiter
	watches  *limiter
	checks   []func() bool
	metricsH http.Handler
	debugH   http.Handler
}

// NewServer builds the handler and loads every file it depends on; gather
// (may be nil) serves /metrics on the public port to authorized users.
func NewServer(cfg Config, log *slog.Logger, cache heraldv1.CacheClient, promReg prometheus.Registerer, gather prometheus.Gatherer, opts ...Option) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	reg, err := kube.LoadRegistry(cfg.ResourcesFile, cfg.Prefix)
	if err != nil {
		return nil, err
	}
	m := newMetrics(promReg)
	s := &Server{cfg: cfg, log: log, reg: reg, cache: cache, disc: newDiscovery(reg), m: m,
		requests: newLimiter(cfg.MaxInflight, cfg.MaxInflightPerUser),
		watches:  newLimiter(cfg.MaxWatches, cfg.MaxWatchesPerUser),
	}
	watch := func(check func(*slog.Logger, *prometheus.CounterVec) bool) {
		s.checks = append(s.checks, func() bool { return check(log, m.reloads) })
	}
	if s.cert, err = newReloadable("serving certificate", staticFiles(cfg.TLSCertFile, cfg.TLSKeyFile), func() (*tls.Certificate, error) {
		c, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
		return &c, err
	}); err != nil {
		return nil, err
	}
	watch(s.cert.check)
	a := &authenticator{anonymous: cfg.AnonymousAuth, now: time.Now, issuers: splitList(cfg.SAIssuers), audiences: splitList(cfg.APIAudiences)}
	if len(a.audiences) == 0 {
		a.audiences = a.issuers
	}
	if cfg.TokenFile != "" {
		if a.tokens, err = newReloadable("token file", staticFiles(cfg.TokenFile), func() (*tokenFile, error) { return loadTokens(cfg.TokenFile) }); err != nil {
			return nil, err
		}
		watch(a.tokens.check)
	}
	if cfg.ClientCAFile != "" {
		if a.clientCAs, err = newReloadable("client CA", staticFiles(cfg.ClientCAFile), func() (*x509.CertPool, error) { return loadCertPool(cfg.ClientCAFile) }); err != nil {
			return nil, err
		}
		watch(a.clientCAs.check)
	}
	if keys := splitList(cfg.SAKeyFiles); len(keys) > 0 {
		if a.saKeys, err = newReloadable("service account keys", staticFiles(keys...), func() (*saKeySet, error) { return loadSAKeys(keys) }); err != nil {
			return nil, err
		}
		watch(a.saKeys.check)
	}
	s.authn = a
	if cfg.AuthorizationDir != "" {
		files := manifestFiles(cfg.AuthorizationDir)
		if s.rbac, err = newReloadable("rbac", files, func() (*policy, error) {
			paths, err := files()
			if err != nil {
				return nil, err
			}
			return loadPolicy(paths)
		}); err != nil {
			return nil, err
		}
		watch(s.rbac.check)
	}
	if s.fanout, err = newFanoutPool(cfg, log, m); err != nil {
		return nil, err
	}
	for _, o := range opts {
		o(s)
	}
	s.fanout.tracer = s.tracer
	if gather != nil {
		s.metricsH = promhttp.HandlerFor(gather, promhttp.HandlerOpts{})
	}
	dbg := http.NewServeMux()
	dbg.HandleFunc("/debug/pprof/", pprof.Index)
	dbg.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	dbg.HandleFunc("/debug/pprof/profile", pprof.Profile)
	dbg.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	dbg.HandleFunc("/debug/pprof/trace", pprof.Trace)
	s.debugH = dbg
	return s, nil
}

// Run reloads changed files until ctx ends.
func (s *Server) Run(ctx context.Context) {
	go s.fanout.resolve(ctx, max(s.cfg.FanoutResolve, 100*time.Millisecond))
	watchFiles(ctx, s.cfg.ReloadInterval, s.checks...)
}

// HTTPServer is the public server: TLS 1.2+, HTTP/2 and HTTP/1.1, the
// serving certificate reloaded when it changes, client certificates
// requested (verified by the authenticator, so a bad one is a 401, not a
// failed handshake), and the slow-client bounds. Requests' contexts derive
// from base.
func (s *Server) HTTPServer(base context.Context) *http.Server {
	tc := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		NextProtos:     []string{"h2", "http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.cert.Get(), nil },
	}
	if s.authn.clientCAs != nil {
		tc.ClientAuth = tls.RequestClientCert
	}
	return &http.Server{
		Handler:   s,
		TLSConfig: tc,
		// Bounds the TLS handshake and the request headers together: a
		// slowloris connection is closed after this, whatever it sends.
		ReadHeaderTimeout: s.cfg.ReadHeaderTime,
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    s.cfg.MaxHeaderBytes,
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: s.cfg.HTTP2MaxStreams},
		BaseContext:       func(net.Listener) context.Context { return base },
		// Handshake failures of scanners and floods are not worth a line
		// each at the default level.
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
}

// statusRecorder captures the response code for metrics and the audit log.
type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// auditEntry is what the audit line says about one request.
type auditEntry struct {
	user, authn, verb, resource, ns, reason string
}

// ServeHTTP serves one request; the package comment lists the steps.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rec := &statusRecorder{ResponseWriter: w}
	var ae auditEntry
	defer func() {
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
		attrs := []any{"user", ae.user, "verb", ae.verb, "resource", ae.resource, "namespace", ae.ns,
			"path", r.URL.Path, "code", code, "duration", time.Since(start).Round(time.Microsecond)}
		if ae.authn != "" {
			attrs = append(attrs, "authn", ae.authn)
		}
		if ae.reason != "" {
			attrs = append(attrs, "reason", ae.reason)
		}
		s.log.Info("audit", attrs...)
	}()

	if r.ContentLength > s.cfg.MaxBodyBytes {
		kube.WriteStatus(rec, errBodyTooLarge(s.cfg.MaxBodyBytes))
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
	u, err := s.authn.authenticate(r)
	if err != nil {
		ae.reason = err.Error()
		creds := "invalid"
		if err == errNoCredentials {
			creds = "none"
		}
		s.m.authnFailures.WithLabelValues(creds).Inc()
		kube.WriteStatus(rec, errUnauthorized())
		return
	}
	ae.user, ae.authn = u.Name, u.Method
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		kube.WriteStatus(rec, apierrors.NewMethodNotSupported(schema.GroupResource{}, r.Method))
		return
	}
	if h := s.nonResource(r.URL.Path); h != nil {
		a := attributes{user: u, verb: "get", path: r.URL.Path}
		if !s.allowed(a) {
			ae.reason = forbiddenReason(a)
			kube.WriteStatus(rec, errForbidden(a))
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
		kube.WriteStatus(rec, err)
		return
	}
	ae.verb, ae.resource, ae.ns = string(info.Verb), info.Resource.ID(), info.Namespace
	a := attributes{user: u, verb: string(info.Verb), resourceRequest: true, group: info.Resource.Group,
		resource: info.Resource.Plural, namespace: info.Namespace, name: info.Name}
	if !s.allowed(a) {
		ae.reason = forbiddenReason(a)
		kube.WriteStatus(rec, errForbidden(a))
		return
	}
	if info.Verb == kube.VerbWatch {
		if err := validateWatch(info, q); err != nil {
			kube.WriteStatus(rec, err)
			return
		}
		release, ok := s.admit(rec, s.watches, "watch", u)
		if !ok {
			return
		}
		defer release()
		s.m.longrunning.WithLabelValues("WATCH", info.Resource.ID()).Inc()
		defer s.m.longrunning.WithLabelValues("WATCH", info.Resource.ID()).Dec()
		s.fanout.serve(rec, r, u)
		return
	}
	req, err := listRequest(info, q)
	if err != nil {
		kube.WriteStatus(rec, err)
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
	s.list(ctx, rec, r, info, req)
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

func (s *Server) allowed(a attributes) bool {
	if s.rbac == nil {
		return a.user.inGroup(groupMasters)
	}
	return s.rbac.Get().authorize(a)
}

// admit takes a slot of l for u, or answers 429.
func (s *Server) admit(w http.ResponseWriter, l *limiter, kind string, u *User) (func(), bool) {
	release, refused := l.acquire(u.Name)
	if refused != "" {
		s.m.rejected.WithLabelValues(kind, refused).Inc()
		msg := "Too many requests, please try again later."
		if kind == "watch" {
			msg = "Too many watches, please try again later."
		}
		kube.WriteStatus(w, errTooMany(msg))
		return nil, false
	}
	g := s.m.currentInflight.WithLabelValues(kind)
	g.Inc()
	return func() { g.Dec(); release() }, true
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
	var limit int64
	if v := q.Get("limit"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return nil, badRequest("limit must be a non-negative integer")
		}
		limit = n
	}
	if q.Get("sendInitialEvents") != "" {
		return nil, kube.FromGRPC(statusInvalid("sendInitialEvents is forbidden for list"))
	}
	req := &heraldv1.ListRequest{
		Resource: info.Resource.ID(), Namespace: info.Namespace, Name: info.Name,
		ResourceVersion: q.Get("resourceVersion"), ResourceVersionMatch: q.Get("resourceVersionMatch"),
		LabelSelector: q.Get("labelSelector"), FieldSelector: q.Get("fieldSelector"),
		Limit: limit, Continue: q.Get("continue"),
	}
	if _, err := rv.PlanList(req.ResourceVersion, req.ResourceVersionMatch, req.Continue, req.Limit); err != nil {
		return nil, optionError(err)
	}
	if _, err := kube.ParseSelector(info.Resource, info.Namespace, req.LabelSelector, req.FieldSelector); err != nil {
		return nil, optionError(err)
	}
	return req, nil
}

// validateWatch checks a watch's options as fanout will, so that a bad
// request costs no connection to a replica.
func validateWatch(info kube.RequestInfo, q url.Values) error {
	fieldSel := q.Get("fieldSelector")
	if info.Name != "" {
		fs, err := fields.ParseSelector(fieldSel)
		if err != nil {
			return badRequest("invalid field selector: " + err.Error())
		}
		fieldSel = fields.AndSelectors(fs, fields.OneTermEqualSelector("metadata.name", info.Name)).String()
	}
	if _, err := kube.ParseSelector(info.Resource, info.Namespace, q.Get("labelSelector"), fieldSel); err != nil {
		return optionError(err)
	}
	var sendInitial *bool
	if v := q.Get("sendInitialEvents"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return badRequest("sendInitialEvents must be true or false")
		}
		sendInitial = &b
	}
	bookmarks := false
	if v := q.Get("allowWatchBookmarks"); v != "" {
		var err error
		if bookmarks, err = strconv.ParseBool(v); err != nil {
			return badRequest("allowWatchBookmarks must be true or false")
		}
	}
	if _, err := rv.PlanWatch(q.Get("resourceVersion"), q.Get("resourceVersionMatch"), sendInitial, bookmarks); err != nil {
		return optionError(err)
	}
	if v := q.Get("timeoutSeconds"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err != nil || n < 0 {
			return badRequest("timeoutSeconds must be a non-negative integer")
		}
	}
	return nil
}

// list serves LIST and GET from the cache.
func (s *Server) list(ctx context.Context, w http.ResponseWriter, r *http.Request, info kube.RequestInfo, req *heraldv1.ListRequest) {
	resp, err := s.cache.List(ctx, req)
	if err != nil {
		apiErr := kube.FromGRPC(err)
		if info.Name != "" && apierrors.IsNotFound(apiErr) {
			apiErr = apierrors.NewNotFound(schema.GroupResource{Group: info.Resource.Group, Resource: info.Resource.Plural}, info.Name)
		}
		if kube.StatusOf(apiErr).Code == http.StatusInternalServerError {
			s.log.Error("cache LIST failed", "resource", info.Resource.ID(), "err", err)
		}
		kube.WriteStatus(w, apiErr)
		return
	}
	if info.Name != "" && len(resp.Items) == 0 {
		kube.WriteStatus(w, apierrors.NewNotFound(schema.GroupResource{Group: info.Resource.Group, Resource: info.Resource.Plural}, info.Name))
		return
	}
	table := kube.WantsTable(r.Header.Get("Accept"))
	var body []byte
	ct := "application/json"
	switch {
	case table:
		ct = "application/json;as=Table;v=v1;g=meta.k8s.io"
		lm := metav1.ListMeta{ResourceVersion: strconv.FormatInt(resp.Revision, 10), Continue: resp.Continue, RemainingItemCount: resp.RemainingItemCount}
		if info.Name != "" {
			lm = metav1.ListMeta{ResourceVersion: strconv.FormatInt(resp.Revision, 10)}
		}
		body = kube.Table(info.Resource, resp.Items, lm, true, time.Now())
	case info.Name != "":
		body = resp.Items[0]
	default:
		body = encodeList(info.Resource, resp)
	}
	s.write(w, r, ct, body)
}

// encodeList assembles a list from the items' bytes without re-encoding
// them.
func encodeList(res *kube.Resource, resp *heraldv1.ListResponse) []byte {
	size := 128
	for _, it := range resp.Items {
		size += len(it) + 1
	}
	b := bytes.NewBuffer(make([]byte, 0, size))
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
		b.Write(it)
	}
	b.WriteString("]}")
	return b.Bytes()
}

func (s *Server) write(w http.ResponseWriter, r *http.Request, contentType string, body []byte) {
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Cache-Control", "no-cache, private")
	if len(body) >= s.cfg.GzipMinBytes && acceptsGzip(r) {
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Add("Vary", "Accept-Encoding")
		w.WriteHeader(http.StatusOK)
		gz, _ := gzip.NewWriterLevel(w, gzip.BestSpeed)
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

func acceptsGzip(r *http.Request) bool {
	for _, p := range strings.Split(r.Header.Get("Accept-Encoding"), ",") {
		if enc, _, _ := strings.Cut(strings.TrimSpace(p), ";"); enc == "gzip" {
			return true
		}
	}
	return false
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
