package ingest

import (
	"context"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"herald.dev/libs/service"
)

// Option configures an Ingest beyond its Config.
type Option func(*Ingest)

// WithTracer traces every appended revision: one "ingest.publish" span per
// revision (a root span: sampling is decided here, per event), its context
// carried downstream in the message header "traceparent". nil: no tracing.
func WithTracer(t trace.Tracer) Option { return func(i *Ingest) { i.tracer = t } }

// startPublishSpan starts the span of one revision's append; end ends it
// (the first call only), and is a no-op and hdr nil when tracing is off or
// the revision is not sampled.
func (i *Ingest) startPublishSpan(ctx context.Context, subject string, rev int64, changes int) (context.Context, nats.Header, func(error)) {
	if i.tracer == nil {
		return ctx, nil, func(error) {}
	}
	ctx, span := i.tracer.Start(ctx, "ingest.publish", trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			attribute.Int64("herald.revision", rev),
			attribute.Int("herald.changes", changes),
			attribute.String("messaging.system", "nats"),
			attribute.String("messaging.destination.name", subject),
		))
	var hdr nats.Header
	if tp := service.Traceparent(ctx); tp != "" {
		hdr = nats.Header{service.TraceparentKey: []string{tp}}
	}
	ended := false
	return ctx, hdr, func(err error) {
		if ended {
			return
		}
		ended = true
		if err != nil {
			span.RecordError(err)
		}
		span.End()
	}
}
