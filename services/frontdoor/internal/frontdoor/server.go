// Package frontdoor owns Herald's only public door: TLS, authentication,
// the Kubernetes-compatible HTTP API (discovery, LIST, GET), and routing of
// watches to fanout replicas. It keeps no state a client depends on.
//
// Errors reach clients as Kubernetes Status objects, mapped in one place
// (kube.WriteStatus / kube.FromGRPC), and each request is logged once.
package frontdoor

import (
	"bytes"
	"compress/gzip"
	"context"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	inflight *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{Name: "apiserver_request_total", Help: "Requests by verb, resource and HTTP code."}, []string{"verb", "resource", "code"}),
		duration: f.NewHistogramVec(prometheus.HistogramOpts{Name: "apiserver_request_duration_seconds", Help: "Non-watch request latency by verb and resource.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"verb", "resource"}),
		inflight: f.NewGaugeVec(prometheus.GaugeOpts{Name: "apiserver_longrunning_requests", Help: "Open long-running requests (watches)."}, []string{"verb", "resource"}),
	}
}

// Server is the frontdoor's HTTP handler.
type Server struct {
	cfg     Config
	log     *slog.Logger
	reg     *kube.Registry
	auth    *tokenAuth
	cache   heraldv1.CacheClient
	disc    *discovery
	m       *metrics
	fanouts []*backend
	next    atomic.Uint64
}

// backend is one fanout replica.
type backend struct {
	url   *url.URL
	proxy *httputil.ReverseProxy
	open  atomic.Int64
	down  atomic.Int64 // unix nanos until which it is considered down
}

// NewServer builds the handler.
func NewServer(cfg Config, log *slog.Logger, cache heraldv1.CacheClient, promReg prometheus.Registerer) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	reg, err := kube.LoadRegistry(cfg.ResourcesFile, cfg.Prefix)
	if err != nil {
		return nil, err
	}
	auth, err := loadTokens(cfg.TokenFile)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: log, reg: reg, auth: auth, cache: cache, disc: newDiscovery(reg), m: newMetrics(promReg)}
	for _, a := range cfg.fanouts() {
		u, err := url.Parse(a)
		if err != nil || u.Host == "" {
			return nil, apierrors.NewBadRequest("fanout.addrs: bad URL " + a)
		}
		b := &backend{url: u}
		b.proxy = &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.SetURL(u)
				pr.Out.Header.Del("Authorization")
			},
			FlushInterval: -1,
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
				if r.Context().Err() != nil {
					return // the client left
				}
				b.down.Store(time.Now().Add(time.Second).UnixNano())
				log.Warn("fanout unreachable", "fanout", u.Host, "err", err)
				kube.WriteStatus(w, apierrors.NewServiceUnavailable("no watch server is reachable, please try again"))
			},
		}
		s.fanouts = append(s.fanouts, b)
	}
	return s, nil
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

// ServeHTTP authenticates and serves one request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rec := &statusRecorder{ResponseWriter: w}
	verb, resource, ns, user := "", "", "", ""
	defer func() {
		code := rec.code
		if code == 0 {
			code = http.StatusOK
		}
		if verb != "" {
			s.m.requests.WithLabelValues(verb, resource, strconv.Itoa(code)).Inc()
			if verb != string(kube.VerbWatch) {
				s.m.duration.WithLabelValues(verb, resource).Observe(time.Since(start).Seconds())
			}
		}
		s.log.Info("audit", "user", user, "verb", verb, "resource", resource, "namespace", ns,
			"path", r.URL.Path, "code", code, "duration", time.Since(start).Round(time.Microsecond))
	}()

	switch r.URL.Path {
	case "/livez", "/readyz", "/healthz":
		rec.Write([]byte("ok"))
		return
	}
	u, ok := s.auth.authenticate(r)
	if !ok {
		kube.WriteStatus(rec, apierrors.NewUnauthorized("Unauthorized"))
		return
	}
	user = u.Name
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		kube.WriteStatus(rec, apierrors.NewMethodNotSupported(schema.GroupResource{}, r.Method))
		return
	}
	if s.disc.serve(rec, r.URL.Path) {
		return
	}
	q := r.URL.Query()
	info, err := s.reg.ParseRequest(r.URL.Path, q)
	if err != nil {
		kube.WriteStatus(rec, err)
		return
	}
	verb, resource, ns = string(info.Verb), info.Resource.ID(), info.Namespace
	if info.Verb == kube.VerbWatch {
		s.watch(rec, r, info)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	s.list(ctx, rec, r, info, q)
}

// watch forwards to the least loaded reachable fanout replica.
func (s *Server) watch(w http.ResponseWriter, r *http.Request, info kube.RequestInfo) {
	s.m.inflight.WithLabelValues("WATCH", info.Resource.ID()).Inc()
	defer s.m.inflight.WithLabelValues("WATCH", info.Resource.ID()).Dec()
	b := s.pickFanout()
	b.open.Add(1)
	defer b.open.Add(-1)
	b.proxy.ServeHTTP(w, r)
}

func (s *Server) pickFanout() *backend {
	now := time.Now().UnixNano()
	var best *backend
	n := len(s.fanouts)
	off := int(s.next.Add(1))
	for i := range n {
		b := s.fanouts[(off+i)%n]
		if b.down.Load() > now {
			continue
		}
		if best == nil || b.open.Load() < best.open.Load() {
			best = b
		}
	}
	if best == nil {
		best = s.fanouts[off%n]
	}
	return best
}

// list serves LIST and GET from the cache.
func (s *Server) list(ctx context.Context, w http.ResponseWriter, r *http.Request, info kube.RequestInfo, q url.Values) {
	var limit int64
	if v := q.Get("limit"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			kube.WriteStatus(w, apierrors.NewBadRequest("limit must be a non-negative integer"))
			return
		}
		limit = n
	}
	if q.Get("sendInitialEvents") != "" {
		kube.WriteStatus(w, kube.FromGRPC(statusInvalid("sendInitialEvents is forbidden for list")))
		return
	}
	resp, err := s.cache.List(ctx, &heraldv1.ListRequest{
		Resource: info.Resource.ID(), Namespace: info.Namespace, Name: info.Name,
		ResourceVersion: q.Get("resourceVersion"), ResourceVersionMatch: q.Get("resourceVersionMatch"),
		LabelSelector: q.Get("labelSelector"), FieldSelector: q.Get("fieldSelector"),
		Limit: limit, Continue: q.Get("continue"),
	})
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
