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
	"context"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/clock"

	"herald.dev/libs/cacheclient"
	"herald.dev/libs/kube"
	"herald.dev/libs/kube/negotiate"
	"herald.dev/libs/kube/request"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/rv"
	"herald.dev/libs/service"
	"herald.dev/libs/storage"
	"herald.dev/libs/watchsession"
)

type metrics struct {
	watchers         prometheus.Gauge
	terminated       *prometheus.CounterVec
	events           *prometheus.CounterVec
	sent             *prometheus.CounterVec
	sentBytes        *prometheus.CounterVec
	latency          prometheus.Histogram
	upstreamRestarts *prometheus.CounterVec
	upstreamLagging  *prometheus.CounterVec
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
		upstreamLagging:  f.NewCounterVec(prometheus.CounterOpts{Name: "herald_fanout_upstream_lag_resets_total", Help: "Upstream streams ended because a cache shard lagged behind the others past the merge limits (upstream.merge-max-*), by resource; the resource's watchers were closed to resume."}, []string{"resource"}),
		rejected:         f.NewCounter(prometheus.CounterOpts{Name: "herald_fanout_rejected_watches_total", Help: "Watches refused because the replica was at max-watchers."}),
	}
}

// Server is a fanout replica's watch HTTP handler.
type Server struct {
	cfg    Config
	log    *slog.Logger
	reg    *kube.Registry
	cache  heraldv1.CacheClient // every cache shard as one (libs/cacheclient)
	m      *metrics
	ctx    context.Context
	tracer trace.Tracer     // nil: tracing off
	clock  clock.WithTicker // paces retries, bookmarks and waits
	// replays bounds the catch-ups from the caches running at once.
	replays *service.Queue

	codec *storage.Codec        // protobuf and metadata encodings
	neg   *negotiate.Negotiator // content negotiation

	mu       sync.Mutex
	hubs     map[string]*hub
	watchers atomic.Int64
	// batches are the streams' write batches (stream.out).
	batches sync.Pool
	// pacers write the watches of session streams, a session's on one
	// (pacerFor); nil: every watch writes on its own goroutine.
	pacers []*pacer
}

// NewServer creates a replica serving watches from the cache shards of
// shards; dial connects to one shard's target. Hubs live until ctx ends.
func NewServer(ctx context.Context, cfg Config, log *slog.Logger, dial func(target string) (heraldv1.CacheClient, error), promReg prometheus.Registerer, opts ...Option) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	reg, shards, err := kube.LoadShards(cfg.ResourcesFile, cfg.Prefix, cfg.ShardMap())
	if err != nil {
		return nil, err
	}
	codec, err := storage.NewCodec(nil)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: log, reg: reg, m: newMetrics(promReg), ctx: ctx, clock: clock.RealClock{}, hubs: map[string]*hub{},
		codec: codec, neg: negotiate.NewNegotiator(),
		replays: service.NewQueue(cfg.Replays, promReg, "herald_fanout_replays", "Watch catch-ups streamed from the caches (resumes older than the ring)")}
	for _, o := range opts {
		o(s)
	}
	caches := map[string]heraldv1.CacheClient{}
	for _, t := range shards.Targets() {
		if caches[t], err = dial(t); err != nil {
			return nil, err
		}
	}
	s.pacers = make([]*pacer, runtime.GOMAXPROCS(0))
	for i := range s.pacers {
		s.pacers[i] = newPacer(s.clock, cfg.WriteCoalesce)
		go s.pacers[i].run(ctx)
	}
	s.cache = cacheclient.New(reg, shards, caches, cacheclient.WithClock(s.clock), cacheclient.WithLogger(log),
		cacheclient.WithMergeLimits(cacheclient.MergeLimits{Events: cfg.MergeEvents, Bytes: cfg.MergeBytes}))
	go cacheclient.FollowCRDs(ctx, s.cache, reg, log, s.retireHubs)
	promReg.MustRegister(replicaCollector{s})
	return s, nil
}

// WithClock replaces the real clock (tests drive time with a fake one).
func WithClock(c clock.WithTicker) Option { return func(s *Server) { s.clock = c } }

func (s *Server) hub(r *kube.Resource) *hub {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, ok := s.hubs[r.ID()]
	if !ok {
		h = newHub(r, s.cache, ringLimits{events: s.cfg.RingSize, bytes: s.cfg.RingBytes}, s.log, s.m, s.clock)
		h.tracer = s.tracer
		ctx, cancel := context.WithCancel(s.ctx)
		h.stop = cancel
		if r.Custom() {
			h.gone = func() bool { return s.retire(h) }
		}
		s.hubs[r.ID()] = h
		go h.run(ctx)
	}
	return h
}

