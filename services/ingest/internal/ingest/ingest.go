// Package ingest owns the only path from etcd into Herald: one etcd watch on
// the object prefix, appended revision by revision to the JetStream stream.
//
// Invariants:
//   - Only the elected leader appends, and every append names the stream
//     sequence it expects to follow: a deposed or paused leader's append
//     fails instead of interleaving.
//   - Revisions are appended in etcd's order, each exactly once; a restart
//     resumes after the last revision the stream holds (or inside it, for a
//     revision split into parts, if it frames that revision as the parts
//     already there; otherwise, as when etcd compacted the resume point, the
//     stream gets a resync marker). A stream that was appended to but holds
//     nothing (aged out, purged) has lost that revision: the new term starts
//     with a resync marker, never a progress marker that would hide the
//     changes nobody appended.
//   - No change is dropped or truncated for its size: one larger than a
//     stream message is framed in fragments (libs/stream).
//   - Nothing is buffered beyond the records in flight to JetStream (at most
//     publish.max-in-flight, publisher.go): when NATS is slow or down, ingest
//     stops reading the etcd watch.
//
// The stream's rules (subjects, framing into parts, message ids, markers,
// where to resume) are libs/stream's; ingest decides when to append.
package ingest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
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
	"k8s.io/utils/clock"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/service"
	"herald.dev/libs/stream"
)

type metrics struct {
	published     prometheus.Counter
	records       *prometheus.CounterVec
	publishTime   prometheus.Histogram
	lastRev       prometheus.Gauge
	etcdRev       prometheus.Gauge
	leader        prometheus.Gauge
	fragmented    prometheus.Counter
	failures      *prometheus.CounterVec
	leaderChanges prometheus.Counter
	lag           prometheus.Gauge
	resyncs       prometheus.Counter
	inFlight      prometheus.Gauge
	generation    prometheus.Gauge // herald_stream_generation (generation.go)
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		published:     f.NewCounter(prometheus.CounterOpts{Name: "herald_ingest_events_published_total", Help: "Key changes appended to the stream."}),
		records:       f.NewCounterVec(prometheus.CounterOpts{Name: "herald_ingest_records_published_total", Help: "Stream messages appended, by kind (revision, progress)."}, []string{"kind"}),
		publishTime:   f.NewHistogram(prometheus.HistogramOpts{Name: "herald_ingest_publish_duration_seconds", Help: "Time to append one stream message, from sending it until JetStream's ack is consumed (in order, behind the messages sent before it).", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}),
		lastRev:       f.NewGauge(prometheus.GaugeOpts{Name: "herald_ingest_last_published_revision", Help: "The last etcd revision appended to the stream (events or progress)."}),
		etcdRev:       f.NewGauge(prometheus.GaugeOpts{Name: "herald_ingest_etcd_revision", Help: "The latest etcd revision seen in a watch response header."}),
		leader:        f.NewGauge(prometheus.GaugeOpts{Name: "herald_ingest_leader", Help: "1 while this process is the publishing leader."}),
		fragmented:    f.NewCounter(prometheus.CounterOpts{Name: "herald_ingest_fragmented_changes_total", Help: "Changes larger than one stream message (stream.max-message-bytes), appended in fragments over several parts."}),
		failures:      f.NewCounterVec(prometheus.CounterOpts{Name: "herald_ingest_failures_total", Help: "Leadership terms ended by an error, by cause (etcd, nats, fenced, compacted, reframed, stream_lost)."}, []string{"cause"}),
		leaderChanges: f.NewCounter(prometheus.CounterOpts{Name: "herald_ingest_leader_terms_total", Help: "Leadership terms this process has won."}),
		lag:           f.NewGauge(prometheus.GaugeOpts{Name: "herald_ingest_revision_lag", Help: "etcd's latest revision minus the last revision appended (leader only)."}),
		resyncs:       f.NewCounter(prometheus.CounterOpts{Name: "herald_ingest_resyncs_total", Help: "Resync markers appended because the resume point was lost (compacted in etcd, the stream emptied, or the stream ends inside a revision framed otherwise)."}),
		inFlight:      f.NewGauge(prometheus.GaugeOpts{Name: "herald_ingest_records_in_flight", Help: "Stream messages sent and not yet acknowledged by JetStream (at most publish.max-in-flight)."}),
		generation:    generationGauge(reg),
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
	// clock: the wall clock unless WithClock gave another.
	clock clock.WithTicker

	etcd   *clientv3.Client
	nc     *nats.Conn
	js     jetstream.JetStream
	stream jetstream.Stream

	ready atomic.Bool // the stream exists
	// lost: the stream was found gone and is not created again yet
	// (generation.go); its loss is logged and counted once.
	lost   atomic.Bool
	etcdOK atomic.Bool // the last etcd interaction succeeded
	// pause, when set, freezes the next append until it is closed (fault
	// injection: a long GC pause in the middle of an append).
	pause atomic.Pointer[chan struct{}]
	// gen is the stream's generation, as the leader checked it
	// (generation.go).
	gen atomic.Int64
	// known is the generation this replica last saw the stream record,
	// knownLast the last revision it saw the stream hold (Run's goroutine
	// only): what a stream found gone, or created again without them,
	// lost (generation.go).
	known     stream.Generation
	knownLast int64
	// appends counts the records this replica appended (Run's goroutine
	// only): a term that moved it succeeded, whatever ended it.
	appends uint64
	// sent, if not nil, is called on Run's goroutine after each record is
	// sent, with the number in flight (tests).
	sent func(inFlight int)
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
		id:    host + "/" + strconv.Itoa(os.Getpid()),
		clock: clock.RealClock{},
	}
	for _, o := range opts {
		o(i)
	}
	return i, nil
}

