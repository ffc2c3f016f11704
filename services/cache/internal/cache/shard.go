// Package cache owns a cache shard: the current objects and a window of
// recent revisions of the resources (and namespace partitions) it is
// assigned, built from an etcd snapshot and kept current from the JetStream
// stream, served over gRPC as LIST and watch-from-revision.
//
// Invariants:
//   - Records are applied by one goroutine in stream order; the shard's head
//     revision only moves forward, and only once a revision is applied whole.
//   - Every read is answered from memory at a revision the shard has
//     reached; a read that needs a newer revision waits (bounded) and never
//     returns older data.
//   - Nothing a slow reader does can block the apply goroutine.
//   - No record is skipped silently: the shard checks the stream sequence of
//     every message it consumes against the last one it applied, and when
//     the messages between are no longer in the stream (aged out or purged
//     while it was cut off or behind: its consumer reads on from whatever
//     the stream still holds, without an error) it rebuilds, as for a resync
//     marker, instead of applying what follows the gap.
//   - A stream deleted and created again under the same name is another
//     history, even where its sequences reach the shard's: told by its
//     creation time, it is a gap too (generation.go).
//
// Reading the stream (subjects, records, split revisions, the event a change
// makes) follows libs/stream's rules; the shard decides what to keep.
package cache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/btree"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/trace"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/service"
	"herald.dev/libs/stream"
	"herald.dev/services/cache/internal/watchevent"
)

