package frontdoor

import (
	"bytes"
	"context"
	"io"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"herald.dev/libs/kube"
	"herald.dev/libs/service"
	"herald.dev/libs/storage"
)

// Option configures a Server beyond its Config.
type Option func(*Server)

// WithTracer makes frontdoor continue the trace of every sampled event it
// proxies: it asks fanout for trace lines on the internal hop (the stream
// request's trace_events), removes them from the stream, and records one
// short "frontdoor.deliver" span per traced event, child of fanout's
// fanout.dispatch span and linked to the WATCH request's span. nil: no
// tracing, and no trace lines requested.
func WithTracer(t trace.Tracer) Option { return func(s *Server) { s.tracer = t } }

// maxTraceLine bounds what is kept of a line starting with '#' (a trace
// line is about 75 bytes; see service.TraceLinePrefix).
const maxTraceLine = 256

// traceResponse strips trace lines from a watch stream that may carry them.
func (p *fanoutPool) traceResponse(ctx context.Context, resp *http.Response) {
	// Only JSON streams carry trace lines: a protobuf one is left alone.
	if p.tracer == nil || resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Encoding") != "" ||
		mediaType(resp.Header) != storage.MediaJSON {
		return
	}
	resp.Body = &traceStripper{rc: resp.Body, tracer: p.tracer, link: trace.LinkFromContext(ctx),
		buf: make([]byte, 32<<10), atStart: true}
}

// traceStripper removes trace lines from a watch stream and records a
// frontdoor.deliver span for each: from reading the line to the proxy's
// next read, that is, until the event after it has been written and
// flushed to the client (the reverse proxy writes every read at once).
type traceStripper struct {
	rc     io.ReadCloser
	tracer trace.Tracer
	link   trace.Link

	buf     []byte
	out     []byte // filtered bytes not yet returned
	err     error
	atStart bool // the next byte starts a line
	inMark  bool // inside a trace line
	mark    []byte
	open    []trace.Span // delivery spans to end at the next read
}

func (s *traceStripper) Read(p []byte) (int, error) {
	if len(s.out) == 0 {
		s.endSpans()
	}
	for len(s.out) == 0 {
		if s.err != nil {
			return 0, s.err
		}
		n, err := s.rc.Read(s.buf)
		s.err = err
		s.out = s.filter(s.buf[:n])
	}
	n := copy(p, s.out)
	s.out = s.out[n:]
	return n, nil
}

func (s *traceStripper) Close() error {
	s.endSpans()
	return s.rc.Close()
}

func (s *traceStripper) endSpans() {
	for i, sp := range s.open {
		sp.End()
		s.open[i] = nil
	}
	s.open = s.open[:0]
}

// filter removes trace lines from b in place and returns what is left.
func (s *traceStripper) filter(b []byte) []byte {
	w := 0
	for i := 0; i < len(b); {
		if s.inMark {
			j := bytes.IndexByte(b[i:], '\n')
			end := len(b)
			if j >= 0 {
				end = i + j
			}
			if room := maxTraceLine - len(s.mark); room > 0 {
				s.mark = append(s.mark, b[i:min(end, i+room)]...)
			}
			if j < 0 {
				break
			}
			i = end + 1
			s.inMark, s.atStart = false, true
			s.startSpan(string(s.mark))
			s.mark = s.mark[:0]
			continue
		}
		if s.atStart && b[i] == '#' {
			s.inMark, s.atStart = true, false
			s.mark = append(s.mark, '#')
			i++
			continue
		}
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			w += copy(b[w:], b[i:])
			s.atStart = false
			break
		}
		w += copy(b[w:], b[i:i+j+1])
		i += j + 1
		s.atStart = true
	}
	return b[:w]
}

func (s *traceStripper) startSpan(line string) {
	tp, ok := service.ParseTraceLine(line)
	if !ok {
		return
	}
	ctx := service.ContextWithTraceparent(context.Background(), tp)
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	opts := []trace.SpanStartOption{trace.WithAttributes(attribute.String("herald.hop", "frontdoor"))}
	if s.link.SpanContext.IsValid() {
		opts = append(opts, trace.WithLinks(s.link))
	}
	_, sp := s.tracer.Start(ctx, "frontdoor.deliver", opts...)
	s.open = append(s.open, sp)
}

// RequestSpanName names frontdoor's request spans by Kubernetes verb (for
// the otelhttp handler that wraps the server in main).
func RequestSpanName(_ string, r *http.Request) string {
	if kube.WatchParam(r.URL.Query()) {
		return "frontdoor WATCH"
	}
	if r.Method == http.MethodGet {
		return "frontdoor LIST/GET"
	}
	return "frontdoor " + r.Method
}