// Ready reports whether the replica is connected and has its stream.
func (i *Ingest) Ready() error {
	switch {
	case i.lost.Load():
		return errors.New("the stream is gone; waiting to create it again")
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
	etcdTLS, natsTLS, natsUser, err := i.cfg.Security(i.log)
	if err != nil {
		return err
	}
	i.etcd, err = clientv3.New(clientv3.Config{
		Endpoints:   i.cfg.Endpoints(),
		DialTimeout: i.cfg.EtcdDialTimeout,
		TLS:         etcdTLS,
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
	if err := i.connectNATS(natsTLS, natsUser); err != nil {
		return err
	}
	defer i.nc.Close()

	backoff := i.cfg.RetryBackoff
	for ctx.Err() == nil {
		if i.stream == nil {
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			i.stream, err = i.js.CreateOrUpdateStream(sctx, i.streamConfig(sctx))
			cancel()
			if err != nil {
				i.log.Warn("cannot create or update the stream; retrying", "stream", i.cfg.Stream, "err", err, "backoff", backoff)
				i.stream = nil
				backoff = i.sleep(ctx, backoff)
				continue
			}
			i.ready.Store(true)
		}
		appends := i.appends
		err = i.term(ctx)
		if ctx.Err() != nil {
			break
		}
		if i.appends != appends {
			// The term appended: the failure that ended it (a lost
			// lease, a resync) is the first of its kind, not one more
			// of a series, which would keep even the only replica off
			// the stream for up to 10 s.
			backoff = i.cfg.RetryBackoff
		}
		i.log.Warn("leadership term ended; campaigning again", "err", err, "backoff", backoff)
		backoff = i.sleep(ctx, backoff)
	}
	return nil
}

// connectNATS connects to NATS. Its JetStream client fails an append not
// acknowledged within publishTimeout (the publisher relies on it to bound
// its waits) and keeps as many in flight as the publisher may.
func (i *Ingest) connectNATS(tlsConfig *tls.Config, user func() (string, string)) error {
	nc, _, err := stream.Connect(i.cfg.NATSURL, "herald-ingest "+i.id, tlsConfig, user)
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(publishTimeout), jetstream.WithPublishAsyncMaxPending(max(i.cfg.PublishMaxInFlight, 1)))
	if err != nil {
		nc.Close()
		return fmt.Errorf("jetstream: %w", err)
	}
	i.nc, i.js = nc, js
	return nil
}

// sleep waits d on the replica's clock (or until ctx ends) and returns the
// next backoff.
func (i *Ingest) sleep(ctx context.Context, d time.Duration) time.Duration {
	t := i.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C():
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
// must follow and the revision (and part) to resume from. startRev is 0 when
// the stream holds no message: a new stream when lastSeq is 0, otherwise an
// emptied one (aged out, purged) whose resume point is lost.
func (i *Ingest) resumePoint(ctx context.Context) (lastSeq uint64, startRev int64, skipParts uint32, err error) {
	lastSeq, last, err := stream.Last(ctx, i.stream)
	if err != nil || last == nil {
		return lastSeq, 0, 0, err
	}
	startRev, skipParts = stream.Next(last)
	return lastSeq, startRev, skipParts, nil
}

// lead runs one leadership term: resume from the stream, then watch etcd and
// append until ctx ends or something fails.
func (i *Ingest) lead(ctx context.Context) error {
	recreated, err := i.checkGeneration(ctx)
	if err != nil {
		return err
	}
	lastSeq, startRev, skipParts, err := i.resumePoint(ctx)
	if err != nil {
		if lost := i.streamLost(ctx, err); lost != nil {
			return lost
		}
		i.m.failures.WithLabelValues("nats").Inc()
		return err
	}
	p := i.newPublisher(lastSeq, startRev-1)
	// However the term ends, none of its records is left in flight.
	defer p.drain()
	if startRev == 0 {
		// An empty stream: history starts now. Mark the start so that
		// caches know from which revision the stream is complete.
		rev, err := stream.CurrentRevision(ctx, i.etcd)
		if err != nil {
			i.m.failures.WithLabelValues("etcd").Inc()
			return err
		}
		marker := stream.Progress(rev)
		switch {
		case recreated:
			// A new generation in a stream created again: what the lost
			// one held, and the changes nobody appended since, reach
			// caches only through a rebuild from etcd.
			marker = stream.Resync(rev)
			i.log.Warn("the stream was created again; starting a new generation with a resync marker (caches rebuild from etcd, older resourceVersions expire)",
				"generation", i.gen.Load(), "expiredThrough", i.known.Floor, "resyncRevision", rev)
		case lastSeq > 0:
			// Emptied (aged out, purged): what was appended last, and so
			// where to resume, is lost, and so may be changes caches never
			// saw. A progress marker would move their heads past them; a
			// resync marker makes them rebuild from etcd, and watchers
			// older than it get 410.
			marker = stream.Resync(rev)
			i.log.Warn("the stream is empty but was appended to; appending a resync marker", "lastSequence", lastSeq, "resyncRevision", rev)
		}
		if err := p.publishMarker(ctx, marker); err != nil {
			return err
		}
		if marker.Resync {
			i.m.resyncs.Inc()
		}
		startRev = rev + 1
	}
	i.log.Info("resuming from the stream", "revision", startRev, "skipParts", skipParts, "lastSequence", p.lastSeq)
	return i.follow(ctx, p, startRev, skipParts)
}

// follow watches etcd from startRev (its first skipParts parts are in the
// stream) and appends through p until ctx ends or something fails.
func (i *Ingest) follow(ctx context.Context, p *publisher, startRev int64, skipParts uint32) error {
	progressReq := make(chan struct{}, 1)
	sub, err := i.nc.Subscribe(stream.SubjectProgressRequest, func(*nats.Msg) {
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
	ticker := i.clock.NewTicker(i.cfg.ProgressInterval)
	defer ticker.Stop()
	lastProgress := p.sentRev
	var lastRequest time.Time
	requestProgress := func() {
		// Coalesce: etcd answers every request with a notification.
		if i.clock.Since(lastRequest) < 20*time.Millisecond {
			return
		}
		lastRequest = i.clock.Now()
		if err := i.etcd.RequestProgress(wctx); err != nil {
			i.log.Debug("progress request failed", "err", err)
		}
	}
	for {
		// Acks are consumed here as they come, and by the publisher when
		// its pipeline is full.
		acked, refused := p.oldest()
		select {
		case <-ctx.Done():
			// Lease lost, or stopping: what is in flight still counts.
			if err := p.flush(ctx); err != nil {
				return err
			}
			return ctx.Err()
		case ack := <-acked:
			if err := p.settle(ctx, ack, nil); err != nil {
				return err
			}
		case err := <-refused:
			if err := p.settle(ctx, nil, err); err != nil {
				return err
			}
		case <-ticker.C():
			requestProgress()
		case <-progressReq:
			requestProgress()
		case resp, ok := <-wch:
			if !ok {
				i.m.failures.WithLabelValues("etcd").Inc()
				return errors.New("etcd watch closed")
			}
			if resp.CompactRevision != 0 {
				// The history between the stream's last revision and
				// etcd's compaction is gone.
				return i.resync(ctx, p, "compacted", "resume revision was compacted",
					"resumeAfter", p.lastRev, "compactRevision", resp.CompactRevision)
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
				// Behind the records in flight, in the same pipeline: a
				// marker is fenced like them, and waiting for their acks
				// first would only delay it.
				if rev > lastProgress && rev >= p.sentRev {
					if err := p.send(ctx, stream.SubjectProgress, stream.Progress(rev), nil, nil); err != nil {
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

// resync handles a lost resume point (cause: the failure it counts as; why
// and args: the log's account of it): the stream gets a resync marker at
// etcd's current revision (consumers rebuild from an etcd snapshot at or
// after it) and the next term resumes right after it.
func (i *Ingest) resync(ctx context.Context, p *publisher, cause, why string, args ...any) error {
	rev, err := stream.CurrentRevision(ctx, i.etcd)
	if err != nil {
		i.m.failures.WithLabelValues("etcd").Inc()
		return fmt.Errorf("resync: %w", err)
	}
	i.log.Warn(why+"; appending a resync marker", append(args, "resyncRevision", rev)...)
	// Behind the records in flight, and waited for: the term ends with
	// it, and counts it once it is in the stream.
	if err := p.publishMarker(ctx, stream.Resync(rev)); err != nil {
		return err
	}
	i.m.resyncs.Inc()
	i.m.failures.WithLabelValues(cause).Inc()
	return errResynced
}

var errResynced = errors.New("resume point lost; resuming after the resync marker")

// continuesStream reports whether recs, this replica's parts of the
// revision the stream ends inside, begin with the skip parts the stream
// holds (its last messages, up to p.lastSeq) on subject: only then do the
// other parts complete that revision. Framed otherwise (another
// stream.max-message-bytes, framing rules changed by an upgrade, another
// resources file), they would cut the revision's changes elsewhere or land
// on another subject, and a reader would assemble a revision whose values
// are cut wrong.
func (i *Ingest) continuesStream(ctx context.Context, p *publisher, subject string, recs []*heraldv1.Record, skip uint32) (bool, error) {
	if uint32(len(recs)) < skip || p.lastSeq < uint64(skip) {
		return false, nil
	}
	for part := range skip {
		seq := p.lastSeq - uint64(skip-1-part)
		msg, err := i.stream.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // aged out: nothing to compare with
		}
		if err != nil {
			i.m.failures.WithLabelValues("nats").Inc()
			return false, fmt.Errorf("reading stream message %d: %w", seq, err)
		}
		written, err := stream.Decode(msg.Data)
		if err != nil || msg.Subject != subject || !samePart(written, recs[part]) {
			return false, nil
		}
	}
	return true, nil
}

// samePart: a and b are the same part of one framing of a revision (when
// each was observed aside).
func samePart(a, b *heraldv1.Record) bool {
	return a.Revision == b.Revision && a.Part == b.Part && a.Parts == b.Parts && !stream.IsMarker(a) &&
		slices.EqualFunc(a.Changes, b.Changes, func(x, y *heraldv1.Change) bool { return proto.Equal(x, y) })
}

// publishEvents appends the events of one watch response, one record (or
// several parts) per revision.
func (i *Ingest) publishEvents(ctx context.Context, p *publisher, events []*clientv3.Event, resumeRev int64, skipParts uint32) error {
	now := i.clock.Now().UnixNano()
	for start := 0; start < len(events); {
		rev := events[start].Kv.ModRevision
		end := start
		for end < len(events) && events[end].Kv.ModRevision == rev {
			end++
		}
		changes := make([]*heraldv1.Change, 0, end-start)
		for _, ev := range events[start:end] {
			changes = append(changes, i.change(ev))
		}
		subject := stream.SubjectOf(i.reg, changes)
		recs := stream.Frame(rev, changes, i.cfg.MaxMessageBytes, now)
		if rev == resumeRev && skipParts > 0 {
			// Compared with the stream's end as acknowledged.
			if err := p.flush(ctx); err != nil {
				return err
			}
			ok, err := i.continuesStream(ctx, p, subject, recs, skipParts)
			if err != nil {
				return err
			}
			if !ok {
				// The revision cannot be completed: readers drop its
				// parts in the stream, and rebuild at the marker.
				return i.resync(ctx, p, "reframed", "the stream ends inside a revision this replica frames otherwise",
					"revision", rev, "partsWritten", skipParts, "parts", len(recs))
			}
		}
		if err := i.sendRevision(ctx, p, subject, recs, len(changes), resumeRev, skipParts); err != nil {
			return err
		}
		start = end
	}
	return nil
}

// sendRevision sends the parts recs of one revision (changes: how many)
// on subject, but for the first skipParts of resumeRev. Its span ends when
// the last part's ack is consumed.
func (i *Ingest) sendRevision(ctx context.Context, p *publisher, subject string, recs []*heraldv1.Record, changes int, resumeRev int64, skipParts uint32) error {
	rev := recs[0].Revision
	_, hdr, spanDone := i.startPublishSpan(ctx, subject, rev, changes)
	for n, rec := range recs {
		if rev == resumeRev && rec.Part < skipParts {
			continue
		}
		var done func(error)
		if n == len(recs)-1 {
			done = spanDone
		}
		if err := p.send(ctx, subject, rec, hdr, done); err != nil {
			spanDone(err)
			return err
		}
	}
	if rev == resumeRev && uint32(len(recs)) <= skipParts {
		spanDone(nil) // every part was in the stream already
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
		// The value as etcd holds it (protobuf, JSON, still encrypted if
		// encrypted): only caches decode values, and skip what they
		// cannot.
		c.CreateRevision = ev.Kv.CreateRevision
	}
	if size := len(c.Value) + len(c.PrevValue) + len(c.Key) + 64; size > i.cfg.MaxMessageBytes {
		// Framed in fragments over several parts (libs/stream's Frame):
		// delivered whole, never dropped for its size.
		i.m.fragmented.Inc()
		i.log.Debug("change exceeds one stream message; appended in fragments", "key", key, "revision", ev.Kv.ModRevision, "bytes", size)
	}
	return c
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
