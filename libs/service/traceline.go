package service

import "strings"

// The trace-line protocol of the internal fanout -> frontdoor hop, written
// by fanout and read by frontdoor (and only there): a frontdoor that traces
// sends TraceLinesHeader: 1 on a watch; the fanout stream may then carry,
// before a sampled event's line, one line TraceLinePrefix + <W3C
// traceparent> + "\n" naming its fanout.dispatch span. Frontdoor removes
// every line starting with '#' (a JSON watch line never does) and records
// its own span as a child, so the client's wire format does not change.
// Gzipped streams never carry trace lines.
const (
	TraceLinesHeader = "X-Herald-Trace-Lines"
	TraceLinePrefix  = "#herald:traceparent="
)

// TraceLine is the trace line naming traceparent tp.
func TraceLine(tp string) []byte { return []byte(TraceLinePrefix + tp + "\n") }

// ParseTraceLine returns the traceparent of a trace line (without its
// "\n"); ok is false for any other line.
func ParseTraceLine(line string) (tp string, ok bool) {
	return strings.CutPrefix(line, TraceLinePrefix)
}