// retireHubs retires the hubs of custom resources the registry no longer
// serves as their hub does (their CRD was deleted or changed): called when
// the registry's custom resources change.
func (s *Server) retireHubs() {
	s.mu.Lock()
	var hubs []*hub
	for _, h := range s.hubs {
		if h.res.Custom() {
			hubs = append(hubs, h)
		}
	}
	s.mu.Unlock()
	for _, h := range hubs {
		s.retire(h)
	}
}

// retire stops h and closes its watchers (they resume, and find the
// resource as the registry now has it, or gone) when the registry no longer
// serves h's resource's objects as h does (a CRD's status change alone
// keeps it); it reports whether it did.
func (s *Server) retire(h *hub) bool {
	if r, ok := s.reg.ByID(h.res.ID()); ok && kube.SameObjects(r, h.res) {
		return false
	}
	s.mu.Lock()
	if s.hubs[h.res.ID()] == h {
		delete(s.hubs, h.res.ID())
	}
	s.mu.Unlock()
	h.stop()
	h.reset(reasonResourceChanged)
	return true
}

// learnWait bounds how long a watch of a custom resource this replica does
// not serve yet waits for it to learn the resource's CRD (request.Await):
// kube-apiserver's own bound on a read waiting for its cache.
const learnWait = 3 * time.Second

func badRequest(msg string) error { return apierrors.NewBadRequest(msg) }

// ServeWatch serves a watch of a session (libs/watchsession), as frontdoor
// parsed, validated and authorized it: nothing is parsed again.
func (s *Server) ServeWatch(ctx context.Context, w http.ResponseWriter, req *heraldv1.WatchStreamRequest) {
	// Frontdoor resolved the resource; a custom resource it has learned may
	// take this replica a moment more.
	res, err := s.awaitResource(ctx, req.Group, req.Version, req.Resource)
	if err != nil {
		kube.WriteStatus(w, err)
		return
	}
	info := request.Info{Resource: res, Namespace: req.Namespace, Name: req.Name, Verb: request.VerbWatch}
	wr, err := watchsession.WatchOf(req)
	if err != nil {
		kube.WriteStatus(w, err)
		return
	}
	s.watch(ctx, w, info, wr, watchOptions{accept: req.Accept, gzip: req.AcceptGzip, traceEvents: req.TraceEvents})
}

// awaitResource finds the resource a watch names in the registry, waiting
// up to learnWait for a custom resource this replica has not learned yet.
func (s *Server) awaitResource(ctx context.Context, group, version, resource string) (*kube.Resource, error) {
	timer := time.NewTimer(learnWait)
	defer timer.Stop()
	for {
		changed := s.reg.Changed()
		if r, ok := s.reg.Lookup(group, version, resource); ok {
			return r, nil
		}
		select {
		case <-changed:
		case <-timer.C:
			return nil, kube.ErrNoRoute // the 404 of a path not served
		case <-ctx.Done():
			return nil, kube.ErrNoRoute
		}
	}
}

// ServeHTTP serves a watch request that did not come as a stream of a
// session (a test, or curl against the replica's port): its path and
// query are parsed, then it is served as ServeWatch serves one.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		kube.WriteStatus(w, apierrors.NewMethodNotSupported(schemaGR(""), r.Method))
		return
	}
	q := r.URL.Query()
	// Frontdoor resolved the path; a custom resource it has learned may
	// take this replica a moment more.
	info, err := request.Await(r.Context(), s.reg, learnWait, r.URL.Path, q)
	if err != nil {
		kube.WriteStatus(w, err)
		return
	}
	if info.Verb != request.VerbWatch {
		kube.WriteStatus(w, badRequest("this server only serves watch requests"))
		return
	}
	// Frontdoor has validated the options and forwarded them as parsed
	// (request.WatchRequest.Query); decoding them with the same parser
	// cannot read anything else into them.
	wr, err := request.ParseWatch(info, q)
	if err != nil {
		kube.WriteStatus(w, err)
		return
	}
	s.watch(r.Context(), w, info, wr, watchOptions{accept: r.Header.Get("Accept"), gzip: service.AcceptsGzip(r)})
}

