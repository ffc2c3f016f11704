package e2e

import (
	"encoding/hex"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"herald.dev/integration/stack"
	"herald.dev/integration/tracerecv"
)

// otlpReceiver keeps every span Herald's processes export, with the
// service.name of the process that sent it.
type otlpReceiver struct {
	*tracerecv.Receiver

	mu    sync.Mutex
	spans []recvSpan
}

type recvSpan struct {
	service string
	span    *tracepb.Span
}

func (r *otlpReceiver) snapshot() []recvSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]recvSpan(nil), r.spans...)
}

func startOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	r := &otlpReceiver{}
	rcv, err := tracerecv.Start(func(svc string, sp *tracepb.Span) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.spans = append(r.spans, recvSpan{svc, sp})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rcv.Stop)
	r.Receiver = rcv
	return r
}

func attrInt(sp *tracepb.Span, key string) (int64, bool) {
	for _, a := range sp.Attributes {
		if a.Key == key {
			return a.GetValue().GetIntValue(), true
		}
	}
	return 0, false
}

// TestOneTracePerEvent (issue 8, acceptance 1): with every process
// exporting to an in-process OTLP receiver, one written pod is one trace
// holding ingest's, the cache's, fanout's and frontdoor's spans, each the
// child of the previous hop's; the client's watch stream stays plain
// Kubernetes JSON. A LIST's trace crosses frontdoor and the cache through
// gRPC metadata.
func TestOneTracePerEvent(t *testing.T) {
	rcv := startOTLPReceiver(t)
	for _, kv := range rcv.Env(100) {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	e := startStack(t, stack.Options{})
	ctx := testContext(t, 45*time.Second)

	// A LIST, a watcher through frontdoor from its resourceVersion (as an
	// informer does), then one written pod.
	var list struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	if code := e.get(t, "/api/v1/namespaces/traced/pods", &list); code != http.StatusOK {
		t.Fatalf("list: %d", code)
	}
	status, ch := e.openWatch(t, ctx, "/api/v1/namespaces/traced/pods?watch=true&resourceVersion="+list.Metadata.ResourceVersion)
	if status != http.StatusOK {
		t.Fatalf("watch: %d", status)
	}
	want := e.put(t, ctx, "traced", "web-0", podJSON("traced", "web-0", "node-1", 1), true)
	got := collect(t, ctx, ch, want.RV) // fails on any line that is not a JSON watch event
	if last := lastOf(got); last != want {
		t.Fatalf("watch got %+v, want %+v", last, want)
	}

	hops := []struct{ service, span string }{
		{"herald-ingest", "ingest.publish"},
		{"herald-cache", "cache.apply"},
		{"herald-fanout", "fanout.dispatch"},
		{"herald-frontdoor", "frontdoor.deliver"},
	}
	var chain []recvSpan
	for {
		chain = chain[:0]
		spans := rcv.snapshot()
		// The ingest span of the pod's revision roots the trace.
		for _, s := range spans {
			if rev, ok := attrInt(s.span, "herald.revision"); ok && s.span.Name == hops[0].span && rev == want.RV {
				chain = append(chain, s)
				break
			}
		}
		for i := 1; len(chain) == i && i < len(hops); i++ {
			parent := chain[i-1].span
			for _, s := range spans {
				if s.span.Name == hops[i].span && hex.EncodeToString(s.span.TraceId) == hex.EncodeToString(parent.TraceId) &&
					hex.EncodeToString(s.span.ParentSpanId) == hex.EncodeToString(parent.SpanId) {
					chain = append(chain, s)
					break
				}
			}
		}
		if len(chain) == len(hops) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the pod's trace has %d of %d hops (%d spans received)", len(chain), len(hops), len(spans))
		}
		time.Sleep(50 * time.Millisecond) // polling the receiver, with a deadline
	}
	trace := hex.EncodeToString(chain[0].span.TraceId)
	for i, h := range hops {
		if chain[i].service != h.service {
			t.Errorf("span %s came from %q, want %q", h.span, chain[i].service, h.service)
		}
	}
	if len(chain[0].span.ParentSpanId) != 0 {
		t.Errorf("ingest.publish has a parent: the event's trace must start at ingest")
	}
	if n, _ := attrInt(chain[2].span, "herald.watchers.queued"); n != 1 {
		t.Errorf("fanout.dispatch herald.watchers.queued = %d, want 1 (the one watcher)", n)
	}
	t.Logf("trace %s: %s", trace, func() string {
		s := ""
		for _, c := range chain {
			s += c.service + "/" + c.span.Name + " "
		}
		return s
	}())

	// The LIST's request span in frontdoor and the cache's gRPC server span
	// share one trace (gRPC metadata).
	for {
		var fd, cs int
		traces := map[string]int{}
		for _, s := range rcv.snapshot() {
			id := hex.EncodeToString(s.span.TraceId)
			switch {
			case s.service == "herald-frontdoor" && s.span.Name == "frontdoor LIST/GET":
				traces[id] |= 1
				fd++
			case s.service == "herald-cache" && s.span.Name == "herald.v1.Cache/List":
				traces[id] |= 2
				cs++
			}
		}
		found := false
		for _, v := range traces {
			found = found || v == 3
		}
		if found {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no trace holds both frontdoor's LIST span and the cache's List span (%d frontdoor, %d cache spans)", fd, cs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
