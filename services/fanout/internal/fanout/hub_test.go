package fanout

import (
	"context"
	"io"
	"log/slog"
	"reflect"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	clocktesting "k8s.io/utils/clock/testing"

	"herald.dev/libs/cacheclient"
	"herald.dev/libs/cacheclient/cachetest"
	"herald.dev/libs/kube/request"
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// received waits for n events queued to w and returns their revisions.
func received(t *testing.T, w *watcher, n int) []int64 {
	t.Helper()
	var out []int64
	for len(out) < n {
		select {
		case <-w.wake:
		case <-time.After(10 * time.Second):
			t.Fatalf("watcher has %v, want %d events", out, n)
		}
		for _, q := range w.take(nil) {
			out = append(out, q.it.ev.Revision)
		}
	}
	return out
}

// The hub follows a split resource through the sharded cache client: its
// watchers see the shards' events in revision order, a lagging shard holds
// back what the others sent past it, the ring serves a joining watcher, and
// a shard that cannot resume resets the hub, which starts over after a
// pause of its clock.
func TestHubMergesShardStreams(t *testing.T) {
	sp := cachetest.NewSplit(t)
	pods, _ := sp.Reg.ByID("pods")
	a, b := sp.A, sp.B
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	cache := cacheclient.New(sp.Reg, sp.Shards, sp.Clients(), cacheclient.WithClock(clk))
	h := newHub(pods, cache, ringLimits{events: 100, bytes: 1 << 30}, slog.New(slog.NewTextHandler(io.Discard, nil)), newMetrics(prometheus.NewRegistry()), clk)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go h.run(ctx)

	ev := func(rev int64) *heraldv1.Event { return cachetest.Event(heraldv1.EventType_MODIFIED, rev, "p") }
	wa, wb := <-a.Watches, <-b.Watches
	if !wa.Req.OmitUnchangedPrev || !wb.Req.OmitUnchangedPrev {
		t.Errorf("the shards were asked %+v, %+v; want omit_unchanged_prev (fanout reads prev_unchanged)", wa.Req, wb.Req)
	}
	wa.Send(cachetest.Bookmark(10))
	wb.Send(cachetest.Bookmark(12))
	<-h.synced
	if head := h.head.Load(); head != 12 {
		t.Fatalf("head %d after the start, want the latest shard's 12", head)
	}
	w1 := newWatcher(request.Everything(""), 64, 1<<20)
	if _, _, ok := h.join(w1, 12); !ok {
		t.Fatal("cannot join at the head")
	}

	wa.Send(ev(13), ev(15)) // a runs ahead
	wb.Send(ev(14))         // b lags behind a's 15
	if got := received(t, w1, 2); !reflect.DeepEqual(got, []int64{13, 14}) {
		t.Fatalf("watcher got %v, want [13 14]", got)
	}
	wb.Send(cachetest.Bookmark(20))
	if got := received(t, w1, 1); !reflect.DeepEqual(got, []int64{15}) {
		t.Fatalf("watcher got %v, want [15]", got)
	}
	wa.Send(ev(21), cachetest.Bookmark(22))
	wb.Send(cachetest.Bookmark(22))
	if got := received(t, w1, 1); !reflect.DeepEqual(got, []int64{21}) {
		t.Fatalf("watcher got %v, want [21]", got)
	}

	w2 := newWatcher(request.Everything(""), 64, 1<<20)
	backlog, _, ok := h.join(w2, 13)
	var revs []int64
	for _, it := range backlog {
		revs = append(revs, it.ev.Revision)
	}
	if !ok || !reflect.DeepEqual(revs, []int64{14, 15, 21}) {
		t.Fatalf("joining after 13: %v %v, want the ring's [14 15 21]", revs, ok)
	}

	wb.Fail(status.Error(codes.OutOfRange, "too old resource version"))
	<-w1.done
	if r := w1.closedReason(); r != reasonUpstreamReset {
		t.Fatalf("watcher closed for %q, want %q", r, reasonUpstreamReset)
	}
	for !clk.HasWaiters() {
		runtime.Gosched() // the hub is pausing before it starts over
	}
	clk.Step(200 * time.Millisecond)
	if wa, wb = <-a.Watches, <-b.Watches; wa.Req.AfterRevision != 0 || wb.Req.AfterRevision != 0 {
		t.Fatalf("restarted with %+v, %+v; want from the shards' current revisions", wa.Req, wb.Req)
	}
}

// TestHubClosesWatchersOnALaggingShard: with cache shard b stalled and a
// flooding, the merge's bound ends the upstream stream; the hub closes the
// resource's watchers to resume (reason upstream_lagging, counted) instead
// of holding them, and starts over.
func TestHubClosesWatchersOnALaggingShard(t *testing.T) {
	sp := cachetest.NewSplit(t)
	pods, _ := sp.Reg.ByID("pods")
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	cache := cacheclient.New(sp.Reg, sp.Shards, sp.Clients(), cacheclient.WithClock(clk),
		cacheclient.WithMergeLimits(cacheclient.MergeLimits{Events: 100, Bytes: 1 << 30}))
	m := newMetrics(prometheus.NewRegistry())
	h := newHub(pods, cache, ringLimits{events: 1000, bytes: 1 << 30}, slog.New(slog.DiscardHandler), m, clk)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go h.run(ctx)

	wa, wb := <-sp.A.Watches, <-sp.B.Watches
	wa.Send(cachetest.Bookmark(10))
	wb.Send(cachetest.Bookmark(10))
	<-h.synced
	w := newWatcher(request.Everything(""), 1000, 1<<30)
	if _, _, ok := h.join(w, 10); !ok {
		t.Fatal("cannot join at the head")
	}
	for rev := int64(11); rev <= 150; rev += 10 { // b stalls at 10; a floods
		var evs []*heraldv1.Event
		for r := rev; r < rev+10; r++ {
			evs = append(evs, cachetest.Event(heraldv1.EventType_MODIFIED, r, "p"))
		}
		wa.Send(evs...)
	}
	select {
	case <-w.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the watcher is held, not closed")
	}
	if r := w.closedReason(); r != reasonUpstreamLagging {
		t.Fatalf("watcher closed for %q, want %q", r, reasonUpstreamLagging)
	}
	if n := w.queued(); n != 0 {
		t.Fatalf("watcher was handed %d events past the lagging shard", n)
	}
	if got := testutil.ToFloat64(m.upstreamLagging.WithLabelValues("pods")); got != 1 {
		t.Fatalf("herald_fanout_upstream_lag_resets_total = %v, want 1", got)
	}
	for !clk.HasWaiters() {
		runtime.Gosched() // the hub is pausing before it starts over
	}
	clk.Step(200 * time.Millisecond)
	if wa, wb = <-sp.A.Watches, <-sp.B.Watches; wa.Req.AfterRevision != 0 || wb.Req.AfterRevision != 0 {
		t.Fatalf("restarted with %+v, %+v; want from the shards' current revisions", wa.Req, wb.Req)
	}
}

// TestHubAsksForProtobufOnceAWatcherWritesIt: the upstream asks the cache
// for its protobuf of the objects only once a watcher writes it; it then
// follows on with it from its head, with no gap, no duplicate, and no
// watcher closed.
func TestHubAsksForProtobufOnceAWatcherWritesIt(t *testing.T) {
	sp := cachetest.NewSplit(t)
	pods, _ := sp.Reg.ByID("pods")
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	cache := cacheclient.New(sp.Reg, sp.Shards, sp.Clients(), cacheclient.WithClock(clk))
	h := newHub(pods, cache, ringLimits{events: 100, bytes: 1 << 30}, slog.New(slog.DiscardHandler), newMetrics(prometheus.NewRegistry()), clk)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go h.run(ctx)

	ev := func(rev int64) *heraldv1.Event { return cachetest.Event(heraldv1.EventType_MODIFIED, rev, "p") }
	wa, wb := <-sp.A.Watches, <-sp.B.Watches
	if wa.Req.WithProtobuf || wb.Req.WithProtobuf {
		t.Errorf("no watcher writes protobuf; the shards were asked %+v, %+v", wa.Req, wb.Req)
	}
	wa.Send(cachetest.Bookmark(10))
	wb.Send(cachetest.Bookmark(10))
	<-h.synced
	w := newWatcher(request.Everything(""), 64, 1<<20)
	if _, _, ok := h.join(w, 10); !ok {
		t.Fatal("cannot join at the head")
	}
	h.askProtobuf()
	wa.Send(ev(11))
	wb.Send(cachetest.Bookmark(11))
	if got := received(t, w, 1); !reflect.DeepEqual(got, []int64{11}) {
		t.Fatalf("watcher got %v, want [11]", got)
	}
	wa, wb = <-sp.A.Watches, <-sp.B.Watches
	if !wa.Req.WithProtobuf || !wb.Req.WithProtobuf || wa.Req.AfterRevision != 11 || wb.Req.AfterRevision != 11 || !wa.Req.Follow {
		t.Fatalf("followed on with %+v, %+v; want with_protobuf after 11", wa.Req, wb.Req)
	}
	wa.Send(cachetest.Bookmark(11), ev(12), cachetest.Bookmark(13))
	wb.Send(cachetest.Bookmark(11), ev(13), cachetest.Bookmark(13))
	if got := received(t, w, 2); !reflect.DeepEqual(got, []int64{12, 13}) {
		t.Fatalf("watcher got %v, want [12 13]", got)
	}
	if r := w.closedReason(); r != "" {
		t.Fatalf("watcher closed (%s)", r)
	}
	if h.head.Load() != 13 {
		t.Fatalf("head %d, want 13", h.head.Load())
	}
}