// watchOptions are what a watch asks of its stream besides its request:
// the client's Accept header, whether it accepts gzip, and whether
// frontdoor traces events (a session's stream only).
type watchOptions struct {
	accept      string
	gzip        bool
	traceEvents bool
}

// watch serves one watch (frontdoor has authenticated and authorized it).
func (s *Server) watch(ctx context.Context, w http.ResponseWriter, info request.Info, wr *request.WatchRequest, opts watchOptions) {
	plan := wr.Plan
	timeout := s.cfg.MinTimeout + rand.N(s.cfg.MaxTimeout-s.cfg.MinTimeout+1)
	if n := wr.TimeoutSeconds; n > 0 {
		timeout = time.Duration(min(n, 1<<31)) * time.Second
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
	if !h.waitSynced(ctx, s.cfg.UpstreamWait) {
		if plan.Mode == rv.WatchAfter {
			// A resume (every watch of a wave after the caches
			// restarted): 429, on which client-go retries the watch
			// from its resourceVersion; on a 503 it would relist.
			kube.WriteStatus(w, apierrors.NewTooManyRequests("the watch cache is not ready yet; resume from the same resourceVersion", 1))
			return
		}
		kube.WriteStatus(w, apierrors.NewServiceUnavailable("the watch cache is not ready yet"))
		return
	}

	f, err := s.negotiate(opts.accept, info.Resource)
	if err != nil {
		kube.WriteStatus(w, err)
		return
	}

	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	st := &stream{w: w, rc: http.NewResponseController(w), res: info.Resource, f: f, enc: s.encoder(info.Resource), m: s.m, clock: s.clock, batches: &s.batches}
	w.Header().Set("Content-Type", f.contentType())
	w.Header().Set("Cache-Control", "no-cache, private")
	// Compress only streams that start with a list's worth of initial
	// state, and only when asked: compressing every event for every watcher
	// would undo encode-once (kube-apiserver never compresses watches).
	if s.cfg.GzipInitial && plan.Mode == rv.WatchFromState && opts.gzip {
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Add("Vary", "Accept-Encoding")
		st.gz = newGzipStream(w)
		defer st.gz.Close()
	}
	if st.gz == nil {
		st.sw = segmentWriter(w)
	}
	// The trace contexts of traced events go to frontdoor as the
	// session's trace frames.
	st.traceEvents = s.tracer != nil && st.sw != nil && opts.traceEvents
	w.WriteHeader(http.StatusOK)
	st.flush()

	wt := newWatcher(wr.Selector, s.cfg.QueueEvents, s.cfg.QueueBytes)
	// Once closed, the watcher is counted at once and has closeGrace to
	// write what it had queued; a write still blocked then fails and the
	// handler returns. (The deadline is the connection's, in wall time: not
	// the injected clock.)
	wt.onClose = func(reason string) {
		s.m.terminated.WithLabelValues(info.Resource.ID(), reason).Inc()
		st.rc.SetWriteDeadline(time.Now().Add(closeGrace))
	}
	defer h.leave(wt)
	// A watch of a session is written by its session's pacer once it
	// has started; until then (the catch-up), by this goroutine.
	var e *paced
	if p := s.pacerFor(st); p != nil {
		e = p.add(st, wt)
		defer e.leave()
	}
	last, err := s.begin(ctx, st, h, wt, e, info, wr)
	if err != nil {
		return
	}
	if e != nil {
		s.servePaced(ctx, st, h, e, last, wr.AllowWatchBookmarks)
		return
	}
	s.serve(ctx, st, h, wt, last, wr.AllowWatchBookmarks)
}

// begin starts the watch (Server.start), with e (if any) held: the
// catch-up is this goroutine's to write. A watch that failed to start gets
// the ERROR event; a resumed one, a bookmark.
func (s *Server) begin(ctx context.Context, st *stream, h *hub, wt *watcher, e *paced, info request.Info, wr *request.WatchRequest) (last int64, err error) {
	if e != nil {
		e.mu.Lock()
		defer func() {
			e.gone = err != nil
			e.mu.Unlock()
		}()
	}
	plan := wr.Plan
	last, err = s.start(ctx, st, h, wt, info, plan)
	if err != nil {
		if ctx.Err() == nil {
			st.raw(st.enc.errorEvent(st.f, startError(err, plan)))
			st.flush()
		}
		return 0, err
	}
	if wr.AllowWatchBookmarks && plan.Mode == rv.WatchAfter {
		// A resumed watch says at once where it stands: client-go takes a
		// watch that ends within a second with nothing received for a
		// failure and relists, and a watch that resumed just before its
		// replica or cache dies (a restart wave) ends exactly so.
		st.bookmark(max(last, st.last), false)
		st.flush()
	}
	return last, nil
}

// pacerFor returns the pacer that writes st's watch, or nil if the watch
// writes on its own goroutine: the stream of a session, uncompressed, goes
// to its session's pacer.
func (s *Server) pacerFor(st *stream) *pacer {
	if len(s.pacers) == 0 || st.sw == nil {
		return nil
	}
	return s.pacers[st.sw.Session()%uint64(len(s.pacers))]
}

// servePaced is serve for a watch its pacer writes: this goroutine writes
// only what the pacer hands back (a batch the client had no room for),
// bookmarks, and the end, until the client leaves, the watch times out or
// the watcher is closed.
func (s *Server) servePaced(ctx context.Context, st *stream, h *hub, e *paced, last int64, bookmarks bool) {
	tick, stop := s.bookmarkTicks(bookmarks)
	defer stop()
	wt := e.wt
	e.mu.Lock()
	st.last = max(st.last, last)
	e.mu.Unlock()
	e.renotify() // what was queued during the catch-up
	drain := func() int { return st.drain(wt, &e.batch, drainRounds) }
	for {
		var err error
		select {
		case <-ctx.Done():
			return
		case <-e.back:
			// What the pacer could not write now, written as the client
			// makes room; or the pacer's write failed (below).
			err = e.own(s.clock.Now, func() int {
				n := drain()
				st.flush()
				return n
			})
		case <-wt.done:
			e.own(s.clock.Now, func() int { return st.closing(drain, bookmarks) })
			return
		case <-tick:
			err = e.own(s.clock.Now, func() int { return st.bookmarkTick(h, wt, drain) })
		}
		if err != nil {
			return
		}
	}
}

// stateRequest asks the cache for a watcher's initial state. The selectors
// travel with the request: the cache sends only the objects this watcher
// sees (a kubelet's two pods, not every pod of the cluster for each of
// thousands of kubelets). Like every watcher's request, it takes updates
// that left labels and selectable fields alone without their previous
// state (transition needs none for them).
func stateRequest(info request.Info, sel *request.Selector, plan rv.WatchPlan) *heraldv1.WatchRequest {
	return &heraldv1.WatchRequest{Resource: info.Resource.ID(), Namespace: info.Namespace,
		InitialEvents: true, MinRevision: plan.Rev, Consistent: plan.Consistent,
		LabelSelector: sel.Labels.String(), FieldSelector: sel.Fields.String(), Selector: cacheclient.Selector(sel),
		OmitUnchangedPrev: true}
}

// replayRequest asks the cache for a watcher's events after revision
// after, when the hub's ring no longer holds them; with the cache's
// protobuf of the objects for a watcher that writes it.
func replayRequest(info request.Info, sel *request.Selector, after int64, withProtobuf bool) *heraldv1.WatchRequest {
	return &heraldv1.WatchRequest{Resource: info.Resource.ID(), Namespace: info.Namespace, AfterRevision: after,
		LabelSelector: sel.Labels.String(), FieldSelector: sel.Fields.String(), Selector: cacheclient.Selector(sel),
		OmitUnchangedPrev: true, WithProtobuf: withProtobuf}
}

// start sends the initial events (if any) and catches the watcher up until
// it has joined the hub; it returns the revision it joined after.
func (s *Server) start(ctx context.Context, st *stream, h *hub, wt *watcher, info request.Info, plan rv.WatchPlan) (int64, error) {
	withProtobuf := st.f.cacheProtobuf() && !st.enc.custom
	if withProtobuf {
		h.askProtobuf()
	}
	var last int64
	switch plan.Mode {
	case rv.WatchFromState:
		rev, err := s.initialState(ctx, st, wt.sel, stateRequest(info, wt.sel, plan))
		if err != nil {
			return 0, err
		}
		if plan.InitialEventsEnd {
			st.bookmark(rev, true)
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
				st.send(it, wt.sel)
			}
			st.flush()
			return last, st.err
		}
		rev, err := s.replay(ctx, st, wt.sel, replayRequest(info, wt.sel, last, withProtobuf))
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
			case <-s.clock.After(50 * time.Millisecond):
			}
		}
		last = max(last, rev)
	}
}

