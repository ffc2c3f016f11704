package frontdoor

import (
	"context"
	"io"
	"net/http"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// hookedBody is a stream's body that calls its trace hook as a session's
// does: within the read that returns the traced event's bytes.
type hookedBody struct {
	reads []hookedRead
	hook  func(string)
}

type hookedRead struct {
	trace string // "": none
	b     string
}

func (b *hookedBody) SetTraceHook(f func(string)) { b.hook = f }

func (b *hookedBody) Read(p []byte) (int, error) {
	if len(b.reads) == 0 {
		return 0, io.EOF
	}
	r := b.reads[0]
	b.reads = b.reads[1:]
	if r.trace != "" && b.hook != nil {
		b.hook(r.trace)
	}
	return copy(p, r.b), nil
}

func (b *hookedBody) Close() error { return nil }

// TestDeliverySpans: each traced event of a stream gets one
// frontdoor.deliver span, child of the event's trace context, started by
// the read that returns the event and ended at the next read (once the
// event was written to the client); the stream's bytes pass unchanged.
func TestDeliverySpans(t *testing.T) {
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	rec := tracetest.NewSpanRecorder()
	p := &fanoutPool{tracer: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)).Tracer("t")}
	body := &hookedBody{reads: []hookedRead{{"", "plain\n"}, {tp, "traced\n"}, {"", "plain\n"}, {"not a traceparent", "x\n"}, {tp, "traced\n"}}}
	resp := &http.Response{StatusCode: http.StatusOK, Body: body}
	p.traceResponse(context.Background(), resp)
	buf := make([]byte, 64)
	var got string
	for i := 0; ; i++ {
		n, err := resp.Body.Read(buf)
		got += string(buf[:n])
		if err != nil {
			break
		}
		if i == 1 && len(rec.Ended()) != 0 {
			t.Fatal("the delivery span ended before the event was written")
		}
		if i == 2 && len(rec.Ended()) != 1 {
			t.Fatalf("after the read following the traced event: %d spans ended, want 1", len(rec.Ended()))
		}
	}
	resp.Body.Close()
	if got != "plain\ntraced\nplain\nx\ntraced\n" {
		t.Fatalf("body %q", got)
	}
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2", len(spans))
	}
	for _, sp := range spans {
		if sp.Name() != "frontdoor.deliver" || sp.Parent().TraceID().String() != "0af7651916cd43dd8448eb211c80319c" || sp.Parent().SpanID().String() != "b7ad6b7169203331" {
			t.Fatalf("span %s parent %v", sp.Name(), sp.Parent())
		}
	}
}
