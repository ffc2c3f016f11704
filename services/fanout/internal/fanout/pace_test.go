package fanout

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clocktesting "k8s.io/utils/clock/testing"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// writeRecorder is a ResponseWriter that hands over every Write.
type writeRecorder struct {
	h      http.Header
	writes chan []byte
}

func (w *writeRecorder) Header() http.Header { return w.h }
func (w *writeRecorder) WriteHeader(int)     {}
func (w *writeRecorder) Flush()              {}
func (w *writeRecorder) Write(b []byte) (int, error) {
	w.writes <- bytes.Clone(b)
	return len(b), nil
}

// TestBusyWatchGathersEvents: a watch woken within watch.write-coalesce of
// its last write waits out the rest of it and writes everything queued
// meanwhile in one write, in order, and keeps that cadence while events
// come; after a quiet spell the next event is written at once; a queue that
// reaches half its bound is written at once.
func TestBusyWatchGathersEvents(t *testing.T) {
	reg, err := kube.NewRegistry(kube.DefaultPrefix, kube.DefaultResources())
	if err != nil {
		t.Fatal(err)
	}
	res, ok := reg.ByID("pods")
	if !ok {
		t.Fatal("no pods resource")
	}
	const every = 20 * time.Millisecond
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	m := newMetrics(prometheus.NewRegistry())
	s := &Server{cfg: Config{BookmarkInterval: time.Hour, WriteCoalesce: every}, clock: clk, m: m}
	h := newHub(res, nil, ringLimits{}, slog.New(slog.DiscardHandler), m, clk)
	w := &writeRecorder{h: http.Header{}, writes: make(chan []byte, 16)}
	st := &stream{w: w, rc: http.NewResponseController(w), res: res, f: jsonLines, enc: &encoder{res: res}, m: m, clock: clk, batches: &sync.Pool{}}
	wt := newWatcher(kube.Everything(""), 100, 1<<20)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.serve(ctx, st, h, wt, 0, false)
	}()
	t.Cleanup(func() { cancel(); <-done })

	enqueue := func(revs ...int64) {
		for _, rev := range revs {
			obj := fmt.Sprintf(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"ns","resourceVersion":"%d"}}`, rev)
			if !wt.enqueue(newItem(&heraldv1.Event{Type: heraldv1.EventType_MODIFIED, Revision: rev, Object: []byte(obj)}), kube.AsModified) {
				t.Fatal("watcher closed")
			}
		}
	}
	expect := func(b []byte, revs ...int64) {
		t.Helper()
		var want []byte
		for _, rev := range revs {
			want = append(want, fmt.Sprintf(`{"type":"MODIFIED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"ns","resourceVersion":"%d"}}}`+"\n", rev)...)
		}
		if !bytes.Equal(b, want) {
			t.Fatalf("wrote\n%s\nwant\n%s", b, want)
		}
	}
	// parked waits until serve waits on the pacing timer.
	parked := func() {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !clk.HasWaiters(); runtime.Gosched() {
			if time.Now().After(deadline) {
				t.Fatal("a busy watch did not wait to gather events")
			}
		}
	}

	enqueue(1)
	expect(<-w.writes, 1) // a quiet watch: at once
	enqueue(2, 3, 4, 5)
	parked()
	select {
	case b := <-w.writes:
		t.Fatalf("written within the interval: %s", b)
	default:
	}
	clk.Step(every)
	expect(<-w.writes, 2, 3, 4, 5) // one write, in order

	// Still busy: it waits out the next interval at once, and gathers
	// what comes meanwhile.
	parked()
	enqueue(6, 7)
	select {
	case b := <-w.writes:
		t.Fatalf("written within the interval: %s", b)
	default:
	}
	clk.Step(every)
	expect(<-w.writes, 6, 7)

	clk.Step(every) // quiet for the interval: at once again
	enqueue(8)
	expect(<-w.writes, 8)

	// Busy, but the queue reaches half its bound (50 of 100 events) while
	// the writer waits: written then, without waiting out the interval.
	var burst []int64
	for rev := int64(9); rev < 9+50; rev++ {
		burst = append(burst, rev)
	}
	enqueue(burst[0])
	parked()
	enqueue(burst[1:]...)
	expect(<-w.writes, burst...)
}
