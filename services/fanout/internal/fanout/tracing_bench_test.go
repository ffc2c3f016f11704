package fanout

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/utils/clock"

	"herald.dev/libs/kube"
	"herald.dev/libs/kube/request"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/service"
)

// discardExporter drops spans: the benchmark measures the processes' side
// of tracing (sampling, span creation, batching), not a collector.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

// BenchmarkEventTracing is the per-event cost of tracing on the event path:
// ingest's root span (where sampling is decided) plus, for sampled events,
// the downstream span and traceparent handling, here fanout's dispatch to
// 100 watchers (10 of which get the event). "off" is the default (no
// OTEL_* configuration); "default" is tracing on with the default sampler
// (parentbased_traceidratio, service.DefaultSampleRatio); "always" samples
// every event.
func BenchmarkEventTracing(b *testing.B) {
	reg, err := kube.LoadRegistry("", "/registry")
	if err != nil {
		b.Fatal(err)
	}
	res, _ := reg.ByID("pods")
	obj := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web-0","namespace":"default","resourceVersion":"1"},"spec":{"nodeName":"node-1"}}`)
	for _, mode := range []struct {
		name    string
		sampler sdktrace.Sampler
	}{
		{"off", nil},
		{"default", sdktrace.ParentBased(sdktrace.TraceIDRatioBased(service.DefaultSampleRatio))},
		{"always", sdktrace.AlwaysSample()},
	} {
		b.Run(mode.name, func(b *testing.B) {
			var tracer trace.Tracer
			if mode.sampler != nil {
				tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(mode.sampler), sdktrace.WithBatcher(discardExporter{}))
				defer tp.Shutdown(context.Background())
				tracer = tp.Tracer("bench")
			}
			h := newHub(res, nil, ringLimits{events: 1024, bytes: 1 << 30}, slog.New(slog.NewTextHandler(io.Discard, nil)), newMetrics(prometheus.NewRegistry()), clock.RealClock{})
			h.tracer = tracer
			var ws []*watcher
			for i := range 100 {
				ns := "other-" + strconv.Itoa(i)
				if i < 10 {
					ns = "default"
				}
				sel, _ := request.ParseSelector(res, ns, "", "")
				w := newWatcher(sel, 1024, 64<<20)
				h.watchers.add(w)
				ws = append(ws, w)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				ev := &heraldv1.Event{Type: heraldv1.EventType_MODIFIED, Revision: int64(i + 1), Namespace: "default", Name: "web-0", Object: obj}
				var end func()
				if tracer != nil {
					// ingest: one root span per revision, traceparent only
					// when sampled.
					ctx, span := tracer.Start(context.Background(), "ingest.publish")
					ev.Traceparent = service.Traceparent(ctx)
					end = func() { span.End() }
				}
				h.mu.Lock()
				h.dispatchTraced(newItem(ev))
				h.mu.Unlock()
				if end != nil {
					end()
				}
				for _, w := range ws[:10] {
					w.take(nil)
				}
			}
		})
	}
}
