package frontdoor

import (
	"io"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// chunked returns the stream in reads of n bytes, so that trace lines and
// event lines are split at every possible point.
type chunked struct {
	s string
	n int
}

func (c *chunked) Read(p []byte) (int, error) {
	if c.s == "" {
		return 0, io.EOF
	}
	k := min(c.n, len(p), len(c.s))
	copy(p, c.s[:k])
	c.s = c.s[k:]
	return k, nil
}

func (c *chunked) Close() error { return nil }

func TestTraceStripperRemovesTraceLines(t *testing.T) {
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	ev1 := `{"type":"ADDED","object":{"kind":"Pod","metadata":{"name":"a#b"}}}` + "\n"
	ev2 := `{"type":"MODIFIED","object":{"kind":"Pod"}}` + "\n"
	in := "#herald:traceparent=" + tp + "\n" + ev1 + ev2 + "#herald:traceparent=" + tp + "\n" + "#unknown\n" + ev2
	want := ev1 + ev2 + ev2
	for n := 1; n <= len(in); n++ {
		rec := tracetest.NewSpanRecorder()
		tr := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)).Tracer("t")
		s := &traceStripper{rc: &chunked{in, n}, tracer: tr, buf: make([]byte, 64), atStart: true}
		got, err := io.ReadAll(s)
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		if string(got) != want {
			t.Fatalf("reads of %d: got %q, want %q", n, got, want)
		}
		spans := rec.Ended()
		if len(spans) != 2 {
			t.Fatalf("reads of %d: %d spans, want 2", n, len(spans))
		}
		for _, sp := range spans {
			if sp.Name() != "frontdoor.deliver" || sp.Parent().TraceID().String() != "0af7651916cd43dd8448eb211c80319c" || sp.Parent().SpanID().String() != "b7ad6b7169203331" {
				t.Fatalf("span %s parent %v", sp.Name(), sp.Parent())
			}
		}
	}
}
