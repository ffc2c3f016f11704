package cache

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/service"
	"herald.dev/libs/stream"
)

// Option configures a Shard beyond its Config.
type Option func(*Shard)

// WithTracer traces the application of every sampled revision: a
// "cache.apply" span, child of ingest's span (read from the message header
// "traceparent"), whose context the shard stores in each Event it builds so
// that the fanout continues the same trace. nil: no tracing.
func WithTracer(t trace.Tracer) Option { return func(s *Shard) { s.tracer = t } }

// obsMetrics are the shard's lag and queue gauges.
type obsMetrics struct {
	pending prometheus.Gauge
	lag     prometheus.Gauge
	last    prometheus.Gauge
}

func newObsMetrics(reg prometheus.Registerer, s *Shard) *obsMetrics {
	f := promauto.With(reg)
	f.NewGaugeFunc(prometheus.GaugeOpts{Name: "herald_cache_watch_queue_events",
		Help: "Revisions queued on following watch streams, not yet sent (sum over streams)."}, s.queuedRevisions)
	f.NewGaugeFunc(prometheus.GaugeOpts{Name: "herald_cache_ready",
		Help: "1 while the shard is ready (snapshot loaded, following the stream): what /readyz reports."}, func() float64 {
		if s.Ready() != nil {
			return 0
		}
		return 1
	})
	return &obsMetrics{
		pending: f.NewGauge(prometheus.GaugeOpts{Name: "herald_cache_jetstream_consumer_pending_messages",
			Help: "Stream messages of the shard's subjects not yet delivered to it (JetStream consumer lag, as of the last message consumed)."}),
		lag: f.NewGauge(prometheus.GaugeOpts{Name: "herald_cache_revision_lag",
			Help: "The revision of the stream's last message minus the shard's head revision (sampled every second)."}),
		last: f.NewGauge(prometheus.GaugeOpts{Name: "herald_cache_stream_last_revision",
			Help: "The revision of the stream's last message (sampled every second)."}),
	}
}

// queuedRevisions sums the queue lengths of every following watch stream.
func (s *Shard) queuedRevisions() float64 {
	n := 0
	for _, rs := range s.resourceStates() {
		n += rs.queued()
	}
	return float64(n)
}

// applyMsg applies one stream message's record, inside a "cache.apply" span
// when the record carries a sampled trace context.
func (s *Shard) applyMsg(msg jetstream.Msg, meta *jetstream.MsgMetadata, rec *heraldv1.Record) {
	s.obs.pending.Set(float64(meta.NumPending))
	tp := ""
	if s.tracer != nil && !rec.Progress {
		tp = msg.Headers().Get(service.TraceparentKey)
	}
	if tp == "" {
		s.apply(rec)
		return
	}
	ctx := service.ContextWithTraceparent(context.Background(), tp)
	ctx, span := s.tracer.Start(ctx, "cache.apply", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.Int64("herald.revision", rec.Revision),
			attribute.Int("herald.changes", len(rec.Changes)),
			attribute.Int64("messaging.message.sequence", int64(meta.Sequence.Stream)),
		))
	s.traceparent = service.Traceparent(ctx)
	s.apply(rec)
	s.traceparent = ""
	span.SetAttributes(attribute.Int64("herald.head", s.head.Load()))
	span.End()
}

// pollStreamLag samples the stream's last revision every second until ctx
// ends: the cache's lag behind ingest in revisions.
func (s *Shard) pollStreamLag(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var lastSeq uint64
	var lastRev int64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st, err := s.js.Stream(ctx, s.cfg.Stream)
		if err != nil {
			continue
		}
		info, err := st.Info(ctx)
		if err != nil {
			continue
		}
		if seq := info.State.LastSeq; seq != lastSeq && seq > 0 {
			rec, err := stream.ReadAt(ctx, st, seq)
			if err != nil {
				continue
			}
			lastSeq, lastRev = seq, rec.Revision
		}
		s.obs.last.Set(float64(lastRev))
		s.obs.lag.Set(float64(max(0, lastRev-s.head.Load())))
	}
}