// startError is the ERROR event's status for a watch whose start failed.
// A resume (a resourceVersion given, no initial state) that failed for a
// reason that passes — a cache restarting or unreachable, a replay cut or
// out of time — is told 429 Too Many Requests: client-go backs off and
// resumes from the same resourceVersion on 429, whereas any other ERROR
// event makes it relist, and a wave of resumes after a restart must not
// become a relist storm. What is final is passed on as the cache said it:
// 410 (the history is gone), a too-large resourceVersion (as
// kube-apiserver), errors of the request itself.
func startError(err error, plan rv.WatchPlan) error {
	if plan.Mode != rv.WatchAfter {
		return kube.FromGRPC(err)
	}
	st, ok := status.FromError(err)
	transient := !ok
	if ok {
		switch st.Code() {
		case codes.Unavailable, codes.Aborted, codes.Canceled, codes.ResourceExhausted, codes.Internal, codes.Unknown:
			transient = true
		case codes.DeadlineExceeded:
			// A call that ran out of its own time; the cache's "not
			// reached in time" is final (a too-large resourceVersion).
			transient = st.Message() == context.DeadlineExceeded.Error()
		}
	}
	if !transient {
		return kube.FromGRPC(err)
	}
	return apierrors.NewTooManyRequests("the watch could not be resumed yet ("+err.Error()+"); resume from the same resourceVersion", 1)
}

