// Package ingest owns the only path from etcd into Herald: one etcd watch on
// the object prefix, appended revision by revision to the JetStream stream.
//
// Invariants:
//   - Only the elected leader appends, and every append names the stream
//     sequence it expects to follow: a deposed or paused leader's append
//     fails instead of interleaving.
//   - Revisions are appended in etcd's order, each exactly once; a restart
//     resumes after the last revision the stream holds (or inside it, for a
//     revision split into parts).
//   - Nothing is buffered beyond the revision being published: when NATS is
//     slow or down, ingest stops reading the etcd watch.
package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/service"
)

type metrics struct {
	published     prometheus.Counter
	records       *prometheus.CounterVec
	publishTime   prometheus.Histogram
	lastRev       prometheus.Gauge
	etcdRev       prometheus.Gauge
	leader        prometheus.Gauge
	invalid       prometheus.Counter
	oversized     prometheus.Counter
	failures      *prometheus.CounterVec
	leaderChanges prometheus.Counter
	lag           prometheus.Gauge
	resyncs       prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		published:     f.NewCounter(prometheus.CounterOpts{Name: "herald_ingest_events_published_total", Help: "Key changes appended to the stream."}),
		records:       f.NewCounterVec(prometheus.CounterOpts{Name: "herald_ingest_records_published_total", Help: "Stream messages appended, by kind (revision, progress)."}, []string{"kind"}),
		publishTime:   f.NewHistogram(prometheus.HistogramOpts{Name: "herald_ingest_publish_duration_seconds", Help: "Time to append one stream message, until JetStream acknowledged it.", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}),
		lastRev:       f.NewGauge(prometheus.GaugeOpts{Name: "herald_ingest_last_published_revision", Help: "The last etcd revision appended to the stream (events or progress)."}),
		etcdRev:       f.NewGauge(prometheus.GaugeOpts{Name: "herald_ingest_etcd_revision", Help: "The latest etcd revision seen in a watch response header."}),
		leader:        f.NewGauge(prometheus.GaugeOpts{Name: "herald_ingest_leader", Help: "1 while this process is the publishing leader."}),
		invalid:       f.NewCounter(prometheus.CounterOpts{Name: "herald_ingest_invalid_values_total", Help: "Values under the prefix that are not JSON objects (appended as they are; caches skip them)."}),
		oversized:     f.NewCounter(prometheus.CounterOpts{Name: "herald_ingest_oversized_changes_total", Help: "Changes larger than stream.max-message-bytes, appended without their value (caches skip them)."}),
		failures:      f.NewCounterVec(prometheus.CounterOpts{Name: "herald_ingest_failures_total", Help: "Leadership terms ended by an error, by cause (etcd, nats, fenced, compacted)."}, []string{"cause"}),
		leaderChanges: f.NewCounter(prometheus.CounterOpts{Name: "herald_ingest_leader_terms_total", Help: "Leadership terms this process has won."}),
		lag:           f.NewGauge(prometheus.GaugeOpts{Name: "herald_ingest_revision_lag", Help: "etcd's latest revision minus the last revision appended (leader only)."}),
		resyncs:       f.NewCounter(prometheus.CounterOpts{Name: "herald_ingest_resyncs_total", Help: "Resync markers appended because the resume revision was compacted."}),
	}
}

// Ingest is one ingest replica.
type Ingest struct {
	cfg Config
	log *slog.Logger
	reg *kube.Registry
	m   *metrics
	id  string
	// tracer: nil when tracing is off (see WithTracer).
	tracer trace.Tracer

	etcd   *clientv3.Client
	nc     *nats.Conn
	js     jetstream.JetStream
	stream jetstream.Stream

	ready  atomic.Bool // the stream exists
	etcdOK atomic.Bool // the last etcd interaction succeeded
	// pause, when set, freezes the next append until it is closed (fault
	// injection: a long GC pause in the middle of an append).
	pause atomic.Pointer[chan struct{}]
}

