// Package fanout owns client watch streams: one shared upstream stream per
// resource from the cache, each event encoded once, filtered per watcher and
// pushed into the watcher's bounded queue; a watcher that cannot keep up is
// closed and resumes from its last resourceVersion.
//
// Invariants:
//   - A watcher receives events in strictly increasing resourceVersion (events
//     of one transaction share one), each once: catch-up from the cache ends
//     at a revision r and the watcher joins the shared stream after r.
//   - Dispatch never blocks on a watcher.
//   - The replica keeps no state a client depends on: any replica can serve
//     any resume.
package fanout

import (
	"compress/gzip"
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/rv"
)

type metrics struct {
	watchers         prometheus.Gauge
	terminated       *prometheus.CounterVec
	events           *prometheus.CounterVec
	sent             *prometheus.CounterVec
	sentBytes        *prometheus.CounterVec
	latency          prometheus.Histogram
	upstreamRestarts *prometheus.CounterVec
	rejected         prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		watchers:         f.NewGauge(prometheus.GaugeOpts{Name: "herald_fanout_watchers", Help: "Open client watch streams on this replica."}),
		terminated:       f.NewCounterVec(prometheus.CounterOpts{Name: "apiserver_terminated_watchers_total", Help: "Watchers closed by the server, by resource and reason."}, []string{"resource", "reason"}),
		events:           f.NewCounterVec(prometheus.CounterOpts{Name: "apiserver_watch_cache_events_dispatched_total", Help: "Events received from the cache and dispatched to watchers, by resource."}, []string{"resource"}),
		sent:             f.NewCounterVec(prometheus.CounterOpts{Name: "apiserver_watch_events_total", Help: "Events written to watchers, by resource."}, []string{"resource"}),
		sentBytes:        f.NewCounterVec(prometheus.CounterOpts{Name: "herald_fanout_watch_bytes_total", Help: "Bytes written to watchers, by resource."}, []string{"resource"}),
		latency:          f.NewHistogram(prometheus.HistogramOpts{Name: "herald_event_delivery_latency_seconds", Help: "From ingest receiving a change from etcd to the event being written to a watcher.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18)}),
		upstreamRestarts: f.NewCounterVec(prometheus.CounterOpts{Name: "herald_fanout_upstream_restarts_total", Help: "Upstream cache streams re-established, by resource."}, []string{"resource"}),
		rejected:         f.NewCounter(prometheus.CounterOpts{Name: "herald_fanout_rejected_watches_total", Help: "Watches refused because the replica was at max-watchers."}),
	}
}

// Server is a fanout replica's watch HTTP handler.
type Server struct {
	cfg    Config
	log    *slog.Logger
	reg    *kube.Registry
	shards *kube.ShardMap
	caches map[string]heraldv1.CacheClient // by shard target
	m      *metrics
	ctx    context.Context
	tracer trace.Tracer // nil: tracing off

	mu       sync.Mutex
	hubs     map[string]*hub
	watchers atomic.Int64
}

// NewServer creates a replica serving watches from the cache shards of
// shards; dial connects to one shard's target. Hubs live until ctx ends.
func NewServer(ctx context.Context, cfg Config, log *slog.Logger, dial func(target string) (heraldv1.CacheClient, error), promReg prometheus.Registerer, opts ...Option) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	reg, err := kube.LoadRegistry(cfg.ResourcesFile, cfg.Prefix)
	if err != nil {
		return nil, err
	}
	shards, err := kube.ParseShardMap(cfg.ShardMap(), reg)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: log, reg: reg, shards: shards, caches: map[string]heraldv1.CacheClient{},
		m: newMetrics(promReg), ctx: ctx, hubs: map[string]*hub{}}
	for _, t := range shards.Targets() {
		if s.caches[t], err = dial(t); err != nil {
			return nil, err
		}
	}
	for _, o := range opts {
		o(s)
	}
	promReg.MustRegister(replicaCollector{s})
	return s, nil
}

// clients returns the shards serving r in namespace (all of r's shards for
// a cluster-wide request).
func (s *Server) clients(r *kube.Resource, namespace string) []heraldv1.CacheClient {
	if namespace != "" {
		return []heraldv1.CacheClient{s.caches[s.shards.For(r, namespace).Target]}
	}
	var out []heraldv1.CacheClient
	for _, sh := range s.shards.All(r) {
		out = append(out, s.caches[sh.Target])
	}
	return out
}