// initialState writes the synthetic ADDED events of the state and returns
// its revision (the cache client assembles one consistent state across a
// split resource's shards).
func (s *Server) initialState(ctx context.Context, st *stream, sel *request.Selector, req *heraldv1.WatchRequest) (int64, error) {
	var rev int64
	err := cacheclient.ReadEvents(ctx, s.cache, req, func(ev *heraldv1.Event) bool {
		if ev.Type == heraldv1.EventType_BOOKMARK {
			rev = ev.Revision
			return false // the state ends at its first bookmark
		}
		st.send(newItem(ev), sel)
		return st.err == nil
	})
	if err != nil {
		return 0, err
	}
	st.flush()
	return rev, st.err
}

// replay writes, filtered by sel, the events after req.AfterRevision that
// the cache (every shard of it) has passed, and returns the revision it is
// complete through. req carries the watcher's selectors, so the caches send
// only the events that can concern it; events are written as they arrive
// (a slow client slows the replay through the gRPC stream's flow control),
// and the replay ends as soon as the client is gone. At most
// --replay.concurrency replays run at once.
func (s *Server) replay(ctx context.Context, st *stream, sel *request.Selector, req *heraldv1.WatchRequest) (int64, error) {
	release, err := s.replays.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer release()
	var through int64
	err = cacheclient.ReadEvents(ctx, s.cache, req, func(ev *heraldv1.Event) bool {
		if ev.Type == heraldv1.EventType_BOOKMARK {
			through = max(through, ev.Revision)
		} else {
			st.send(newItem(ev), sel)
		}
		return st.err == nil
	})
	if err != nil {
		return 0, err
	}
	st.flush()
	return through, st.err
}

// bookmarkTicks returns a watch's bookmark ticks (none without bookmarks)
// and what stops them.
func (s *Server) bookmarkTicks(bookmarks bool) (<-chan time.Time, func()) {
	if !bookmarks {
		return nil, func() {}
	}
	t := s.clock.NewTicker(s.cfg.BookmarkInterval)
	return t.C(), t.Stop
}

