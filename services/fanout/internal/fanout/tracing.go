package fanout

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"herald.dev/libs/service"
)

// Option configures a Server beyond its Config.
type Option func(*Server)

// WithTracer traces the dispatch of every sampled event: one
// "fanout.dispatch" span per event and hub, child of the cache's span (the
// Event's traceparent), with the number of watchers it was queued to as an
// attribute — never a span per watcher. nil: no tracing.
func WithTracer(t trace.Tracer) Option { return func(s *Server) { s.tracer = t } }

// dispatchTraced dispatches it, inside a span when the event is sampled.
// Called with the hub's mu held.
func (h *hub) dispatchTraced(it *item) {
	if h.tracer == nil || it.ev.Traceparent == "" {
		h.dispatch(it)
		return
	}
	ctx := service.ContextWithTraceparent(context.Background(), it.ev.Traceparent)
	ctx, span := h.tracer.Start(ctx, "fanout.dispatch", trace.WithAttributes(
		attribute.String("herald.resource", h.res.ID()),
		attribute.Int64("herald.revision", it.ev.Revision),
		attribute.String("herald.event_type", it.ev.Type.String()),
	))
	// Set before any watcher can see the item (the queue send orders it).
	it.tp = service.Traceparent(ctx)
	n := h.dispatch(it)
	span.SetAttributes(attribute.Int("herald.watchers.queued", n), attribute.Int("herald.watchers", h.watchers.n))
	span.End()
}

// traceOf returns the trace context to write before it on a stream whose
// frontdoor traces events: only for a sampled event, and only on the first
// such stream that writes it (one frontdoor span per event and fanout
// replica, not one per watcher).
func (st *stream) traceOf(it *item) string {
	if !st.traceEvents || it.tp == "" || !it.traced.CompareAndSwap(false, true) {
		return ""
	}
	return it.tp
}

// replicaCollector reports, at scrape time, each hub's revision (the fanout
// hop's position: compare with the cache's apiserver_watch_cache_resource_version)
// and the events queued to watchers and not yet written.
type replicaCollector struct{ s *Server }

var (
	hubRevisionDesc = prometheus.NewDesc("herald_fanout_hub_revision",
		"The revision up to which the replica has dispatched the resource's events (its hub's head).", []string{"resource"}, nil)
	hubWatchersDesc = prometheus.NewDesc("herald_fanout_hub_watchers",
		"Watchers registered on the resource's hub (joined the shared stream).", []string{"resource"}, nil)
	queueDepthDesc = prometheus.NewDesc("herald_fanout_watch_queue_events",
		"Events queued to watchers and not yet written, summed over the resource's watchers.", []string{"resource"}, nil)
	behindDesc = prometheus.NewDesc("herald_fanout_watchers_behind",
		"The resource's watchers whose queue overflowed: they are written from the resource's ring of recent events until they catch up (closed, reason queue_full, if the ring drops an event they have not been sent).", []string{"resource"}, nil)
)

func (c replicaCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- hubRevisionDesc
	ch <- hubWatchersDesc
	ch <- queueDepthDesc
	ch <- behindDesc
}

func (c replicaCollector) Collect(ch chan<- prometheus.Metric) {
	c.s.mu.Lock()
	hubs := make([]*hub, 0, len(c.s.hubs))
	for _, h := range c.s.hubs {
		hubs = append(hubs, h)
	}
	c.s.mu.Unlock()
	for _, h := range hubs {
		id := h.res.ID()
		h.mu.Lock()
		n, depth, behind := h.watchers.n, 0, len(h.behind)
		h.watchers.every(func(w *watcher) {
			depth += w.queued()
		})
		h.mu.Unlock()
		ch <- prometheus.MustNewConstMetric(hubRevisionDesc, prometheus.GaugeValue, float64(h.head.Load()), id)
		ch <- prometheus.MustNewConstMetric(hubWatchersDesc, prometheus.GaugeValue, float64(n), id)
		ch <- prometheus.MustNewConstMetric(queueDepthDesc, prometheus.GaugeValue, float64(depth), id)
		ch <- prometheus.MustNewConstMetric(behindDesc, prometheus.GaugeValue, float64(behind), id)
	}
}
