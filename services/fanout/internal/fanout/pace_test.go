package fanout

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clocktesting "k8s.io/utils/clock/testing"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// writeRecorder is a ResponseWriter that hands over every Write. While
// slow is set, each Write first moves clk on by slow (a client slow to
// read).
type writeRecorder struct {
	h      http.Header
	writes chan []byte
	clk    *clocktesting.FakeClock
	slow   atomic.Int64 // a time.Duration
}

func (w *writeRecorder) Header() http.Header { return w.h }
func (w *writeRecorder) WriteHeader(int)     {}
func (w *writeRecorder) Flush()              {}
func (w *writeRecorder) Write(b []byte) (int, error) {
	if d := time.Duration(w.slow.Load()); d > 0 {
		w.clk.Step(d)
	}
	w.writes <- bytes.Clone(b)
	return len(b), nil
}

// pacedWatch is one watch's writer (Server.serve) paced at every, on a
// fake clock, and what it writes.
type pacedWatch struct {
	t   *testing.T
	clk *clocktesting.FakeClock
	w   *writeRecorder
	wt  *watcher
}

func newPacedWatch(t *testing.T, every time.Duration) *pacedWatch {
	reg, err := kube.NewRegistry(kube.DefaultPrefix, kube.DefaultResources())
	if err != nil {
		t.Fatal(err)
	}
	res, ok := reg.ByID("pods")
	if !ok {
		t.Fatal("no pods resource")
	}
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	m := newMetrics(prometheus.NewRegistry())
	s := &Server{cfg: Config{BookmarkInterval: time.Hour, WriteCoalesce: every}, clock: clk, m: m}
	h := newHub(res, nil, ringLimits{}, slog.New(slog.DiscardHandler), m, clk)
	w := &writeRecorder{h: http.Header{}, writes: make(chan []byte, 16), clk: clk}
	st := &stream{w: w, rc: http.NewResponseController(w), res: res, f: jsonLines, enc: &encoder{res: res}, m: m, clock: clk, batches: &sync.Pool{}}
	wt := newWatcher(kube.Everything(""), 100, 1<<20)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.serve(ctx, st, h, wt, 0, false)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return &pacedWatch{t: t, clk: clk, w: w, wt: wt}
}

func (p *pacedWatch) enqueue(revs ...int64) {
	p.t.Helper()
	for _, rev := range revs {
		obj := fmt.Sprintf(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"ns","resourceVersion":"%d"}}`, rev)
		if !p.wt.enqueue(newItem(&heraldv1.Event{Type: heraldv1.EventType_MODIFIED, Revision: rev, Object: []byte(obj)}), kube.AsModified) {
			p.t.Fatal("watcher closed")
		}
	}
}

// expect takes the next write, which must hold revs, in order.
func (p *pacedWatch) expect(revs ...int64) {
	p.t.Helper()
	var b []byte
	select {
	case b = <-p.w.writes:
	case <-time.After(10 * time.Second):
		p.t.Fatalf("no write of revisions %v", revs)
	}
	var want []byte
	for _, rev := range revs {
		want = append(want, fmt.Sprintf(`{"type":"MODIFIED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"ns","resourceVersion":"%d"}}}`+"\n", rev)...)
	}
	if !bytes.Equal(b, want) {
		p.t.Fatalf("wrote\n%s\nwant\n%s", b, want)
	}
}

// none fails if something was written by now.
func (p *pacedWatch) none() {
	p.t.Helper()
	select {
	case b := <-p.w.writes:
		p.t.Fatalf("written within the interval: %s", b)
	default:
	}
}

// parked waits until the writer waits on the pacing timer.
func (p *pacedWatch) parked() {
	p.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !p.clk.HasWaiters(); runtime.Gosched() {
		if time.Now().After(deadline) {
			p.t.Fatal("a busy watch did not wait to gather events")
		}
	}
}

// TestBusyWatchGathersEvents: a watch woken within watch.write-coalesce of
// its last write waits out the rest of it and writes everything queued
// meanwhile in one write, in order, and keeps that cadence while events
// come; after a quiet spell the next event is written at once; a queue that
// reaches half its bound is written at once.
func TestBusyWatchGathersEvents(t *testing.T) {
	const every = 20 * time.Millisecond
	p := newPacedWatch(t, every)
	clk, enqueue, expect, parked := p.clk, p.enqueue, p.expect, p.parked

	enqueue(1)
	expect(1) // a quiet watch: at once
	enqueue(2, 3, 4, 5)
	parked()
	p.none()
	clk.Step(every)
	expect(2, 3, 4, 5) // one write, in order

	// Still busy: it waits out the next interval at once, and gathers
	// what comes meanwhile.
	parked()
	enqueue(6, 7)
	p.none()
	clk.Step(every)
	expect(6, 7)

	parked()        // the next interval, armed after the write
	clk.Step(every) // quiet for the interval: at once again
	enqueue(8)
	expect(8)

	// Busy, but the queue reaches half its bound (50 of 100 events) while
	// the writer waits: written then, without waiting out the interval.
	var burst []int64
	for rev := int64(9); rev < 9+50; rev++ {
		burst = append(burst, rev)
	}
	enqueue(burst[0])
	parked()
	enqueue(burst[1:]...)
	expect(burst...)
}

// TestSlowWriteIsNotPacedAgain: a busy watch whose write took longer than
// the interval (its client reads slowly) does not wait another interval:
// the next event is written at once.
func TestSlowWriteIsNotPacedAgain(t *testing.T) {
	const every = 20 * time.Millisecond
	p := newPacedWatch(t, every)
	p.enqueue(1)
	p.expect(1)
	p.enqueue(2)
	p.parked() // busy
	p.w.slow.Store(int64(2 * every))
	p.clk.Step(every)
	p.expect(2) // took two intervals
	p.w.slow.Store(0)
	p.enqueue(3)
	p.expect(3)
}