// serve drains the watcher's queue to the client until the client leaves,
// the watch times out or the watcher is closed.
func (s *Server) serve(ctx context.Context, st *stream, h *hub, wt *watcher, last int64, bookmarks bool) {
	tick, stop := s.bookmarkTicks(bookmarks)
	defer stop()
	st.last = max(st.last, last)
	var batch []queued
	// Pacing (cfg.WriteCoalesce): a watch woken less than WriteCoalesce
	// after its last write waits out the rest, then writes all that was
	// queued meanwhile at once. At 100 events/s and 50 ms that is one
	// write of ~5 events where there were five, in fanout and in frontdoor
	// (one frame, one read, one TLS record, one syscall each): the
	// per-delivery cost that dominates a broadcast. A quiet watch (a
	// kubelet's) is written to at once. Order and the queue's bounds are
	// unchanged: events wait in the queue, which overflows (the watcher
	// falls behind) as it always does.
	//
	// A watch that had to wait (busy) waits out the next interval right
	// after its write, without listening to wake: the events queued
	// meanwhile do not wake it, so it is woken once per write instead of
	// twice (by the interval's first event, then by the timer). If the
	// interval brought nothing, it goes back to waiting for wake, and the
	// next event is written at once.
	var (
		lastWrite time.Time
		pace      clock.Timer
		due       <-chan time.Time // the busy watch's timer; nil: not busy
	)
	defer func() {
		if pace != nil {
			pace.Stop()
		}
	}()
	arm := func(wait time.Duration) {
		if pace == nil {
			pace = s.clock.NewTimer(wait)
		} else {
			pace.Reset(wait)
		}
		due = pace.C()
	}
	drain := func() int { return st.drain(wt, &batch, drainRounds) }
	// write drains and flushes; a busy watch (one that was paced) waits out
	// the rest of the next interval from here. A write that took the whole
	// interval (a client slow to read) leaves it waiting for wake: what came
	// meanwhile is behind a signal already, and is written at once.
	write := func(busy bool) {
		// What full signalled is taken now; a signal from here on is for
		// what comes after.
		select {
		case <-wt.full:
		default:
		}
		start := s.clock.Now()
		n := drain()
		st.flush()
		if n == 0 {
			return
		}
		lastWrite = start
		if wait := s.cfg.WriteCoalesce - s.clock.Since(start); busy && wait > 0 {
			arm(wait)
		}
	}
	for st.err == nil {
		wake := wt.wake
		if due != nil {
			wake = nil // busy: the timer writes what comes meanwhile
		}
		select {
		case <-ctx.Done():
			return
		case <-wt.done:
			st.closing(drain, bookmarks)
			return
		case <-wake:
			n, half := wt.level()
			if n == 0 {
				continue // taken by the last write already
			}
			if wait := s.cfg.WriteCoalesce - s.clock.Since(lastWrite); wait > 0 && !half {
				arm(wait) // busy: gather until then
				continue
			}
			write(false)
		case <-due:
			due = nil
			write(true)
		case <-wt.full:
			// The queue reached half its bound: write now rather than
			// overflow it, and keep the busy watch's cadence.
			busy := due != nil
			if busy {
				pace.Stop()
				due = nil
			}
			write(busy)
		case <-tick:
			st.bookmarkTick(h, wt, drain)
		}
	}
}

// drainRounds bounds how many times a drain takes a watcher's queue, so
// that a watcher fed as fast as it writes still flushes.
const drainRounds = 8

// drain adds what wt has queued to the stream's batch, including what is
// queued while it does (up to rounds takes), and returns how many events
// it took. batch is the watch's slice for taking, kept only if it is
// small: an idle watcher should hold none.
func (st *stream) drain(wt *watcher, batch *[]queued, rounds int) (n int) {
	for range rounds {
		if st.err != nil {
			break
		}
		// take gives the queue *batch: what it returns is ours now.
		b := wt.take(*batch)
		*batch = b
		if len(b) == 0 {
			break
		}
		st.now = time.Now()
		for i, q := range b {
			if st.err == nil {
				st.event(q.it, q.t)
			}
			b[i] = queued{}
		}
		n += len(b)
		if cap(b) > 64 {
			*batch = nil
		}
	}
	st.now = time.Time{}
	return n
}

// closing writes what the closed watcher had queued (drain), within the
// close grace, then ends the stream: the client resumes after the last
// event it received. With bookmarks, a bookmark at what was delivered ends
// it: client-go takes a watch that ends within a second with nothing
// received for a failure and relists, and a hub reset closes every
// watcher at once, just joined ones too (a relist storm while the caches
// restart). It returns how many events it wrote.
func (st *stream) closing(drain func() int, bookmarks bool) int {
	n := drain()
	if bookmarks {
		st.bookmark(st.last, false) // in the stream's format: a kubelet's is protobuf
	}
	st.flush()
	return n
}

// bookmarkTick writes what wt has queued (drain), which is everything up
// to h's head, then a bookmark at the head. Unless the watcher was closed
// meanwhile: the hub no longer queues to it, so its head says nothing of
// what this client got (closing ends the stream with a bookmark at what it
// did get). Nor if it was behind: what it has not been sent up to the head
// may still be in the ring. It returns how many events it wrote.
func (st *stream) bookmarkTick(h *hub, wt *watcher, drain func() int) int {
	// head before behind: only this writer clears behind (catching up, it
	// queues everything dispatched so far), so a watcher not behind after
	// head was read has everything up to head queued, for drain to take.
	head := h.head.Load()
	behind := wt.behind.Load()
	n := drain()
	if wt.closedReason() == "" && !behind {
		st.bookmark(max(head, st.last), false)
	}
	st.flush()
	return n
}