// New validates cfg and creates a replica; Run connects and runs it.
func New(cfg Config, log *slog.Logger, promReg prometheus.Registerer, opts ...Option) (*Ingest, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	reg, err := kube.LoadRegistry(cfg.ResourcesFile, cfg.Prefix)
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	i := &Ingest{
		cfg: cfg, log: log, reg: reg, m: newMetrics(promReg),
		id: host + "/" + strconv.Itoa(os.Getpid()),
	}
	for _, o := range opts {
		o(i)
	}
	return i, nil
}

// Ready reports whether the replica is connected and has its stream.
func (i *Ingest) Ready() error {
	switch {
	case !i.ready.Load():
		return errors.New("the stream is not set up yet")
	case !i.nc.IsConnected():
		return errors.New("not connected to NATS")
	case !i.etcdOK.Load():
		return errors.New("etcd is unreachable")
	}
	return nil
}

// Run connects to etcd and NATS and then campaigns, leads and campaigns
// again until ctx ends.
func (i *Ingest) Run(ctx context.Context) error {
	var err error
	i.etcd, err = clientv3.New(clientv3.Config{
		Endpoints:   i.cfg.Endpoints(),
		DialTimeout: i.cfg.EtcdDialTimeout,
		Context:     ctx,
		Logger:      nil,
		// One message per revision: fixed windows spare a flow-control
		// ping per watch response.
		DialOptions: service.StaticWindows(),
	})
	if err != nil {
		return fmt.Errorf("etcd client: %w", err)
	}
	defer i.etcd.Close()
	i.nc, err = nats.Connect(i.cfg.NATSURL,
		nats.Name("herald-ingest "+i.id),
		nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(true),
		nats.ReconnectWait(200*time.Millisecond),
	)
	if err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	defer i.nc.Close()
	i.js, err = jetstream.New(i.nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}

	backoff := i.cfg.RetryBackoff
	for ctx.Err() == nil {
		if i.stream == nil {
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			i.stream, err = i.js.CreateOrUpdateStream(sctx, i.cfg.StreamConfig())
			cancel()
			if err != nil {
				i.log.Warn("cannot create or update the stream; retrying", "stream", i.cfg.Stream, "err", err, "backoff", backoff)
				i.stream = nil
				backoff = sleep(ctx, backoff)
				continue
			}
			i.ready.Store(true)
		}
		err = i.term(ctx)
		if ctx.Err() != nil {
			break
		}
		i.log.Warn("leadership term ended; campaigning again", "err", err, "backoff", backoff)
		backoff = sleep(ctx, backoff)
		if err == nil {
			backoff = i.cfg.RetryBackoff
		}
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) time.Duration {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	return min(2*d, 10*time.Second)
}

// term campaigns for leadership, leads until it is lost or fails, and
// resigns.
func (i *Ingest) term(ctx context.Context) error {
	sess, err := concurrency.NewSession(i.etcd, concurrency.WithTTL(int((i.cfg.LeaseTTL+time.Second-1)/time.Second)), concurrency.WithContext(ctx))
	if err != nil {
		i.etcdOK.Store(false)
		i.m.failures.WithLabelValues("etcd").Inc()
		return fmt.Errorf("etcd session: %w", err)
	}
	i.etcdOK.Store(true)
	defer sess.Close()
	el := concurrency.NewElection(sess, i.cfg.ElectionPrefix)
	if err := el.Campaign(ctx, i.id); err != nil {
		i.m.failures.WithLabelValues("etcd").Inc()
		return fmt.Errorf("campaign: %w", err)
	}
	i.m.leaderChanges.Inc()
	i.m.leader.Set(1)
	defer i.m.leader.Set(0)
	i.log.Info("became ingest leader", "id", i.id, "lease", sess.Lease())

	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-sess.Done():
			i.log.Warn("leader lease lost")
			cancel()
		case <-lctx.Done():
		}
	}()
	err = i.lead(lctx)
	rctx, rcancel := context.WithTimeout(context.Background(), time.Second)
	defer rcancel()
	el.Resign(rctx)
	return err
}