type metrics struct {
	received   *prometheus.CounterVec
	skipped    *prometheus.CounterVec
	head       prometheus.Gauge
	capacity   *prometheus.GaugeVec
	lists      *prometheus.CounterVec
	listTime   *prometheus.HistogramVec
	readWait   *prometheus.HistogramVec
	subs       *prometheus.GaugeVec
	subsCut    *prometheus.CounterVec
	e2eLatency prometheus.Histogram
	resyncs    prometheus.Counter
	gaps       prometheus.Counter
	// deepReplays: replays read from the stream (started, once their
	// slot is free); rebuilt: revisions replayed into the windows at start.
	deepReplays prometheus.Counter
	rebuilt     prometheus.Counter
	historyHits *prometheus.CounterVec
	generation  prometheus.Gauge // herald_stream_generation (generation.go)
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		received:    f.NewCounterVec(prometheus.CounterOpts{Name: "apiserver_watch_cache_events_received_total", Help: "Events applied to the cache, by resource."}, []string{"resource"}),
		skipped:     f.NewCounterVec(prometheus.CounterOpts{Name: "herald_cache_undecodable_values_total", Help: "Stored values skipped because they cannot be decrypted or decoded as objects of their resource, by resource and reason."}, []string{"resource", "reason"}),
		head:        f.NewGauge(prometheus.GaugeOpts{Name: "apiserver_watch_cache_resource_version", Help: "The revision the shard has applied."}),
		capacity:    f.NewGaugeVec(prometheus.GaugeOpts{Name: "apiserver_watch_cache_capacity", Help: "Window capacity in events, by resource."}, []string{"resource"}),
		lists:       f.NewCounterVec(prometheus.CounterOpts{Name: "apiserver_cache_list_total", Help: "LIST requests served from the cache, by resource."}, []string{"resource"}),
		listTime:    f.NewHistogramVec(prometheus.HistogramOpts{Name: "herald_cache_list_duration_seconds", Help: "Time to serve a LIST, waiting included.", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18)}, []string{"resource"}),
		readWait:    f.NewHistogramVec(prometheus.HistogramOpts{Name: "apiserver_watch_cache_read_wait_seconds", Help: "Time reads waited for the shard to reach a revision.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}, []string{"resource"}),
		subs:        f.NewGaugeVec(prometheus.GaugeOpts{Name: "herald_cache_watch_streams", Help: "Following watch streams, by resource."}, []string{"resource"}),
		subsCut:     f.NewCounterVec(prometheus.CounterOpts{Name: "herald_cache_watch_streams_terminated_total", Help: "Following watch streams cut off, by reason."}, []string{"reason"}),
		resyncs:     f.NewCounter(prometheus.CounterOpts{Name: "herald_cache_resyncs_total", Help: "Rebuilds from an etcd snapshot caused by a resync marker or a gap in the consumed stream."}),
		gaps:        f.NewCounter(prometheus.CounterOpts{Name: "herald_cache_stream_gaps_total", Help: "Gaps in the consumed stream: messages the shard had not consumed were gone from the stream (aged out, purged) when it read on; each is a rebuild."}),
		deepReplays: f.NewCounter(prometheus.CounterOpts{Name: "herald_cache_deep_replays_total", Help: "Deep resume rounds started: watches older than the window replayed from the stream's history (one that the window outruns takes another round, in the same slot)."}),
		historyHits: f.NewCounterVec(prometheus.CounterOpts{Name: "herald_cache_deep_replay_decodes_total", Help: "Values deep replays needed decoded, by result: hit (another replay had decoded it, deep-replay.cache-bytes) or miss."}, []string{"result"}),
		generation:  generationGauge(reg),
		rebuilt:     f.NewCounter(prometheus.CounterOpts{Name: "herald_cache_window_rebuild_revisions_total", Help: "Revisions read from the stream into the windows at start (window.rebuild-messages), so that resumes within them are served from memory after a restart."}),
		e2eLatency: f.NewHistogram(prometheus.HistogramOpts{Name: "herald_cache_apply_latency_seconds", Help: "From ingest receiving a revision from etcd to the shard applying it.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
	}
}

// Shard is one cache shard replica.
type Shard struct {
	cfg     Config
	log     *slog.Logger
	reg     *kube.Registry
	dec     *kube.Decoder   // the one way stored values are read (decode.go)
	history *historyDecoder // dec, remembered for deep replays
	m       *metrics
	deep    *service.Queue // bounds concurrent deep replays

	// states holds every served resource's state by resource ID. The map
	// is never modified once published: the apply goroutine replaces it
	// when custom resources come and go (custom.go), readers load it.
	states atomic.Pointer[map[string]*resourceState]
	// custom: the shard serves the custom resources, learned from the
	// CRDs it holds (custom.go). sizes are the configured window sizes.
	custom bool
	sizes  map[string]int
	// crds: each CRD as last read, by name (apply goroutine only), so
	// that a revision of a CRD is read, and reported when invalid, once.
	crds map[string]readCRD

	// tracer: nil when tracing is off (see WithTracer). traceparent: the
	// trace context of the record being applied (apply goroutine only).
	tracer      trace.Tracer
	traceparent string
	obs         *obsMetrics

	etcd *clientv3.Client
	nc   *nats.Conn
	js   jetstream.JetStream

	head     atomic.Int64
	mu       sync.Mutex
	advanced chan struct{} // closed and replaced whenever head moves
	clock    waitClock     // nil: the wall clock (see WithClock)

	ready     atomic.Bool
	firstOnce sync.Once
	firstUp   chan struct{}    // closed when the shard is ready the first time
	asm       stream.Assembler // split revisions (apply goroutine only)
	// gen and floor: the stream's generation the shard rebuilt from, and
	// the highest revision of a discarded history (generation.go).
	gen, floor atomic.Int64

	// compacted: etcd's compaction revision (compaction.go).
	compacted atomic.Int64
	// created: when the stream the shard last rebuilt from was created
	// (apply goroutine only): a stream deleted and created again holds
	// another history whatever its sequences (generation.go).
	created time.Time
}

// New validates cfg and creates a shard; Start connects and loads it.
func New(cfg Config, log *slog.Logger, promReg prometheus.Registerer, opts ...Option) (*Shard, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	reg, err := kube.LoadRegistry(cfg.ResourcesFile, cfg.Prefix)
	if err != nil {
		return nil, err
	}
	dec, err := newDecoder(cfg)
	if err != nil {
		return nil, err
	}
	sizes, _ := cfg.windowSizes()
	s := &Shard{cfg: cfg, log: log, reg: reg, dec: dec, m: newMetrics(promReg), sizes: sizes, crds: map[string]readCRD{},
		advanced: make(chan struct{}), firstUp: make(chan struct{}),
		deep: service.NewQueue(cfg.DeepReplays, promReg, "herald_cache_deep_replays", "Deep resumes (watch replays read from the stream)")}
	owned, err := cfg.ownership(reg)
	if err != nil {
		return nil, err
	}
	states := map[string]*resourceState{}
	for _, r := range reg.Resources() {
		parts, ok := owned[r.ID()]
		if owned != nil && !ok {
			continue
		}
		states[r.ID()] = s.newState(r, parts)
	}
	s.states.Store(&states)
	s.custom = servesCustom(states)
	for _, o := range opts {
		o(s)
	}
	s.history = newHistoryDecoder(dec, cfg.DeepReplayCache, s.m.historyHits)
	s.obs = newObsMetrics(promReg, s)
	return s, nil
}

// Ready reports whether the shard has loaded its snapshot and follows the
// stream.
func (s *Shard) Ready() error {
	if !s.ready.Load() {
		return errors.New("shard is loading its snapshot")
	}
	return nil
}

// FirstReady is closed once the shard has loaded its first snapshot and
// follows the stream.
func (s *Shard) FirstReady() <-chan struct{} { return s.firstUp }

// Head is the revision the shard has applied.
func (s *Shard) Head() int64 { return s.head.Load() }

// newState is a new, empty state for r (owning partitions parts; nil: all)
// with its configured window size.
func (s *Shard) newState(r *kube.Resource, parts map[int]bool) *resourceState {
	size := s.cfg.DefaultWindowSize
	if n, ok := s.sizes[r.ID()]; ok {
		size = n
	} else if n, ok := s.sizes[r.Plural]; ok {
		size = n
	}
	rs := newResourceState(r, size)
	rs.parts = parts
	s.m.capacity.WithLabelValues(r.ID()).Set(float64(size))
	return rs
}

// resourceStates is every served resource's state by ID (never modify).
func (s *Shard) resourceStates() map[string]*resourceState { return *s.states.Load() }

func (s *Shard) owns(r *kube.Resource, namespace string) (*resourceState, bool) {
	rs, ok := s.resourceStates()[r.ID()]
	if !ok {
		return nil, false
	}
	if rs.parts != nil && !rs.parts[kube.Partition(namespace)] {
		return nil, false
	}
	return rs, true
}

// subjects is the consumer's filter: the owned resources' partitions, the
// multi-resource revisions and the progress markers.
//
// A shard serving custom resources always consumes the subject they are
// on (stream.SubjectOther), so that a CRD learned mid-run needs no new
// consumer: its objects are in what the shard already reads.
func (s *Shard) subjects() []string {
	out := []string{stream.SubjectMulti, stream.SubjectProgress}
	if s.custom {
		out = append(out, stream.SubjectOther)
	}
	states := s.resourceStates()
	ids := make([]string, 0, len(states))
	for id := range states {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	seen := map[string]bool{}
	add := func(subject string) {
		// A resource served from another's values reads its subjects.
		if !seen[subject] {
			seen[subject] = true
			out = append(out, subject)
		}
	}
	for _, id := range ids {
		r, parts := states[id].res, states[id].parts
		if parts == nil {
			add(stream.Filter(r))
			continue
		}
		for p := range kube.Partitions {
			if parts[p] {
				add(stream.PartitionSubject(r, p))
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Run connects, loads a snapshot and follows the stream until ctx ends.
//
// At start, the windows are rebuilt from the stream's recent history (see
// warmStart), so that resumes from revisions shortly before the start are
// served from memory rather than replayed from the stream one by one.
//
// When following breaks (NATS restarted, a consumer lost), the shard resumes
// from the stream sequence after the last one it applied, keeping its state,
// windows and subscribers: a broken consumer is invisible downstream. It
// rebuilds from an etcd snapshot only when it must: at start, after a resync
// marker, or when the stream no longer holds every message after the last
// one it applied (a gap; a stream deleted and created again is one). Those rebuilds start at etcd's current revision
// with empty windows: the history before a resync or a gap is not whole.
func (s *Shard) Run(ctx context.Context) error {
	etcdTLS, natsTLS, natsUser, err := s.cfg.Security(s.log)
	if err != nil {
		return err
	}
	s.etcd, err = clientv3.New(clientv3.Config{Endpoints: s.cfg.Endpoints(), DialTimeout: s.cfg.EtcdDialTimeout, TLS: etcdTLS, Context: ctx, DialOptions: service.StaticWindows()})
	if err != nil {
		return fmt.Errorf("etcd client: %w", err)
	}
	defer s.etcd.Close()
	s.nc, s.js, err = stream.Connect(s.cfg.NATSURL, "herald-cache", natsTLS, natsUser)
	if err != nil {
		return err
	}
	defer s.nc.Close()
	go s.pollStreamLag(ctx)
	go s.followCompaction(ctx)
	return s.run(ctx)
}

// run is Run's loop over follow, once connected.
func (s *Shard) run(ctx context.Context) error {
	backoff := 200 * time.Millisecond
	var next uint64 // stream sequence to resume from; 0: rebuild from a snapshot
	warm := s.cfg.WindowRebuild > 0
	for ctx.Err() == nil {
		var err error
		next, err = s.follow(ctx, next, warm)
		if ctx.Err() != nil {
			break
		}
		if errors.Is(err, errResyncMarker) || errors.Is(err, errStreamGap) {
			s.log.Warn("rebuilding from an etcd snapshot", "cause", err)
			s.m.resyncs.Inc()
			warm = false
			backoff = 200 * time.Millisecond
			continue
		}
		s.log.Warn("following the stream failed; resuming", "err", err, "fromSequence", next, "backoff", backoff)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
	return nil
}

var (
	errResyncMarker = errors.New("resync marker in the stream")
	errStreamGap    = errors.New("gap in the consumed stream")
)

// gap reports whether messages after the last one the shard applied (the
// one before sequence next) are gone from the stream: its first sequence is
// past next. The stream drops messages only from its front (age, size
// limits, purge), so when it still holds next, it holds everything the
// consumer skipped since: messages of subjects the shard does not consume.
// When it does not, the shard cannot tell whether any of them were its own
// and must rebuild.
func (s *Shard) gap(ctx context.Context, st stream.Reader, next uint64) (bool, error) {
	info, err := st.Info(ctx)
	if err != nil {
		return false, fmt.Errorf("stream info: %w", err)
	}
	// LastSeq+1 < next, or another creation time: the stream was deleted
	// and created again.
	return info.State.FirstSeq > next || recreated(info, s.created, next), nil
}

// warmStart chooses where a rebuild starts so that the windows hold recent
// history: the revision before the stream's last window.rebuild-messages
// messages (or its whole history, when it holds fewer). Loading etcd's
// state at that revision and applying the stream from there gives the
// windows every revision since, as if the shard had been running; a watch
// resuming from one of them (every client of a replica that just restarted)
// is served from memory. It returns 0 (start at etcd's current revision,
// empty windows) when the stream holds nothing.
func (s *Shard) warmStart(ctx context.Context, st stream.Reader) (int64, error) {
	info, err := st.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("stream info: %w", err)
	}
	if info.State.Msgs == 0 {
		return 0, nil
	}
	seq := info.State.FirstSeq
	if n := uint64(s.cfg.WindowRebuild); info.State.LastSeq >= seq+n {
		seq = info.State.LastSeq + 1 - n
	}
	for ; seq <= info.State.LastSeq; seq++ {
		rev, err := stream.RevisionBefore(ctx, st, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // aged out meanwhile, or a hole left by a deleted message
		}
		return rev, err
	}
	return 0, nil
}

// follow applies the stream from sequence next (or, when next is 0, from a
// fresh snapshot: at the revision warmStart chooses when warm, else at
// etcd's current revision) until it fails; it returns the sequence to
// resume from. After a snapshot the shard is ready only once it has applied
// what the stream held when it started reading: a replica serves no
// revision older than the stream's head at its start.
func (s *Shard) follow(ctx context.Context, next uint64, warm bool) (uint64, error) {
	st, err := s.js.Stream(ctx, s.cfg.Stream)
	if err != nil {
		return next, fmt.Errorf("stream %s: %w", s.cfg.Stream, err)
	}
	if next > 0 {
		lost, err := s.gap(ctx, st, next)
		if err != nil {
			return next, err
		}
		if lost {
			s.m.gaps.Inc()
			return 0, fmt.Errorf("%w: the stream no longer holds the resume point %d", errStreamGap, next)
		}
	}
	var rebuildFrom int64 // a warm start's first revision; 0: none
	if next == 0 {
		s.ready.Store(false)
		s.created = st.CachedInfo().Created
		if err := s.checkGeneration(ctx, st); err != nil {
			return 0, err
		}
		var at int64 // 0: etcd's current revision
		if warm {
			if at, err = s.warmStart(ctx, st); err != nil {
				return 0, err
			}
		}
		rev, err := s.loadSnapshot(ctx, at)
		if errors.Is(err, rpctypes.ErrCompacted) {
			s.log.Warn("etcd compacted the revision the windows would be rebuilt from; starting with empty windows", "revision", at)
			rev, err = s.loadSnapshot(ctx, 0)
		}
		if err != nil {
			return 0, err
		}
		if next, err = stream.SeqAfter(ctx, st, rev); err != nil {
			return 0, err
		}
		if at > 0 && rev == at {
			rebuildFrom = rev
		}
		s.log.Info("loaded snapshot", "revision", rev, "startSequence", next, "resources", len(s.resourceStates()), "rebuildingWindows", rebuildFrom > 0)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return next, fmt.Errorf("stream info: %w", err)
	}
	catchUp := info.State.LastSeq // ready once applied (or nothing of ours is left before it)
	it, err := stream.Consume(ctx, st, s.subjects(), next, jetstream.PullMaxMessages(512))
	if err != nil {
		return next, err
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	// A stream deleted (and perhaps created again) leaves the consumer
	// waiting, maybe forever, for the sequence it would read next.
	var lost atomic.Bool
	var reading atomic.Uint64
	reading.Store(next)
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	go s.watchIdentity(wctx, st, s.created, &reading, func() { lost.Store(true); it.Stop() })
	var delivered uint64 // the consumer's sequence of the last message
	caughtUp := func() {
		if s.ready.Load() {
			return
		}
		if rebuildFrom > 0 {
			s.log.Info("windows rebuilt from the stream", "from", rebuildFrom, "to", s.head.Load())
		}
		s.ready.Store(true)
		s.firstOnce.Do(func() { close(s.firstUp) })
	}
	if pending, err := it.Pending(ctx); err != nil {
		return next, err
	} else if pending == 0 || next > catchUp {
		caughtUp()
	}
	for {
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return next, ctx.Err()
			}
			if lost.Load() {
				s.m.gaps.Inc()
				return 0, fmt.Errorf("%w: the stream was deleted or created again while the shard read sequence %d", errStreamGap, next)
			}
			return next, fmt.Errorf("next message: %w", err)
		}
		meta, err := msg.Metadata()
		if err != nil {
			return next, fmt.Errorf("message metadata: %w", err)
		}
		// Skipped sequences (other subjects', or lost ones), a sequence
		// gone back, or a consumer created again (its own sequence starts
		// over; the ordered consumer does that past a reconnect, and on a
		// stream created again under the same name, from the sequence it
		// was at): the stream must still hold what the shard did not read.
		if seq := meta.Sequence.Stream; seq != next || meta.Sequence.Consumer <= delivered {
			gone, err := s.gap(ctx, st, next)
			if err != nil {
				return next, err
			}
			if gone {
				s.m.gaps.Inc()
				return 0, fmt.Errorf("%w: after sequence %d the consumer delivered %d, and the stream no longer holds the messages between (or was created again)", errStreamGap, next-1, seq)
			}
		}
		delivered = meta.Sequence.Consumer
		rec, err := stream.Decode(msg.Data())
		if err != nil {
			s.log.Error("stream message is not a record; skipped", "subject", msg.Subject(), "sequence", meta.Sequence.Stream, "err", err)
		} else if rec.Resync {
			if rec.Revision > s.head.Load() || s.generationChanged(ctx, st) {
				return 0, errResyncMarker
			}
		} else {
			s.applyMsg(msg, meta, rec)
			if !s.ready.Load() {
				s.m.rebuilt.Inc()
			}
		}
		next = meta.Sequence.Stream + 1
		reading.Store(next)
		if meta.NumPending == 0 || next > catchUp {
			caughtUp()
		}
	}
}

// loadSnapshot replaces every owned resource's state by etcd's state at
// revision rev (0: its current one) and returns that revision. The error
// wraps rpctypes.ErrCompacted when etcd no longer holds rev. The static
// resources are loaded first; the custom resources then are those of the
// CRDs loaded (custom.go).
func (s *Shard) loadSnapshot(ctx context.Context, rev int64) (int64, error) {
	if rev == 0 {
		var err error
		if rev, err = stream.CurrentRevision(ctx, s.etcd); err != nil {
			return 0, err
		}
	}
	for _, rs := range s.resourceStates() {
		if rs.res.Custom() {
			continue
		}
		if err := s.loadResource(ctx, rs, rev); err != nil {
			return 0, err
		}
	}
	if err := s.syncCustom(ctx, rev, true); err != nil {
		return 0, err
	}
	s.asm.Reset()
	s.setHead(rev)
	return rev, nil
}

// loadResource replaces rs's state by etcd's state at revision rev.
func (s *Shard) loadResource(ctx context.Context, rs *resourceState, rev int64) error {
	t := btree.NewG(32, lessEntry)
	prefix := rs.res.KeyPrefix()
	end := clientv3.GetPrefixRangeEnd(prefix)
	from := prefix
	for {
		resp, err := s.etcd.Get(ctx, from, clientv3.WithRange(end), clientv3.WithRev(rev), clientv3.WithLimit(1000))
		if err != nil {
			return fmt.Errorf("etcd snapshot of %s at %d: %w", rs.res.ID(), rev, err)
		}
		for _, kv := range resp.Kvs {
			key := string(kv.Key)
			r, ns, name, ok := s.reg.ParseKey(key)
			if r == nil || !slices.ContainsFunc(r.Readers(), func(x *kube.Resource) bool { return x.ID() == rs.res.ID() }) ||
				rs.parts != nil && !rs.parts[kube.Partition(ns)] {
				continue // another resource's, or a partition rs does not own
			}
			r = rs.res
			if !ok {
				s.skipKey(r, key, kv.ModRevision)
				continue
			}
			obj, err := s.dec.Decode(ctx, r, key, ns, name, kv.Value, kv.ModRevision)
			if err != nil {
				s.skipUndecodable(r, key, kv.ModRevision, err)
				continue
			}
			t.ReplaceOrInsert(&entry{key: key, obj: obj})
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	rs.reset(t, rev)
	return nil
}

func (s *Shard) setHead(rev int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rev <= s.head.Load() {
		return
	}
	s.head.Store(rev)
	s.m.head.Set(float64(rev))
	close(s.advanced)
	s.advanced = make(chan struct{})
}

// waitFor blocks until the shard has applied rev, asking the ingest leader
// for progress markers meanwhile; it fails after the configured timeout.
func (s *Shard) waitFor(ctx context.Context, rev int64, resource string) error {
	return s.wait(ctx, rev, resource, false)
}

// waitCatchingUp is waitFor for a watch resuming after rev: as long as the
// shard keeps applying revisions (a replica that just started, applying
// the stream's backlog), it waits on, up to watch.catch-up-timeout; only a
// whole wait-timeout without progress, or the cap, fails it as too large.
// The client got rev from another replica, or from this one before a
// restart, so the shard is on its way there: answering "too large" would
// make client-go relist, and a relist storm is what a restart must not
// cause.
func (s *Shard) waitCatchingUp(ctx context.Context, rev int64, resource string) error {
	return s.wait(ctx, rev, resource, true)
}

func (s *Shard) wait(ctx context.Context, rev int64, resource string, catchUp bool) error {
	if s.head.Load() >= rev {
		return nil
	}
	clk := s.waitClock()
	start := clk.Now()
	defer func() { s.m.readWait.WithLabelValues(resource).Observe(clk.Since(start).Seconds()) }()
	deadline := clk.NewTimer(s.cfg.WaitTimeout)
	defer deadline.Stop()
	var limit <-chan time.Time // the catch-up cap
	if catchUp {
		capT := clk.NewTimer(s.cfg.CatchUpTimeout)
		defer capT.Stop()
		limit = capT.C()
	}
	tick := clk.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	s.nc.Publish(stream.SubjectProgressRequest, nil)
	for {
		s.mu.Lock()
		ch := s.advanced
		s.mu.Unlock()
		if s.head.Load() >= rev {
			return nil
		}
		select {
		case <-ch:
			if catchUp {
				// Progress: a fresh wait-timeout from here.
				if !deadline.Stop() {
					select {
					case <-deadline.C():
					default:
					}
				}
				deadline.Reset(s.cfg.WaitTimeout)
			}
		case <-tick.C():
			s.nc.Publish(stream.SubjectProgressRequest, nil)
		case <-deadline.C():
			return &tooLargeError{requested: rev, current: s.head.Load()}
		case <-limit:
			return &tooLargeError{requested: rev, current: s.head.Load()}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

var errTooLarge = errors.New("the shard did not reach the requested revision in time")

// tooLargeError is errTooLarge with the revisions, worded as
// kube-apiserver's watch cache words it.
type tooLargeError struct{ requested, current int64 }

func (e *tooLargeError) Error() string {
	return fmt.Sprintf("Too large resource version: %d, current: %d", e.requested, e.current)
}

func (e *tooLargeError) Is(target error) bool { return target == errTooLarge }

// currentRevision reads etcd's current revision (a linearizable read).
func (s *Shard) currentRevision(ctx context.Context) (int64, error) {
	return stream.CurrentRevision(ctx, s.etcd)
}

// apply applies one stream record. It is only called by the follow loop.
func (s *Shard) apply(rec *heraldv1.Record) {
	head := s.head.Load()
	if rec.Progress {
		if rec.Revision > head {
			s.setHead(rec.Revision)
			for _, rs := range s.resourceStates() {
				rs.bookmark(rec.Revision)
			}
		}
		return
	}
	if rec.Revision <= head {
		return // already in the snapshot
	}
	changes, complete := s.asm.Add(rec)
	if !complete {
		return
	}
	rev := rec.Revision
	type batch struct {
		evs  []*event
		objs []*kube.Object
		keys []string
	}
	var batches map[*resourceState]*batch
	for _, c := range changes {
		owner, ns, name, ok := s.reg.ParseKey(c.Key)
		if owner == nil {
			continue
		}
		// Every resource served from the key's values (the owner and
		// its aliases, e.g. core and events.k8s.io Events).
		for _, r := range owner.Readers() {
			rs, owned := s.owns(r, ns)
			if !owned {
				continue
			}
			if !ok {
				if c.Kind == heraldv1.Change_PUT {
					s.skipKey(r, c.Key, rev)
				}
				continue
			}
			// The protobuf of the object only if a following stream
			// wants it now: made once, here, where the typed object is
			// at hand, and shared by every stream that asked.
			var dec watchevent.ValueDecoder = jsonOnly{s.dec}
			if rs.wantsProtobuf() {
				dec = s.dec
			}
			var prev *kube.Object
			ev, obj, err := watchevent.FromChange(context.Background(), dec, r, ns, name, rev, c, func() (*kube.Object, error) {
				prev = rs.get(c.Key)
				return prev, nil
			})
			if err != nil {
				s.skipUndecodable(r, c.Key, rev, err)
				continue
			}
			if ev == nil {
				continue // never served, nothing to delete
			}
			ev.ObservedUnixNano, ev.Traceparent = rec.ObservedUnixNano, s.traceparent
			if batches == nil {
				batches = map[*resourceState]*batch{}
			}
			b := batches[rs]
			if b == nil {
				b = &batch{}
				batches[rs] = b
			}
			b.evs = append(b.evs, prepared(ev, prev))
			b.objs = append(b.objs, obj)
			b.keys = append(b.keys, c.Key)
		}
	}
	crds := false
	for rs, b := range batches {
		rs.applyRevision(rev, b.evs, b.objs, b.keys)
		s.m.received.WithLabelValues(rs.res.ID()).Add(float64(len(b.evs)))
		crds = crds || rs.res.ID() == kube.CRDResourceID
	}
	if crds && s.custom {
		// Before the revision is visible: a read at rev finds the custom
		// resources as the CRDs at rev define them.
		if err := s.syncCustom(context.Background(), rev, false); err != nil {
			s.log.Error("custom resources not updated", "revision", rev, "err", err)
		}
	}
	s.setHead(rev)
	if rec.ObservedUnixNano > 0 && s.ready.Load() { // not the history a start rebuilds
		s.m.e2eLatency.Observe(time.Since(time.Unix(0, rec.ObservedUnixNano)).Seconds())
	}
}
