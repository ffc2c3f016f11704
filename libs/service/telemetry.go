package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
)

// DefaultSampleRatio is the share of root traces (events, requests) sampled
// when tracing is on and OTEL_TRACES_SAMPLER is not set: the sampler is then
// parentbased_traceidratio with this ratio, so that tracing every hop of an
// event costs little on a busy cluster.
const DefaultSampleRatio = 0.01

// Telemetry is a process's tracing set-up: a TracerProvider and the W3C
// trace-context propagator, configured from the standard OTEL_* environment
// variables. Nothing here is global: services receive the provider through
// their constructors.
//
// Tracing is off (a no-op provider, Enabled false) unless
// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set or
// OTEL_TRACES_EXPORTER=otlp; OTEL_TRACES_EXPORTER=none or
// OTEL_SDK_DISABLED=true turn it off whatever else is set. When on, spans
// go over OTLP/gRPC (the exporter reads OTEL_EXPORTER_OTLP_*), batched
// (OTEL_BSP_*), sampled by OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG or
// else parentbased_traceidratio(DefaultSampleRatio).
type Telemetry struct {
	// Enabled: spans are recorded and exported. When false, services skip
	// their per-event tracing entirely.
	Enabled        bool
	TracerProvider trace.TracerProvider
	Propagator     propagation.TextMapPropagator

	shutdown func(context.Context) error
}

// TracingEnabled reports whether the OTEL_* environment (read through
// getenv) asks for trace export.
func TracingEnabled(getenv func(string) string) bool {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	switch strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER"))) {
	case "none":
		return false
	case "otlp":
		return true
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// NoTelemetry is tracing off: a no-op provider (tests, tools).
func NoTelemetry() *Telemetry {
	return &Telemetry{TracerProvider: noop.NewTracerProvider(), Propagator: propagation.TraceContext{},
		shutdown: func(context.Context) error { return nil }}
}

// NewTelemetry sets up tracing for the process named component from the
// environment. Call Shutdown before exiting to flush buffered spans.
func NewTelemetry(ctx context.Context, component string) (*Telemetry, error) {
	if !TracingEnabled(os.Getenv) {
		return NoTelemetry(), nil
	}
	if ex := strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER"))); ex != "" && ex != "otlp" {
		return nil, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: only otlp and none are supported", ex)
	}
	exp, err := otlptracegrpc.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("otlp trace exporter: %w", err)
	}
	// Attributes from OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME override
	// the default service name.
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "herald-"+component)),
		resource.WithFromEnv(),
		resource.WithHost(),
		resource.WithProcessPID(),
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("otel resource: %w", err)
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithBatcher(exp), sdktrace.WithResource(res)}
	if os.Getenv("OTEL_TRACES_SAMPLER") == "" {
		// Otherwise the SDK reads the sampler from the environment itself.
		opts = append(opts, sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(DefaultSampleRatio))))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	return &Telemetry{Enabled: true, TracerProvider: tp, Propagator: propagation.TraceContext{}, shutdown: tp.Shutdown}, nil
}

// Shutdown flushes and stops the exporter.
func (t *Telemetry) Shutdown(ctx context.Context) error { return t.shutdown(ctx) }

// Tracer is the tracer of one instrumented package, or nil when tracing is
// off: callers test for nil and skip all per-event work.
func (t *Telemetry) Tracer(name string) trace.Tracer {
	if t == nil || !t.Enabled {
		return nil
	}
	return t.TracerProvider.Tracer(name)
}

// GRPCServerOptions instrument a gRPC server: one span per call, the
// caller's trace context read from the gRPC metadata. None when off.
func (t *Telemetry) GRPCServerOptions() []grpc.ServerOption {
	if t == nil || !t.Enabled {
		return nil
	}
	return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(t.TracerProvider), otelgrpc.WithPropagators(t.Propagator)))}
}

// GRPCDialOptions instrument a gRPC client: one span per call, the trace
// context written to the gRPC metadata. None when off.
func (t *Telemetry) GRPCDialOptions() []grpc.DialOption {
	if t == nil || !t.Enabled {
		return nil
	}
	return []grpc.DialOption{grpc.WithStatsHandler(otelgrpc.NewClientHandler(
		otelgrpc.WithTracerProvider(t.TracerProvider), otelgrpc.WithPropagators(t.Propagator)))}
}

// TraceparentKey is the W3C header name, used as is in NATS message headers
// and on Herald's internal hops.
const TraceparentKey = "traceparent"

// Traceparent is the W3C traceparent of ctx's span when that span is
// sampled, else "": unsampled events carry nothing downstream.
func Traceparent(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() || !sc.IsSampled() {
		return ""
	}
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	return c[TraceparentKey]
}

// ContextWithTraceparent returns ctx with the remote span context tp as its
// parent; ctx itself when tp is empty or malformed.
func ContextWithTraceparent(ctx context.Context, tp string) context.Context {
	if tp == "" {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{TraceparentKey: tp})
}

// traceHandler adds the trace and span ids of the context's span to every
// record logged with a context (InfoContext, ...), so a log line can be
// found from a trace and the other way round.
type traceHandler struct{ slog.Handler }

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return traceHandler{h.Handler.WithAttrs(as)}
}

func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{h.Handler.WithGroup(name)}
}