// stream writes one client's watch response.
type stream struct {
	w         http.ResponseWriter
	gz        *gzipStream // nil: uncompressed
	rc        *http.ResponseController
	res       *kube.Resource
	f         format
	enc       *encoder
	tableCols bool
	m         *metrics
	clock     clock.PassiveClock
	last      int64
	err       error
	// sent, sentBytes: the stream's resource's counters (looked up once,
	// not per event), added to once per write of a batch and at flush:
	// unsent and unsentBytes are the events (and their bytes) taken into
	// the stream since.
	sent, sentBytes     prometheus.Counter
	unsent, unsentBytes int

	// out is the batch of lines not written yet: everything a drain of the
	// watcher's queue produced goes to the client in one write (one HTTP/2
	// DATA hand-off to the connection, one read and one TLS record in
	// frontdoor) rather than one per event. Taken from batches (nil: a new
	// buffer) at the first line and given back at flush.
	out     *[]byte
	batches *sync.Pool

	// sw: the stream of a session (libs/watchsession), uncompressed: a batch is
	// written as segments, the hub's events' encodings by reference, so
	// that the session sends each once however many of its watches write
	// it. parts is then the batch (its own bytes in out), segs the
	// segments given to sw. pending: the batch's bytes.
	sw      watchsession.SegmentWriter
	parts   []part
	pending int
	segs    []watchsession.Segment
	// try: the stream's pacer is writing it, and must not wait
	// (TryWriteSegments). blocked: a write found no room, and the batch
	// (parts, out) waits, growing, until the watch's goroutine writes it
	// (see paced).
	try, blocked bool

	// traceEvents: write the trace context of traced events for frontdoor
	// (watchsession.Segment.Trace).
	traceEvents bool
	// now: while a drain adds a batch, when it took it (wall time).
	now time.Time
}

// part is a segment of a stream's batch: shared bytes, out[from:to], or
// the trace context of the event that follows.
type part struct {
	shared   []byte
	from, to int
	trace    string
}

// segmentWriter returns w's SegmentWriter, if it or one it wraps is one.
func segmentWriter(w http.ResponseWriter) watchsession.SegmentWriter {
	for {
		switch x := w.(type) {
		case watchsession.SegmentWriter:
			return x
		case interface{ Unwrap() http.ResponseWriter }:
			w = x.Unwrap()
		default:
			return nil
		}
	}
}

// raw adds the stream's own bytes to its pending batch (a copy); flush (or
// a full batch) writes it.
func (st *stream) raw(b []byte) { st.add(b, false) }

// add adds b to the stream's pending batch. Shared bytes (an event's
// encoding: never modified, and written by other watches too) go by
// reference on a session's stream; everything else is copied into out.
func (st *stream) add(b []byte, shared bool) {
	if st.err != nil {
		return
	}
	if st.pending+len(b) > batchBytes {
		st.writeOut()
		if len(b) >= batchBytes && !st.try {
			st.write(b) // large enough on its own: no copy
			return
		}
	}
	st.pending += len(b)
	if shared && st.sw != nil {
		st.parts = append(st.parts, part{shared: b})
		return
	}
	if st.out == nil {
		st.out = getBatch(st.batches)
	}
	from := len(*st.out)
	*st.out = append(*st.out, b...)
	if st.sw == nil {
		return // out is the batch
	}
	if n := len(st.parts); n > 0 && st.parts[n-1].shared == nil && st.parts[n-1].trace == "" && st.parts[n-1].to == from {
		st.parts[n-1].to = len(*st.out)
	} else {
		st.parts = append(st.parts, part{from: from, to: len(*st.out)})
	}
}

// writeOut writes the pending batch in one write.
func (st *stream) writeOut() {
	if st.sw != nil {
		if !st.blocked {
			st.writeParts()
		}
		return
	}
	st.pending = 0
	if st.out != nil && len(*st.out) > 0 {
		st.write(*st.out)
		*st.out = (*st.out)[:0]
		st.count()
	}
}