// resumePoint reads the stream's last message: the sequence the next append
// must follow and the revision (and part) to resume from.
func (i *Ingest) resumePoint(ctx context.Context) (lastSeq uint64, startRev int64, skipParts uint32, err error) {
	info, err := i.stream.Info(ctx)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("stream info: %w", err)
	}
	lastSeq = info.State.LastSeq
	if info.State.Msgs == 0 {
		return lastSeq, 0, 0, nil
	}
	msg, err := i.stream.GetMsg(ctx, lastSeq)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("reading stream message %d: %w", lastSeq, err)
	}
	var rec heraldv1.Record
	if err := proto.Unmarshal(msg.Data, &rec); err != nil {
		return 0, 0, 0, fmt.Errorf("stream message %d is not a record: %w", lastSeq, err)
	}
	if !rec.Progress && !rec.Resync && rec.Part+1 < rec.Parts {
		return lastSeq, rec.Revision, rec.Part + 1, nil
	}
	return lastSeq, rec.Revision + 1, 0, nil
}

// publisher appends records, fencing each on the sequence it expects.
type publisher struct {
	i       *Ingest
	lastSeq uint64
	lastRev int64
}

var errFenced = errors.New("stream was appended to by another writer")

func (p *publisher) publish(ctx context.Context, subject, msgID string, rec *heraldv1.Record) error {
	return p.publishMsg(ctx, subject, msgID, rec, nil)
}

// publishMsg appends rec with the message headers hdr (trace context).
func (p *publisher) publishMsg(ctx context.Context, subject, msgID string, rec *heraldv1.Record, hdr nats.Header) error {
	if ch := p.i.pause.Load(); ch != nil {
		// Frozen in the middle of an append (fault injection): like a
		// process stopped by a long GC pause, it carries on with the append
		// when it wakes, whatever happened to its leadership meanwhile. Only
		// the fence can stop it.
		<-*ch
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
	}
	data, err := proto.Marshal(rec)
	if err != nil {
		return err
	}
	start := time.Now()
	ack, err := p.i.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: data, Header: hdr},
		jetstream.WithMsgID(msgID),
		jetstream.WithExpectStream(p.i.cfg.Stream),
		jetstream.WithExpectLastSequence(p.lastSeq),
	)
	if err != nil {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
			p.i.m.failures.WithLabelValues("fenced").Inc()
			return fmt.Errorf("%w: expected last sequence %d: %v", errFenced, p.lastSeq, err)
		}
		p.i.m.failures.WithLabelValues("nats").Inc()
		return fmt.Errorf("publishing %s: %w", msgID, err)
	}
	if ack.Duplicate {
		p.i.m.failures.WithLabelValues("fenced").Inc()
		return fmt.Errorf("%w: message %s already in the stream", errFenced, msgID)
	}
	p.i.m.publishTime.Observe(time.Since(start).Seconds())
	p.lastSeq = ack.Sequence
	p.lastRev = rec.Revision
	p.i.m.lastRev.Set(float64(rec.Revision))
	if rec.Progress || rec.Resync {
		p.i.m.records.WithLabelValues("progress").Inc()
	} else {
		p.i.m.records.WithLabelValues("revision").Inc()
		p.i.m.published.Add(float64(len(rec.Changes)))
	}
	return nil
}

