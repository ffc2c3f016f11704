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
package cache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/btree"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/service"
)

type metrics struct {
	received   *prometheus.CounterVec
	invalid    *prometheus.CounterVec
	head       prometheus.Gauge
	capacity   *prometheus.GaugeVec
	lists      *prometheus.CounterVec
	listTime   *prometheus.HistogramVec
	readWait   *prometheus.HistogramVec
	subs       *prometheus.GaugeVec
	subsCut    *prometheus.CounterVec
	e2eLatency prometheus.Histogram
	resyncs    prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		received: f.NewCounterVec(prometheus.CounterOpts{Name: "apiserver_watch_cache_events_received_total", Help: "Events applied to the cache, by resource."}, []string{"resource"}),
		invalid:  f.NewCounterVec(prometheus.CounterOpts{Name: "herald_cache_invalid_objects_total", Help: "Stored values skipped because they are not valid objects of their resource."}, []string{"resource"}),
		head:     f.NewGauge(prometheus.GaugeOpts{Name: "apiserver_watch_cache_resource_version", Help: "The revision the shard has applied."}),
		capacity: f.NewGaugeVec(prometheus.GaugeOpts{Name: "apiserver_watch_cache_capacity", Help: "Window capacity in events, by resource."}, []string{"resource"}),
		lists:    f.NewCounterVec(prometheus.CounterOpts{Name: "apiserver_cache_list_total", Help: "LIST requests served from the cache, by resource."}, []string{"resource"}),
		listTime: f.NewHistogramVec(prometheus.HistogramOpts{Name: "herald_cache_list_duration_seconds", Help: "Time to serve a LIST, waiting included.", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18)}, []string{"resource"}),
		readWait: f.NewHistogramVec(prometheus.HistogramOpts{Name: "apiserver_watch_cache_read_wait_seconds", Help: "Time reads waited for the shard to reach a revision.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}, []string{"resource"}),
		subs:     f.NewGaugeVec(prometheus.GaugeOpts{Name: "herald_cache_watch_streams", Help: "Following watch streams, by resource."}, []string{"resource"}),
		subsCut:  f.NewCounterVec(prometheus.CounterOpts{Name: "herald_cache_watch_streams_terminated_total", Help: "Following watch streams cut off, by reason."}, []string{"reason"}),
		resyncs:  f.NewCounter(prometheus.CounterOpts{Name: "herald_cache_resyncs_total", Help: "Rebuilds from an etcd snapshot caused by a resync marker."}),
		e2eLatency: f.NewHistogram(prometheus.HistogramOpts{Name: "herald_cache_apply_latency_seconds", Help: "From ingest receiving a revision from etcd to the shard applying it.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
	}
}

// Shard is one cache shard replica.
type Shard struct {
	cfg       Config
	log       *slog.Logger
	reg       *kube.Registry
	m         *metrics
	resources map[string]*resourceState // by resource ID

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

	ready     atomic.Bool
	firstOnce sync.Once
	firstUp   chan struct{}      // closed when the shard is ready the first time
	pending   []*heraldv1.Change // parts of a split revision
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
	sizes, _ := cfg.windowSizes()
	s := &Shard{cfg: cfg, log: log, reg: reg, m: newMetrics(promReg),
		resources: map[string]*resourceState{}, advanced: make(chan struct{}), firstUp: make(chan struct{})}
	owned, err := cfg.ownership(reg)
	if err != nil {
		return nil, err
	}
	for _, r := range reg.Resources() {
		parts, ok := owned[r.ID()]
		if owned != nil && !ok {
			continue
		}
		size := cfg.DefaultWindowSize
		if n, ok := sizes[r.ID()]; ok {
			size = n
		} else if n, ok := sizes[r.Plural]; ok {
			size = n
		}
		s.resources[r.ID()] = newResourceState(r, size)
		s.resources[r.ID()].parts = parts
		s.m.capacity.WithLabelValues(r.ID()).Set(float64(size))
	}
	for _, o := range opts {
		o(s)
	}
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

func (s *Shard) owns(r *kube.Resource, namespace string) (*resourceState, bool) {
	rs, ok := s.resources[r.ID()]
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
func (s *Shard) subjects() []string {
	out := []string{kube.SubjectMulti, kube.SubjectProgress}
	ids := make([]string, 0, len(s.resources))
	for id := range s.resources {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		r, parts := s.resources[id].res, s.resources[id].parts
		if parts == nil {
			out = append(out, r.SubjectFilter())
			continue
		}
		for p := range kube.Partitions {
			if parts[p] {
				out = append(out, fmt.Sprintf("%s.%s.%d", kube.SubjectRoot, r.SubjectToken(), p))
			}
		}
	}
	return out
}

// Run connects, loads a snapshot and follows the stream until ctx ends.
//
// When following breaks (NATS restarted, a consumer lost), the shard resumes
// from the stream sequence after the last one it applied, keeping its state,
// windows and subscribers: a broken consumer is invisible downstream. It
// rebuilds from an etcd snapshot only when it must: at start, after a resync
// marker, or when the stream no longer holds the sequence to resume from.
func (s *Shard) Run(ctx context.Context) error {
	var err error
	s.etcd, err = clientv3.New(clientv3.Config{Endpoints: s.cfg.endpoints(), DialTimeout: s.cfg.EtcdDialTimeout, Context: ctx, DialOptions: service.StaticWindows()})
	if err != nil {
		return fmt.Errorf("etcd client: %w", err)
	}
	defer s.etcd.Close()
	s.nc, err = nats.Connect(s.cfg.NATSURL, nats.Name("herald-cache"), nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(true), nats.ReconnectWait(200*time.Millisecond))
	if err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	defer s.nc.Close()
	s.js, err = jetstream.New(s.nc)
	if err != nil {
		return err
	}
	go s.pollStreamLag(ctx)
	backoff := 200 * time.Millisecond
	var next uint64 // stream sequence to resume from; 0: rebuild from a snapshot
	for ctx.Err() == nil {
		next, err = s.follow(ctx, next)
		if ctx.Err() != nil {
			break
		}
		if errors.Is(err, errResyncMarker) {
			s.log.Warn("resync marker in the stream; rebuilding from an etcd snapshot")
			s.m.resyncs.Inc()
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

var errResyncMarker = errors.New("resync marker")

// follow applies the stream from sequence next (or from a fresh snapshot
// when next is 0) until it fails; it returns the sequence to resume from.
func (s *Shard) follow(ctx context.Context, next uint64) (uint64, error) {
	stream, err := s.js.Stream(ctx, s.cfg.Stream)
	if err != nil {
		return next, fmt.Errorf("stream %s: %w", s.cfg.Stream, err)
	}
	if next > 0 {
		info, err := stream.Info(ctx)
		if err != nil {
			return next, fmt.Errorf("stream info: %w", err)
		}
		if info.State.FirstSeq > next {
			s.log.Warn("the stream no longer holds the resume point; rebuilding", "resumeSequence", next, "firstSequence", info.State.FirstSeq)
			next = 0
		}
	}
	if next == 0 {
		s.ready.Store(false)
		rev, err := s.loadSnapshot(ctx)
		if err != nil {
			return 0, err
		}
		if next, err = startSequence(ctx, stream, rev); err != nil {
			return 0, err
		}
		s.log.Info("loaded snapshot", "revision", rev, "startSequence", next, "resources", len(s.resources))
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: s.subjects(),
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    next,
	})
	if err != nil {
		return next, fmt.Errorf("consumer: %w", err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(512))
	if err != nil {
		return next, fmt.Errorf("consuming: %w", err)
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	s.ready.Store(true)
	s.firstOnce.Do(func() { close(s.firstUp) })
	for {
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return next, ctx.Err()
			}
			return next, fmt.Errorf("next message: %w", err)
		}
		meta, err := msg.Metadata()
		if err != nil {
			return next, fmt.Errorf("message metadata: %w", err)
		}
		var rec heraldv1.Record
		if err := proto.Unmarshal(msg.Data(), &rec); err != nil {
			s.log.Error("stream message is not a record; skipped", "subject", msg.Subject(), "sequence", meta.Sequence.Stream, "err", err)
		} else if rec.Resync {
			if rec.Revision > s.head.Load() {
				return 0, errResyncMarker
			}
		} else {
			s.applyMsg(msg, meta, &rec)
		}
		next = meta.Sequence.Stream + 1
	}
}

// loadSnapshot replaces every owned resource's state by etcd's current
// state and returns its revision.
func (s *Shard) loadSnapshot(ctx context.Context) (int64, error) {
	probe, err := s.etcd.Get(ctx, "/herald/rev-probe")
	if err != nil {
		return 0, fmt.Errorf("etcd: %w", err)
	}
	rev := probe.Header.Revision
	for _, rs := range s.resources {
		t := btree.NewG(32, lessEntry)
		prefix := rs.res.KeyPrefix()
		end := clientv3.GetPrefixRangeEnd(prefix)
		from := prefix
		for {
			resp, err := s.etcd.Get(ctx, from, clientv3.WithRange(end), clientv3.WithRev(rev), clientv3.WithLimit(1000))
			if err != nil {
				return 0, fmt.Errorf("etcd snapshot of %s at %d: %w", rs.res.ID(), rev, err)
			}
			for _, kv := range resp.Kvs {
				key := string(kv.Key)
				r, ns, name, ok := s.reg.ParseKey(key)
				if !ok || r != rs.res {
					continue
				}
				if _, owned := s.owns(r, ns); !owned {
					continue
				}
				obj, err := kube.Prepare(r, ns, name, kv.Value, kv.ModRevision)
				if err != nil {
					s.skipInvalid(r, key, kv.ModRevision, err)
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
	}
	s.pending = nil
	s.setHead(rev)
	return rev, nil
}

func (s *Shard) skipInvalid(r *kube.Resource, key string, rev int64, err error) {
	s.m.invalid.WithLabelValues(r.ID()).Inc()
	s.log.Warn("skipping a stored value that is not a valid object", "key", key, "revision", rev, "err", err)
}

// startSequence finds the first stream sequence holding a revision after
// rev (binary search: revisions grow along the stream).
func startSequence(ctx context.Context, stream jetstream.Stream, rev int64) (uint64, error) {
	info, err := stream.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("stream info: %w", err)
	}
	lo, hi := info.State.FirstSeq, info.State.LastSeq+1
	if info.State.Msgs == 0 {
		return hi, nil
	}
	for lo < hi {
		mid := lo + (hi-lo)/2
		msg, err := stream.GetMsg(ctx, mid)
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				lo = mid + 1 // aged out meanwhile
				continue
			}
			return 0, fmt.Errorf("stream message %d: %w", mid, err)
		}
		var r heraldv1.Record
		if err := proto.Unmarshal(msg.Data, &r); err != nil {
			return 0, fmt.Errorf("stream message %d: %w", mid, err)
		}
		if r.Revision > rev {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo, nil
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
	if s.head.Load() >= rev {
		return nil
	}
	start := time.Now()
	defer func() { s.m.readWait.WithLabelValues(resource).Observe(time.Since(start).Seconds()) }()
	deadline := time.NewTimer(s.cfg.WaitTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	s.nc.Publish(kube.SubjectProgressRequest, nil)
	for {
		s.mu.Lock()
		ch := s.advanced
		s.mu.Unlock()
		if s.head.Load() >= rev {
			return nil
		}
		select {
		case <-ch:
		case <-tick.C:
			s.nc.Publish(kube.SubjectProgressRequest, nil)
		case <-deadline.C:
			return errTooLarge
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

var errTooLarge = errors.New("the shard did not reach the requested revision in time")

// currentRevision reads etcd's current revision (a linearizable read).
func (s *Shard) currentRevision(ctx context.Context) (int64, error) {
	resp, err := s.etcd.Get(ctx, "/herald/rev-probe")
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

// apply applies one stream record. It is only called by the follow loop.
func (s *Shard) apply(rec *heraldv1.Record) {
	head := s.head.Load()
	if rec.Progress {
		if rec.Revision > head {
			s.setHead(rec.Revision)
			for _, rs := range s.resources {
				rs.bookmark(rec.Revision)
			}
		}
		return
	}
	if rec.Revision <= head {
		return // already in the snapshot
	}
	changes := rec.Changes
	if rec.Parts > 1 {
		s.pending = append(s.pending, rec.Changes...)
		if rec.Part+1 < rec.Parts {
			return
		}
		changes, s.pending = s.pending, nil
	}
	rev := rec.Revision
	type batch struct {
		evs  []*heraldv1.Event
		objs []*kube.Object
		keys []string
	}
	var batches map[*resourceState]*batch
	for _, c := range changes {
		r, ns, name, ok := s.reg.ParseKey(c.Key)
		if !ok {
			continue
		}
		rs, owned := s.owns(r, ns)
		if !owned {
			continue
		}
		prev := rs.get(c.Key)
		ev := &heraldv1.Event{Revision: rev, Namespace: ns, Name: name, ObservedUnixNano: rec.ObservedUnixNano, Traceparent: s.traceparent}
		var obj *kube.Object
		switch c.Kind {
		case heraldv1.Change_PUT:
			o, err := kube.Prepare(r, ns, name, c.Value, rev)
			if err != nil {
				s.skipInvalid(r, c.Key, rev, err)
				continue
			}
			obj = o
			ev.Type, ev.Object, ev.Labels, ev.Fields = heraldv1.EventType_ADDED, o.JSON, o.Labels, o.Fields
			if prev != nil {
				ev.Type = heraldv1.EventType_MODIFIED
				ev.PrevObject, ev.PrevLabels, ev.PrevFields = prev.WithRev(rev), prev.Labels, prev.Fields
			}
		case heraldv1.Change_DELETE:
			if prev == nil && len(c.PrevValue) > 0 {
				prev, _ = kube.Prepare(r, ns, name, c.PrevValue, rev)
			}
			if prev == nil {
				continue // never served, nothing to delete
			}
			ev.Type, ev.Object, ev.Labels, ev.Fields = heraldv1.EventType_DELETED, prev.WithRev(rev), prev.Labels, prev.Fields
		default:
			continue
		}
		if batches == nil {
			batches = map[*resourceState]*batch{}
		}
		b := batches[rs]
		if b == nil {
			b = &batch{}
			batches[rs] = b
		}
		b.evs = append(b.evs, ev)
		b.objs = append(b.objs, obj)
		b.keys = append(b.keys, c.Key)
	}
	for rs, b := range batches {
		rs.applyRevision(rev, b.evs, b.objs, b.keys)
		s.m.received.WithLabelValues(rs.res.ID()).Add(float64(len(b.evs)))
	}
	s.setHead(rev)
	if rec.ObservedUnixNano > 0 {
		s.m.e2eLatency.Observe(time.Since(time.Unix(0, rec.ObservedUnixNano)).Seconds())
	}
}
