package loadgen

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// hopSpans are the spans one event's trace holds, one per process it
// crosses, in path order (libs/service's tracing: ingest roots the trace,
// each hop's span is the child of the one before).
var hopSpans = [...]string{"ingest.publish", "cache.apply", "fanout.dispatch", "frontdoor.deliver"}

// Hop names, in path order: the time between two points of an event's
// path, each point the start or end of one of hopSpans.
var hopNames = [...]string{
	"ingest to the cache (JetStream)",    // cache.apply start - ingest.publish start
	"cache applying",                     // cache.apply end - start
	"cache to fanout (gRPC)",             // fanout.dispatch start - cache.apply end
	"fanout to frontdoor (queue, write)", // frontdoor.deliver start - fanout.dispatch start
	"frontdoor writing to the client",    // frontdoor.deliver end - start
}

// HopTracer follows events through Herald's processes by the spans they
// export, every event sampled (tracerecv.Receiver's Env). Span is the
// receiver's callback; Since and Latencies bracket the measured writes.
// With more than one fanout or frontdoor replica, an event's earliest span
// of each name is its path.
type HopTracer struct {
	mu     sync.Mutex
	from   int64 // Unix ns: events ingest received earlier are not counted
	events map[string]*hopEvent
}

// hopEvent is one trace's spans: start and end (Unix ns) of each of
// hopSpans, seen (bit i) once hopSpans[i] arrived.
type hopEvent struct {
	start, end [len(hopSpans)]int64
	seen       uint8
}

const allHops = 1<<len(hopSpans) - 1

// Span records sp, exported by the process named service.
func (h *HopTracer) Span(_ string, sp *tracepb.Span) {
	i := slices.Index(hopSpans[:], sp.Name)
	if i < 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.events == nil {
		h.events = map[string]*hopEvent{}
	}
	e := h.events[string(sp.TraceId)]
	if e == nil {
		e = &hopEvent{}
		h.events[string(sp.TraceId)] = e
	}
	s, end := int64(sp.StartTimeUnixNano), int64(sp.EndTimeUnixNano)
	if e.seen&(1<<i) == 0 || s < e.start[i] {
		e.start[i], e.end[i] = s, end
	}
	e.seen |= 1 << i
}

// Since forgets every event so far and counts only those ingest receives
// from t on.
func (h *HopTracer) Since(t time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.from = t.UnixNano()
	h.events = map[string]*hopEvent{}
}

// complete returns the events since Since with every hop's span.
func (h *HopTracer) complete() []hopEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []hopEvent
	for _, e := range h.events {
		if e.seen == allHops && e.start[0] >= h.from {
			out = append(out, *e)
		}
	}
	return out
}

// Wait waits until n events are complete, or until no span has completed
// an event for quiet (the processes export in batches, after the events),
// or until ctx ends.
func (h *HopTracer) Wait(ctx context.Context, n int, quiet time.Duration) {
	last, since := -1, time.Now()
	for ctx.Err() == nil {
		c := len(h.complete())
		if c >= n {
			return
		}
		if c != last {
			last, since = c, time.Now()
		} else if time.Since(since) > quiet {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// HopLatencies is where the events since Since spent their time, from
// ingest's receipt to frontdoor's write to the client.
type HopLatencies struct {
	Events int // events traced through every hop
	// Total is ingest's receipt to the end of frontdoor's write.
	Total HopLatency
	Hops  []HopLatency // in path order
	// Slowest is how many events are the slowest 1% by Total (at least
	// one); each hop's SlowMean is over them, and Longest counts those
	// whose longest hop it was.
	Slowest int
}

// HopLatency is one hop's figures over the traced events.
type HopLatency struct {
	Name               string
	P50, P90, P99, Max time.Duration
	Mean, SlowMean     time.Duration
	Longest            int
}

// Latencies is the events' hops since Since (nil: none traced).
func (h *HopTracer) Latencies() *HopLatencies { return hopLatencies(h.complete()) }

func hopLatencies(evs []hopEvent) *HopLatencies {
	if len(evs) == 0 {
		return nil
	}
	n := len(hopNames)
	hops := make([][]time.Duration, n)
	total := make([]time.Duration, len(evs))
	for j, e := range evs {
		points := [...]int64{e.start[0], e.start[1], e.end[1], e.start[2], e.start[3], e.end[3]}
		for i := range n {
			hops[i] = append(hops[i], time.Duration(points[i+1]-points[i]))
		}
		total[j] = time.Duration(e.end[3] - e.start[0])
	}
	// The slowest 1% by total, as indexes into evs.
	order := make([]int, len(evs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return int(total[b] - total[a]) })
	slow := order[:max(1, len(evs)/100)]
	out := &HopLatencies{Events: len(evs), Total: figures("total", total, slow), Slowest: len(slow)}
	for i := range n {
		out.Hops = append(out.Hops, figures(hopNames[i], hops[i], slow))
	}
	for _, j := range slow {
		longest := 0
		for i := range n {
			if hops[i][j] > hops[longest][j] {
				longest = i
			}
		}
		out.Hops[longest].Longest++
	}
	return out
}

// figures are the quantiles and mean of vs, and the mean of vs[slow...].
func figures(name string, vs []time.Duration, slow []int) HopLatency {
	f := HopLatency{Name: name}
	var sum, slowSum time.Duration
	for _, v := range vs {
		sum += v
	}
	for _, j := range slow {
		slowSum += vs[j]
	}
	f.Mean, f.SlowMean = sum/time.Duration(len(vs)), slowSum/time.Duration(len(slow))
	sorted := slices.Clone(vs)
	slices.Sort(sorted)
	at := func(q float64) time.Duration { return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))] }
	f.P50, f.P90, f.P99, f.Max = at(0.5), at(0.9), at(0.99), sorted[len(sorted)-1]
	return f
}

// String is the report's sentence for h.
func (h *HopLatencies) String() string {
	us := func(d time.Duration) string { return fmt.Sprintf("%.0f", float64(d)/float64(time.Microsecond)) }
	parts := []string{fmt.Sprintf("%s p50 %s, p99 %s", h.Total.Name, us(h.Total.P50), us(h.Total.P99))}
	for _, x := range h.Hops {
		parts = append(parts, fmt.Sprintf("%s p50 %s, p99 %s, slowest 1%% %s, longest in %d", x.Name, us(x.P50), us(x.P99), us(x.SlowMean), x.Longest))
	}
	return fmt.Sprintf("%d events traced through every hop, µs from ingest's receipt: %s (the slowest 1%%: %d events, total %s)",
		h.Events, strings.Join(parts, "; "), h.Slowest, us(h.Total.SlowMean))
}