// lead runs one leadership term: resume from the stream, then watch etcd and
// append until ctx ends or something fails.
func (i *Ingest) lead(ctx context.Context) error {
	lastSeq, startRev, skipParts, err := i.resumePoint(ctx)
	if err != nil {
		i.m.failures.WithLabelValues("nats").Inc()
		return err
	}
	p := &publisher{i: i, lastSeq: lastSeq, lastRev: startRev - 1}
	if startRev == 0 {
		// An empty stream: history starts now. Mark the start so that
		// caches know from which revision the stream is complete.
		resp, err := i.etcd.Get(ctx, i.cfg.ElectionPrefix+"/rev-probe")
		if err != nil {
			i.m.failures.WithLabelValues("etcd").Inc()
			return fmt.Errorf("reading etcd revision: %w", err)
		}
		rev := resp.Header.Revision
		if err := p.publish(ctx, kube.SubjectProgress, "p"+strconv.FormatInt(rev, 10), &heraldv1.Record{Revision: rev, Progress: true, Parts: 1}); err != nil {
			return err
		}
		startRev = rev + 1
	}
	i.log.Info("resuming from the stream", "revision", startRev, "skipParts", skipParts, "lastSequence", p.lastSeq)

	progressReq := make(chan struct{}, 1)
	sub, err := i.nc.Subscribe(kube.SubjectProgressRequest, func(*nats.Msg) {
		select {
		case progressReq <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return fmt.Errorf("subscribing to progress requests: %w", err)
	}
	defer sub.Unsubscribe()

	wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer wcancel()
	wch := i.etcd.Watch(wctx, i.reg.Prefix()+"/",
		clientv3.WithPrefix(), clientv3.WithRev(startRev), clientv3.WithPrevKV(), clientv3.WithProgressNotify())
	ticker := time.NewTicker(i.cfg.ProgressInterval)
	defer ticker.Stop()
	lastProgress := p.lastRev
	var lastRequest time.Time
	requestProgress := func() {
		// Coalesce: etcd answers every request with a notification.
		if time.Since(lastRequest) < 20*time.Millisecond {
			return
		}
		lastRequest = time.Now()
		if err := i.etcd.RequestProgress(wctx); err != nil {
			i.log.Debug("progress request failed", "err", err)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ticker.C:
			requestProgress()
		case <-progressReq:
			requestProgress()
		case resp, ok := <-wch:
			if !ok {
				i.m.failures.WithLabelValues("etcd").Inc()
				return errors.New("etcd watch closed")
			}
			if resp.CompactRevision != 0 {
				return i.resync(ctx, p, resp.CompactRevision)
			}
			if err := resp.Err(); err != nil {
				i.etcdOK.Store(false)
				i.m.failures.WithLabelValues("etcd").Inc()
				return fmt.Errorf("etcd watch: %w", err)
			}
			i.etcdOK.Store(true)
			i.m.etcdRev.Set(float64(resp.Header.Revision))
			i.m.lag.Set(float64(resp.Header.Revision - p.lastRev))
			if resp.IsProgressNotify() {
				rev := resp.Header.Revision
				if rev > lastProgress && rev >= p.lastRev {
					if err := p.publish(ctx, kube.SubjectProgress, "p"+strconv.FormatInt(rev, 10), &heraldv1.Record{Revision: rev, Progress: true, Parts: 1}); err != nil {
						return err
					}
					lastProgress = rev
				}
				continue
			}
			if err := i.publishEvents(ctx, p, resp.Events, startRev, skipParts); err != nil {
				return err
			}
		}
	}
}

// resync handles a compacted resume point: the history between the stream's
// last revision and etcd's compaction is gone, so the stream gets a resync
// marker at etcd's current revision (consumers rebuild from an etcd snapshot
// at or after it) and the next term resumes right after it.
func (i *Ingest) resync(ctx context.Context, p *publisher, compacted int64) error {
	resp, err := i.etcd.Get(ctx, i.cfg.ElectionPrefix+"/rev-probe")
	if err != nil {
		i.m.failures.WithLabelValues("etcd").Inc()
		return fmt.Errorf("reading etcd revision for a resync: %w", err)
	}
	rev := resp.Header.Revision
	i.log.Warn("resume revision was compacted; appending a resync marker", "resumeAfter", p.lastRev, "compactRevision", compacted, "resyncRevision", rev)
	if err := p.publish(ctx, kube.SubjectProgress, "r"+strconv.FormatInt(rev, 10), &heraldv1.Record{Revision: rev, Resync: true, Parts: 1}); err != nil {
		return err
	}
	i.m.resyncs.Inc()
	i.m.failures.WithLabelValues("compacted").Inc()
	return errResynced
}

var errResynced = errors.New("resynced after compaction; resuming after the marker")

// publishEvents appends the events of one watch response, one record (or
// several parts) per revision.
func (i *Ingest) publishEvents(ctx context.Context, p *publisher, events []*clientv3.Event, resumeRev int64, skipParts uint32) error {
	now := time.Now().UnixNano()
	for start := 0; start < len(events); {
		rev := events[start].Kv.ModRevision
		end := start
		for end < len(events) && events[end].Kv.ModRevision == rev {
			end++
		}
		changes := make([]*heraldv1.Change, 0, end-start)
		subject := ""
		for _, ev := range events[start:end] {
			c := i.change(ev)
			changes = append(changes, c)
			s := kube.SubjectOther
			if r, ns, _, ok := i.reg.ParseKey(c.Key); ok {
				s = r.Subject(ns)
			}
			switch subject {
			case "", s:
				subject = s
			default:
				subject = kube.SubjectMulti
			}
		}
		parts := i.split(changes)
		sctx, hdr, spanDone := i.startPublishSpan(ctx, subject, rev, len(changes))
		for n, part := range parts {
			if rev == resumeRev && uint32(n) < skipParts {
				continue
			}
			rec := &heraldv1.Record{Revision: rev, Changes: part, Part: uint32(n), Parts: uint32(len(parts)), ObservedUnixNano: now}
			if err := p.publishMsg(sctx, subject, strconv.FormatInt(rev, 10)+"."+strconv.Itoa(n), rec, hdr); err != nil {
				spanDone(err)
				return err
			}
		}
		spanDone(nil)
		start = end
	}
	return nil
}

func (i *Ingest) change(ev *clientv3.Event) *heraldv1.Change {
	key := string(ev.Kv.Key)
	c := &heraldv1.Change{Key: key}
	if ev.Type == clientv3.EventTypeDelete {
		c.Kind = heraldv1.Change_DELETE
		if ev.PrevKv != nil {
			c.PrevValue = ev.PrevKv.Value
		}
	} else {
		c.Kind = heraldv1.Change_PUT
		c.Value = ev.Kv.Value
		c.CreateRevision = ev.Kv.CreateRevision
		if _, _, _, ok := i.reg.ParseKey(key); ok && !isJSONObject(c.Value) {
			i.m.invalid.Inc()
			i.log.Debug("value is not a JSON object; caches will skip it", "key", key, "revision", ev.Kv.ModRevision)
		}
	}
	if size := len(c.Value) + len(c.PrevValue) + len(c.Key) + 64; size > i.cfg.MaxMessageBytes {
		i.m.oversized.Inc()
		i.log.Error("change exceeds the largest stream message; appended without its value", "key", key, "revision", ev.Kv.ModRevision, "bytes", size)
		c.Value, c.PrevValue = nil, nil
	}
	return c
}

// isJSONObject reports whether b is one valid JSON object. It validates
// without decoding: ingest only counts bad values, caches parse them.
func isJSONObject(b []byte) bool {
	b = bytes.TrimLeft(b, " \t\r\n")
	return len(b) > 0 && b[0] == '{' && json.Valid(b)
}

// split groups changes into parts that each fit in one message.
func (i *Ingest) split(changes []*heraldv1.Change) [][]*heraldv1.Change {
	var parts [][]*heraldv1.Change
	var cur []*heraldv1.Change
	size := 0
	for _, c := range changes {
		cs := proto.Size(c) + 8
		if len(cur) > 0 && size+cs > i.cfg.MaxMessageBytes-256 {
			parts = append(parts, cur)
			cur, size = nil, 0
		}
		cur = append(cur, c)
		size += cs
	}
	return append(parts, cur)
}

// FaultHandlers are the fault-injection endpoints (tests only):
// pause-publish freezes the next append in flight, resume-publish lets it
// go on.
func (i *Ingest) FaultHandlers() map[string]http.Handler {
	return map[string]http.Handler{
		"/debug/fault/pause-publish": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ch := make(chan struct{})
			i.pause.CompareAndSwap(nil, &ch)
		}),
		"/debug/fault/resume-publish": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if ch := i.pause.Swap(nil); ch != nil {
				close(*ch)
			}
		}),
	}
}
