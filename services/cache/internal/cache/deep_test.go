package cache

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// TestDeepReplayHoldsItsSlotUntilTheWindow: a deep replay that takes more
// than one round (the window moved on while it ran) keeps its slot from its
// first response to its end. Released between rounds, it would queue for
// this shard again while a client merging shards may hold its slot on the
// next one: with every slot of both shards taken so, nothing moves
// (issue 17's stall of 200 resumes x 50,000 events).
func TestDeepReplayHoldsItsSlotUntilTheWindow(t *testing.T) {
	h := startHistory(t)
	for i := range 150 {
		h.put(t, "a", fmt.Sprintf("p%d", i%10), i)
	}
	s, v, reg := startShard(t, h, 0, "--deep-replay.concurrency=1")

	// A resumes from the start of the history, older than the window (100
	// events): a deep replay. Its first response (the bookmark it resumes
	// after) says it holds the slot; it then waits for the test's go-ahead
	// for each response.
	from := h.revs[0] - 1
	a := &watchStream{ctx: t.Context(), sent: make(chan *heraldv1.WatchResponse, 1000), ack: make(chan struct{})}
	aDone := make(chan error, 1)
	go func() { aDone <- v.Watch(&heraldv1.WatchRequest{Resource: "pods", AfterRevision: from}, a) }()
	first := <-a.sent
	if got := revs(first.Events); !slices.Equal(got, []string{fmt.Sprintf("%d:", from)}) {
		t.Fatalf("first response %v, want the bookmark at %d", got, from)
	}

	// While A is held, 150 more revisions move the window past where A's
	// first round ends: A needs a second round.
	for i := range 150 {
		h.put(t, "a", fmt.Sprintf("p%d", i%10), 150+i)
	}
	last := h.revs[len(h.revs)-1]
	eventually(t, "the shard at the last revision", func() string {
		if s.Head() < last {
			return fmt.Sprintf("at %d, want %d", s.Head(), last)
		}
		return ""
	})

	// B, another deep resume, waits for the only slot.
	b := &watchStream{ctx: t.Context(), sent: make(chan *heraldv1.WatchResponse, 1000)}
	bDone := make(chan error, 1)
	go func() { bDone <- v.Watch(&heraldv1.WatchRequest{Resource: "pods", AfterRevision: from + 1}, b) }()
	eventually(t, "B queued for the slot", func() string {
		if n := gaugeValue(t, reg, "herald_cache_deep_replays_waiting"); n != 1 {
			return fmt.Sprintf("%v waiting", n)
		}
		return ""
	})

	// A is let go: it ends with every revision once and in order, having
	// waited for its slot only once, even though its replay took two
	// rounds; B, queued meanwhile, is the only other one that waited.
	got := revs(first.Events)
	for done := false; !done; {
		select {
		case a.ack <- struct{}{}:
		case r := <-a.sent:
			got = append(got, revs(r.Events)...)
		case err := <-aDone:
			if err != nil {
				t.Fatal(err)
			}
			done = true
		}
	}
	got = append(got, sentRevs(a.sent)...)
	var want []string
	for _, rev := range h.revs {
		want = append(want, strconv.FormatInt(rev, 10))
	}
	if g := eventRevs(got); !slices.Equal(g, want) {
		t.Errorf("A got %d events (%v...), want each of the %d revisions once, in order", len(g), g[:min(len(g), 5)], len(want))
	}
	if n := gaugeValue(t, reg, "herald_cache_deep_replays_queued_total"); n != 1 {
		t.Errorf("%v deep replays waited for a slot, want 1 (B): A gave its slot up between its rounds and queued again", n)
	}

	// Then B runs.
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	if g := eventRevs(sentRevs(b.sent)); len(g) != len(h.revs)-1 {
		t.Errorf("B got %d events, want %d", len(g), len(h.revs)-1)
	}
}

// gaugeValue is the value of the unlabelled metric name in reg.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		m := mf.GetMetric()[0]
		switch {
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Counter != nil:
			return m.Counter.GetValue()
		}
	}
	t.Fatal(errors.New("no metric " + name))
	return 0
}

// sentRevs returns the revisions of what a finished stream sent.
func sentRevs(sent chan *heraldv1.WatchResponse) []string {
	var out []string
	for len(sent) > 0 {
		out = append(out, revs((<-sent).Events)...)
	}
	return out
}