// writeParts writes the batch of a stream with segments in one write.
func (st *stream) writeParts() {
	if len(st.parts) == 0 {
		return
	}
	segs := st.segs[:0]
	for _, p := range st.parts {
		switch {
		case p.trace != "":
			segs = append(segs, watchsession.Segment{Trace: p.trace})
		case p.shared != nil:
			segs = append(segs, watchsession.Segment{B: p.shared, Shared: true})
		default:
			segs = append(segs, watchsession.Segment{B: (*st.out)[p.from:p.to]})
		}
	}
	switch {
	case st.err != nil:
	case st.try:
		var ok bool
		if ok, st.err = st.sw.TryWriteSegments(segs); !ok && st.err == nil {
			st.blocked = true // the parts stay
			clear(segs)
			st.segs = segs[:0]
			return
		}
	default:
		_, st.err = st.sw.WriteSegments(segs)
	}
	// No references kept: an idle watcher pins no event's encoding, and
	// keeps the slices of a small batch only.
	clear(segs)
	clear(st.parts)
	st.segs, st.parts, st.pending = segs[:0], st.parts[:0], 0
	if cap(st.segs) > 16 {
		st.segs, st.parts = nil, nil
	}
	if st.out != nil {
		*st.out = (*st.out)[:0]
	}
	st.count()
}

// count adds the events written since the last count to the resource's
// counters.
func (st *stream) count() {
	if st.err != nil || st.unsent == 0 {
		return
	}
	if st.sent == nil {
		st.sent, st.sentBytes = st.m.sent.WithLabelValues(st.res.ID()), st.m.sentBytes.WithLabelValues(st.res.ID())
	}
	st.sent.Add(float64(st.unsent))
	st.sentBytes.Add(float64(st.unsentBytes))
	st.unsent, st.unsentBytes = 0, 0
}

func (st *stream) write(b []byte) {
	if st.err != nil {
		return
	}
	if st.gz != nil {
		_, st.err = st.gz.Write(b)
		return
	}
	_, st.err = st.w.Write(b)
}

func (st *stream) event(it *item, t request.Transition) {
	b, err := st.enc.encoded(it, st.f, t, !st.tableCols)
	if err != nil {
		// kube-apiserver ends a watch whose event it cannot encode; the
		// client resumes from the last event it received.
		st.err = err
		return
	}
	st.tableCols = true
	if tp := st.traceOf(it); tp != "" {
		st.parts = append(st.parts, part{trace: tp})
	}
	st.add(b, it.sharedByMany())
	if st.err != nil {
		return
	}
	st.last = it.ev.Revision
	st.unsent++
	st.unsentBytes += len(b)
	if it.ev.ObservedUnixNano > 0 {
		// Wall time on both ends (ingest's and this host's): not the
		// injected clock. A drained batch is written at once: one
		// reading of the clock for all of it.
		now := st.now
		if now.IsZero() {
			now = time.Now()
		}
		st.m.latency.Observe(now.Sub(time.Unix(0, it.ev.ObservedUnixNano)).Seconds())
	}
}

// send writes it if sel's watcher sees it.
func (st *stream) send(it *item, sel *request.Selector) {
	if t := it.transition(sel); t != request.Skip {
		st.event(it, t)
	}
}

// flush writes the pending batch and sends everything written so far, and
// gives the batch's buffer back: an idle watcher holds none.
func (st *stream) flush() {
	st.writeOut()
	if st.blocked {
		return // the batch waits in out and parts
	}
	if st.out != nil {
		putBatch(st.batches, st.out)
		st.out = nil
	}
	if st.err == nil && st.gz != nil {
		st.err = st.gz.Flush()
	}
	if st.err == nil {
		st.err = st.rc.Flush()
	}
	st.count()
}

func formatRev(rev int64) string { return strconv.FormatInt(rev, 10) }

// batchBytes bounds a stream's pending batch: a longer one is written
// before it grows further (a catch-up writes thousands of events before it
// flushes).
const batchBytes = 32 << 10

func getBatch(pool *sync.Pool) *[]byte {
	if pool != nil {
		if b, ok := pool.Get().(*[]byte); ok {
			return b
		}
	}
	b := make([]byte, 0, batchBytes)
	return &b
}

func putBatch(pool *sync.Pool, b *[]byte) {
	if pool != nil && cap(*b) == batchBytes {
		*b = (*b)[:0]
		pool.Put(b)
	}
}

// closeGrace is how long a closed watcher may still write what it had
// queued.
const closeGrace = 2 * time.Second

func schemaGR(resource string) schema.GroupResource { return schema.GroupResource{Resource: resource} }
