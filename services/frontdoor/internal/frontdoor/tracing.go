package frontdoor

import (
	"context"
	"io"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"herald.dev/libs/kube/request"
	"herald.dev/libs/service"
)

// Option configures a Server beyond its Config.
type Option func(*Server)

// WithTracer makes frontdoor continue the trace of every sampled event it
// proxies: it asks fanout for the events' trace contexts (the stream
// request's trace_events; they come as the session's trace frames, no
// bytes of the stream), and records one short "frontdoor.deliver" span per
// traced event, child of fanout's fanout.dispatch span and linked to the
// WATCH request's span. nil: no tracing, and no trace contexts requested.
func WithTracer(t trace.Tracer) Option { return func(s *Server) { s.tracer = t } }

// traceResponse records the deliveries of the traced events of a watch's
// stream (see WithTracer).
func (p *fanoutPool) traceResponse(ctx context.Context, resp *http.Response) {
	hooked, ok := resp.Body.(interface {
		SetTraceHook(func(traceparent string))
	})
	if p.tracer == nil || resp.StatusCode != http.StatusOK || !ok {
		return
	}
	d := &deliverySpans{ReadCloser: resp.Body, tracer: p.tracer, link: trace.LinkFromContext(ctx)}
	hooked.SetTraceHook(d.start)
	resp.Body = d
}

// deliverySpans records a frontdoor.deliver span for each traced event of
// a stream: from the read that reaches the event's bytes (the stream calls
// start) to the proxy's next read, that is, until the event has been
// written and flushed to the client (every read is written at once).
type deliverySpans struct {
	io.ReadCloser
	tracer trace.Tracer
	link   trace.Link
	open   []trace.Span // delivery spans to end at the next read
}

func (d *deliverySpans) Read(p []byte) (int, error) {
	d.end()
	return d.ReadCloser.Read(p)
}

func (d *deliverySpans) Close() error {
	d.end()
	return d.ReadCloser.Close()
}

func (d *deliverySpans) end() {
	for i, sp := range d.open {
		sp.End()
		d.open[i] = nil
	}
	d.open = d.open[:0]
}

// start starts the delivery span of the event whose trace context is tp.
func (d *deliverySpans) start(tp string) {
	ctx := service.ContextWithTraceparent(context.Background(), tp)
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	opts := []trace.SpanStartOption{trace.WithAttributes(attribute.String("herald.hop", "frontdoor"))}
	if d.link.SpanContext.IsValid() {
		opts = append(opts, trace.WithLinks(d.link))
	}
	_, sp := d.tracer.Start(ctx, "frontdoor.deliver", opts...)
	d.open = append(d.open, sp)
}

// RequestSpanName names frontdoor's request spans by Kubernetes verb (for
// the otelhttp handler that wraps the server in main).
func RequestSpanName(_ string, r *http.Request) string {
	if request.WatchParam(r.URL.Query()) {
		return "frontdoor WATCH"
	}
	if r.Method == http.MethodGet {
		return "frontdoor LIST/GET"
	}
	return "frontdoor " + r.Method
}