func (s *Server) hub(r *kube.Resource) *hub {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, ok := s.hubs[r.ID()]
	if !ok {
		h = newHub(r, s.clients(r, ""), ringLimits{events: s.cfg.RingSize, bytes: s.cfg.RingBytes}, s.log, s.m)
		h.tracer = s.tracer
		s.hubs[r.ID()] = h
		go h.run(s.ctx)
	}
	return h
}

func badRequest(msg string) error { return apierrors.NewBadRequest(msg) }

func planError(err error) error {
	if errors.Is(err, rv.ErrInvalidCombination) {
		return kube.FromGRPC(status.Error(codes.FailedPrecondition, err.Error()))
	}
	return badRequest(err.Error())
}

// ServeHTTP serves one watch request (the frontdoor has authenticated and
// authorized it).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		kube.WriteStatus(w, apierrors.NewMethodNotSupported(schemaGR(""), r.Method))
		return
	}
	q := r.URL.Query()
	info, err := s.reg.ParseRequest(r.URL.Path, q)
	if err != nil {
		kube.WriteStatus(w, err)
		return
	}
	if info.Verb != kube.VerbWatch {
		kube.WriteStatus(w, badRequest("this server only serves watch requests"))
		return
	}
	fieldSel := q.Get("fieldSelector")
	if info.Name != "" {
		// A watch on /{resource}/{name} watches one object.
		fs, err := fields.ParseSelector(fieldSel)
		if err != nil {
			kube.WriteStatus(w, badRequest("invalid field selector: "+err.Error()))
			return
		}
		fieldSel = fields.AndSelectors(fs, fields.OneTermEqualSelector("metadata.name", info.Name)).String()
	}
	sel, err := kube.ParseSelector(info.Resource, info.Namespace, q.Get("labelSelector"), fieldSel)
	if err != nil {
		kube.WriteStatus(w, err)
		return
	}
	var sendInitial *bool
	if v := q.Get("sendInitialEvents"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			kube.WriteStatus(w, badRequest("sendInitialEvents must be true or false"))
			return
		}
		sendInitial = &b
	}
	bookmarks := false
	if v := q.Get("allowWatchBookmarks"); v != "" {
		if bookmarks, err = strconv.ParseBool(v); err != nil {
			kube.WriteStatus(w, badRequest("allowWatchBookmarks must be true or false"))
			return
		}
	}
	plan, err := rv.PlanWatch(q.Get("resourceVersion"), q.Get("resourceVersionMatch"), sendInitial, bookmarks)
	if err != nil {
		kube.WriteStatus(w, planError(err))
		return
	}
	timeout := s.cfg.MinTimeout + rand.N(s.cfg.MaxTimeout-s.cfg.MinTimeout+1)
	if v := q.Get("timeoutSeconds"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			kube.WriteStatus(w, badRequest("timeoutSeconds must be a non-negative integer"))
			return
		}
		if n > 0 {
			timeout = time.Duration(min(n, 1<<31)) * time.Second
		}
	}
	if s.watchers.Add(1) > int64(s.cfg.MaxWatchers) {
		s.watchers.Add(-1)
		s.m.rejected.Inc()
		kube.WriteStatus(w, apierrors.NewTooManyRequests("too many watches on this replica, please try again later", 1))
		return
	}
	s.m.watchers.Inc()
	defer func() {
		s.watchers.Add(-1)
		s.m.watchers.Dec()
	}()
	h := s.hub(info.Resource)
	if !h.waitSynced(r.Context(), s.cfg.UpstreamWait) {
		kube.WriteStatus(w, apierrors.NewServiceUnavailable("the watch cache is not ready yet"))
		return
	}

	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	st := &stream{w: w, rc: http.NewResponseController(w), res: info.Resource, table: kube.WantsTable(r.Header.Get("Accept")), m: s.m}
	ct := "application/json"
	if st.table {
		ct = "application/json;as=Table;v=v1;g=meta.k8s.io"
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("Cache-Control", "no-cache, private")
	// Compress only streams that start with a list's worth of initial
	// state, and only when asked: compressing every event for every watcher
	// would undo encode-once (kube-apiserver never compresses watches).
	if s.cfg.GzipInitial && plan.Mode == rv.WatchFromState && acceptsGzip(r) {
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Add("Vary", "Accept-Encoding")
		gz, _ := gzip.NewWriterLevel(w, gzip.BestSpeed)
		defer gz.Close()
		st.gz = gz
	}
	st.traceLines = s.tracer != nil && st.gz == nil && r.Header.Get(TraceLinesHeader) == "1"
	w.WriteHeader(http.StatusOK)
	st.flush()

	wt := newWatcher(sel, s.cfg.QueueEvents, s.cfg.QueueBytes)
	// Once closed, the watcher has closeGrace to write what it had queued;
	// a write still blocked then fails and the handler returns.
	wt.abort = func() { st.rc.SetWriteDeadline(time.Now().Add(closeGrace)) }
	defer h.leave(wt)
	last, err := s.start(ctx, st, h, wt, info, plan)
	if err != nil {
		if ctx.Err() == nil {
			st.raw(kube.ErrorEvent(kube.FromGRPC(err)))
			st.flush()
		}
		return
	}
	s.serve(ctx, st, h, wt, last, bookmarks)
}

