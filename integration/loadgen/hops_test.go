package loadgen

import (
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// span is an exported span of trace id, from start to end µs after base.
func span(id byte, name string, base time.Time, start, end int) *tracepb.Span {
	at := func(us int) uint64 { return uint64(base.Add(time.Duration(us) * time.Microsecond).UnixNano()) }
	return &tracepb.Span{TraceId: []byte{id}, Name: name, StartTimeUnixNano: at(start), EndTimeUnixNano: at(end)}
}

// An event's path is cut at its spans' starts and ends: the hops add up to
// the total, an event missing a hop's span is not counted, nor one ingest
// received before Since, and spans arrive in any order (each process
// exports its own).
func TestHopTracerCutsEachEventsPath(t *testing.T) {
	base := time.Unix(1_800_000_000, 0)
	var h HopTracer
	h.Span("herald-ingest", span(9, "ingest.publish", base, -50, 100)) // before Since: forgotten
	h.Since(base)
	// Event 1: JetStream 400 µs, applying 300, gRPC 200, fanout 250,
	// frontdoor's write 100: 1,250 in all. Frontdoor's span first.
	h.Span("herald-frontdoor", span(1, "frontdoor.deliver", base, 1150, 1250))
	h.Span("herald-ingest", span(1, "ingest.publish", base, 0, 500))
	h.Span("herald-cache", span(1, "cache.apply", base, 400, 700))
	h.Span("herald-fanout", span(1, "fanout.dispatch", base, 900, 950))
	h.Span("herald-frontdoor", span(1, "frontdoor WATCH", base, 0, 5000)) // not a hop
	// Event 2: 2,000 µs later, the same but 3,000 µs in fanout's queue;
	// a second fanout replica's span of it starts later and is not its path.
	h.Span("herald-ingest", span(2, "ingest.publish", base, 2000, 2500))
	h.Span("herald-cache", span(2, "cache.apply", base, 2400, 2700))
	h.Span("herald-fanout", span(2, "fanout.dispatch", base, 2900, 2950))
	h.Span("herald-fanout", span(2, "fanout.dispatch", base, 3900, 3950))
	h.Span("herald-frontdoor", span(2, "frontdoor.deliver", base, 5900, 6000))
	// Event 3: no frontdoor span (yet).
	h.Span("herald-ingest", span(3, "ingest.publish", base, 4000, 4500))
	h.Span("herald-cache", span(3, "cache.apply", base, 4400, 4700))
	h.Span("herald-fanout", span(3, "fanout.dispatch", base, 4900, 4950))
	// Event 9's other spans, after Since: its ingest span went with it.
	h.Span("herald-cache", span(9, "cache.apply", base, 10, 20))
	h.Span("herald-fanout", span(9, "fanout.dispatch", base, 30, 40))
	h.Span("herald-frontdoor", span(9, "frontdoor.deliver", base, 50, 60))
	// Event 8's spans all arrive after Since, but ingest received it
	// before (a warm-up write's, exported late).
	h.Span("herald-ingest", span(8, "ingest.publish", base, -30, 10))
	h.Span("herald-cache", span(8, "cache.apply", base, 5, 20))
	h.Span("herald-fanout", span(8, "fanout.dispatch", base, 30, 40))
	h.Span("herald-frontdoor", span(8, "frontdoor.deliver", base, 50, 60))

	l := h.Latencies()
	if l == nil || l.Events != 2 {
		t.Fatalf("Latencies = %+v, want 2 events", l)
	}
	us := func(n int) time.Duration { return time.Duration(n) * time.Microsecond }
	want := []struct {
		name      string
		mean, max time.Duration
	}{
		{"ingest to the cache (JetStream)", us(400), us(400)},
		{"cache applying", us(300), us(300)},
		{"cache to fanout (gRPC)", us(200), us(200)},
		{"fanout to frontdoor (queue, write)", us((250 + 3000) / 2), us(3000)},
		{"frontdoor writing to the client", us(100), us(100)},
	}
	if len(l.Hops) != len(want) {
		t.Fatalf("%d hops, want %d", len(l.Hops), len(want))
	}
	for i, w := range want {
		if got := l.Hops[i]; got.Name != w.name || got.Mean != w.mean || got.Max != w.max {
			t.Errorf("hop %d = %+v, want %s with mean %v and max %v", i, got, w.name, w.mean, w.max)
		}
	}
	if l.Total.Max != us(4000) || l.Total.Mean != us((1250+4000)/2) {
		t.Errorf("total = %+v, want max 4ms, mean 2.625ms", l.Total)
	}
	// The slowest 1% is one event, the second, whose longest hop is
	// fanout's.
	if l.Slowest != 1 || l.Total.SlowMean != us(4000) || l.Hops[3].Longest != 1 || l.Hops[3].SlowMean != us(3000) {
		t.Errorf("slowest = %d, total %+v, fanout hop %+v; want event 2, longest in fanout", l.Slowest, l.Total, l.Hops[3])
	}
	for i, x := range l.Hops {
		if i != 3 && x.Longest != 0 {
			t.Errorf("hop %s longest in %d slow events, want 0", x.Name, x.Longest)
		}
	}

	h.Since(base.Add(time.Hour))
	if l := h.Latencies(); l != nil {
		t.Errorf("after Since, Latencies = %+v, want nil", l)
	}
}