// start sends the initial events (if any) and catches the watcher up until
// it has joined the hub; it returns the revision it joined after.
func (s *Server) start(ctx context.Context, st *stream, h *hub, wt *watcher, info kube.RequestInfo, plan rv.WatchPlan) (int64, error) {
	clients := s.clients(info.Resource, info.Namespace)
	var last int64
	switch plan.Mode {
	case rv.WatchFromState:
		rev, err := s.initialState(ctx, st, wt.sel, clients, &heraldv1.WatchRequest{Resource: info.Resource.ID(), Namespace: info.Namespace,
			InitialEvents: true, MinRevision: plan.Rev, Consistent: plan.Consistent})
		if err != nil {
			return 0, err
		}
		if plan.InitialEventsEnd {
			st.raw(bookmarkLine(info.Resource, rev, true))
		}
		st.flush()
		last = rev
	case rv.WatchAfter:
		last = plan.Rev
	case rv.WatchFromNow:
		last = h.head.Load()
	}
	for {
		wt.after = last
		backlog, _, ok := h.join(wt, last)
		if ok {
			for _, it := range backlog {
				if t := it.transition(wt.sel); t != kube.Skip {
					st.event(it, t)
				}
			}
			st.flush()
			return last, st.err
		}
		rev, err := s.replay(ctx, st, wt.sel, clients, &heraldv1.WatchRequest{Resource: info.Resource.ID(), Namespace: info.Namespace, AfterRevision: last})
		if err != nil {
			return 0, err
		}
		if rev <= last {
			// The caches are no further than we are and the hub is not
			// synced yet: wait for it rather than spin.
			if !h.waitSynced(ctx, s.cfg.UpstreamWait) {
				return 0, status.Error(codes.Unavailable, "upstream not ready")
			}
			select {
			case <-ctx.Done():
				return 0, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
		last = max(last, rev)
	}
}

// read runs one non-following cache watch, calling fn for every event
// (bookmarks included) until the stream ends.
func read(ctx context.Context, c heraldv1.CacheClient, req *heraldv1.WatchRequest, fn func(*heraldv1.Event) bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cs, err := c.Watch(ctx, req)
	if err != nil {
		return err
	}
	for {
		resp, err := cs.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, ev := range resp.Events {
			if !fn(ev) {
				return nil
			}
		}
	}
}

// initialState writes the synthetic ADDED events of the state and returns
// its revision. Over several shards, the first one chooses the revision
// (consistent or not older than requested) and the others serve their state
// at exactly that revision, so the union is one consistent state.
func (s *Server) initialState(ctx context.Context, st *stream, sel *kube.Selector, clients []heraldv1.CacheClient, req *heraldv1.WatchRequest) (int64, error) {
	var rev int64
	for i, c := range clients {
		if i > 0 {
			req = &heraldv1.WatchRequest{Resource: req.Resource, Namespace: req.Namespace, InitialEvents: true, StateRevision: rev}
		}
		err := read(ctx, c, req, func(ev *heraldv1.Event) bool {
			if ev.Type == heraldv1.EventType_BOOKMARK {
				if i == 0 {
					rev = ev.Revision
				}
				return false // the state ends at its first bookmark
			}
			it := newItem(ev)
			if t := it.transition(sel); t != kube.Skip {
				st.event(it, t)
			}
			return st.err == nil
		})
		if err != nil {
			return 0, err
		}
		st.flush()
		if st.err != nil {
			return 0, st.err
		}
	}
	return rev, nil
}

// replay writes, filtered by sel and merged by revision across clients, the
// events after req.AfterRevision that every shard has passed, and returns
// the revision it is complete through.
func (s *Server) replay(ctx context.Context, st *stream, sel *kube.Selector, clients []heraldv1.CacheClient, req *heraldv1.WatchRequest) (int64, error) {
	lists := make([][]*heraldv1.Event, len(clients))
	through := int64(-1)
	for i, c := range clients {
		var t int64
		err := read(ctx, c, req, func(ev *heraldv1.Event) bool {
			if ev.Type == heraldv1.EventType_BOOKMARK {
				t = max(t, ev.Revision)
			} else {
				lists[i] = append(lists[i], ev)
			}
			return true
		})
		if err != nil {
			return 0, err
		}
		if through < 0 || t < through {
			through = t
		}
	}
	for {
		best := -1
		for i, l := range lists {
			if len(l) > 0 && l[0].Revision <= through && (best < 0 || l[0].Revision < lists[best][0].Revision) {
				best = i
			}
		}
		if best < 0 {
			break
		}
		it := newItem(lists[best][0])
		lists[best] = lists[best][1:]
		if t := it.transition(sel); t != kube.Skip {
			st.event(it, t)
		}
	}
	st.flush()
	return through, st.err
}

// serve drains the watcher's queue to the client until the client leaves,
// the watch times out or the watcher is closed.
func (s *Server) serve(ctx context.Context, st *stream, h *hub, wt *watcher, last int64, bookmarks bool) {
	var tick <-chan time.Time
	if bookmarks {
		t := time.NewTicker(s.cfg.BookmarkInterval)
		defer t.Stop()
		tick = t.C
	}
	st.last = max(st.last, last)
	defer func() {
		if reason := wt.closedReason(); reason != "" {
			s.m.terminated.WithLabelValues(st.res.ID(), reason).Inc()
		}
	}()
	var batch []queued
	// drain writes everything queued (one flush for the whole batch) and
	// keeps the batch's buffer only if it is small: an idle watcher should
	// hold none.
	drain := func() {
		batch = wt.take(batch)
		for i, q := range batch {
			if st.err == nil {
				st.event(q.it, q.t)
			}
			batch[i] = queued{}
		}
		if cap(batch) > 64 {
			batch = nil
		}
	}
	for st.err == nil {
		select {
		case <-ctx.Done():
			return
		case <-wt.done:
			// Deliver what was queued before the overflow (within the
			// close grace), then end the stream: the client resumes after
			// the last event it received.
			drain()
			st.flush()
			return
		case <-wt.wake:
			drain()
			st.flush()
		case <-tick:
			// Everything up to the hub's head has been queued; write it,
			// then the bookmark.
			head := h.head.Load()
			drain()
			st.raw(bookmarkLine(st.res, max(head, st.last), false))
			st.flush()
		}
	}
}

// stream writes one client's watch response.
type stream struct {
	w         http.ResponseWriter
	gz        *gzip.Writer // nil: uncompressed
	rc        *http.ResponseController
	res       *kube.Resource
	table     bool
	tableCols bool
	m         *metrics
	last      int64
	err       error

	// traceLines: write trace lines for frontdoor (see TraceLinesHeader).
	traceLines bool
}

func (st *stream) raw(b []byte) {
	if st.err != nil {
		return
	}
	if st.gz != nil {
		_, st.err = st.gz.Write(b)
		return
	}
	_, st.err = st.w.Write(b)
}

func (st *stream) event(it *item, t kube.Transition) {
	var b []byte
	if st.table {
		b = tableLine(st.res, typeNames[t], it.object(t), !st.tableCols)
		st.tableCols = true
	} else {
		b = it.line(t)
	}
	if tl := st.traceLine(it); tl != nil {
		st.raw(tl)
	}
	st.raw(b)
	if st.err != nil {
		return
	}
	st.last = it.ev.Revision
	st.m.sent.WithLabelValues(st.res.ID()).Inc()
	st.m.sentBytes.WithLabelValues(st.res.ID()).Add(float64(len(b)))
	if it.ev.ObservedUnixNano > 0 {
		st.m.latency.Observe(time.Since(time.Unix(0, it.ev.ObservedUnixNano)).Seconds())
	}
}

func (st *stream) flush() {
	if st.err == nil && st.gz != nil {
		st.err = st.gz.Flush()
	}
	if st.err == nil {
		st.err = st.rc.Flush()
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

func formatRev(rev int64) string { return strconv.FormatInt(rev, 10) }

// closeGrace is how long a closed watcher may still write what it had
// queued.
const closeGrace = 2 * time.Second

func schemaGR(resource string) schema.GroupResource { return schema.GroupResource{Resource: resource} }
