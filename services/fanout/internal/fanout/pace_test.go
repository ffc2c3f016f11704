package fanout

import (
	"bytes"
	"context"
	"errors"
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
	"herald.dev/libs/kube/request"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/watchsession"
)

// writeRecorder is a ResponseWriter that hands over every Write. While
// slow is set, each Write first moves clk on by slow (a client slow to
// read).
type writeRecorder struct {
	h      http.Header
	writes chan []byte
	done   chan struct{} // closed when the test is over
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
	select {
	case w.writes <- bytes.Clone(b):
		return len(b), nil
	case <-w.done:
		return 0, errors.New("the test is over")
	}
}

// sessionRecorder is a writeRecorder that is a session stream: its
// batches come as segments (each batch one write of their bytes). While
// full is set, it has no room: TryWriteSegments writes nothing, and
// WriteSegments waits until room is signalled.
type sessionRecorder struct {
	*writeRecorder
	full    atomic.Bool
	room    chan struct{}
	waiting chan struct{} // a WriteSegments waits for room
}

func (w *sessionRecorder) Session() uint64 { return 1 }

func (w *sessionRecorder) TryWriteSegments(segs []watchsession.Segment) (bool, error) {
	if w.full.Load() {
		return false, nil
	}
	_, err := w.WriteSegments(segs)
	return true, err
}

func (w *sessionRecorder) WriteSegments(segs []watchsession.Segment) (int, error) {
	if w.full.Load() {
		select {
		case w.waiting <- struct{}{}:
		case <-w.done:
		}
	}
	for w.full.Load() {
		select {
		case <-w.room:
		case <-w.done:
			return 0, errors.New("the test is over")
		}
	}
	var b []byte
	for _, sg := range segs {
		b = append(b, sg.B...)
	}
	return w.Write(b)
}

// pacedWatch is one watch's writer paced at every, on a fake clock, and
// what it writes: Server.serve on the watch's goroutine, or (session) a
// pacer writing a session stream's watch (Server.servePaced).
type pacedWatch struct {
	t     *testing.T
	clk   *clocktesting.FakeClock
	w     *writeRecorder
	sw    *sessionRecorder // session: its stream
	wt    *watcher
	every time.Duration
	// noted (session): the number of notifications of each of the
	// pacer's loops that had any.
	noted chan int
}

// pacing is how a pacedWatch is written.
type pacing int

const (
	ownGoroutine pacing = iota
	sessionPacer
)

func (p pacing) String() string { return [...]string{"own goroutine", "session pacer"}[p] }

func newPacedWatch(t *testing.T, every time.Duration, how ...pacing) *pacedWatch {
	res := podsResource(t)
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	m := newMetrics(prometheus.NewRegistry())
	s := &Server{cfg: Config{BookmarkInterval: time.Hour, WriteCoalesce: every}, clock: clk, m: m}
	h := newHub(res, nil, ringLimits{}, slog.New(slog.DiscardHandler), m, clk)
	pw := &pacedWatch{t: t, clk: clk, every: every}
	var st *stream
	pw.w, pw.sw, st = recordedStream(clk, m, res, len(how) > 0 && how[0] == sessionPacer)
	w := pw.w
	pw.wt = newWatcher(request.Everything(""), 100, 1<<20)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	if pw.sw != nil {
		pc := newPacer(clk, every)
		pw.noted = make(chan int, 1000)
		pc.testNoted = func(n int) {
			if n > 0 {
				pw.noted <- n
			}
		}
		e := pc.add(st, pw.wt)
		wg.Go(func() { pc.run(ctx) })
		wg.Go(func() {
			defer e.leave()
			s.servePaced(ctx, st, h, e, 0, false)
		})
	} else {
		wg.Go(func() { s.serve(ctx, st, h, pw.wt, 0, false) })
	}
	t.Cleanup(func() { cancel(); close(w.done); wg.Wait() })
	return pw
}

// recordedStream is a JSON watch stream of res whose writes w records; a
// session stream (sw, not nil) if session is set.
func recordedStream(clk *clocktesting.FakeClock, m *metrics, res *kube.Resource, session bool) (w *writeRecorder, sw *sessionRecorder, st *stream) {
	w = &writeRecorder{h: http.Header{}, writes: make(chan []byte, 16), clk: clk, done: make(chan struct{})}
	var rw http.ResponseWriter = w
	if session {
		sw = &sessionRecorder{writeRecorder: w, room: make(chan struct{}, 1), waiting: make(chan struct{}, 1)}
		rw = sw
	}
	st = &stream{w: rw, rc: http.NewResponseController(rw), res: res, f: jsonLines, enc: &encoder{res: res}, m: m, clock: clk, batches: &sync.Pool{}}
	if sw != nil { // a nil *sessionRecorder would make a non-nil st.sw
		st.sw = sw
	}
	return w, sw, st
}

func (p *pacedWatch) enqueue(revs ...int64) {
	p.t.Helper()
	for _, rev := range revs {
		obj := fmt.Sprintf(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"ns","resourceVersion":"%d"}}`, rev)
		if !p.wt.enqueue(newItem(&heraldv1.Event{Type: heraldv1.EventType_MODIFIED, Revision: rev, Object: []byte(obj)}), request.AsModified) {
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
	for _, how := range []pacing{ownGoroutine, sessionPacer} {
		t.Run(how.String(), func(t *testing.T) { testBusyWatchGathersEvents(t, how) })
	}
}

func testBusyWatchGathersEvents(t *testing.T, how pacing) {
	const every = 20 * time.Millisecond
	p := newPacedWatch(t, every, how)
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

// TestZeroIntervalNeverSchedules: with watch.write-coalesce 0, a session's
// pacer writes a notified watch at once and never schedules it, also when
// the watch's goroutine wrote it last, after the pacer read the clock (the
// rest of a zero interval would look positive then, and a watch due at once
// would be written again and again in one pass while events come).
func TestZeroIntervalNeverSchedules(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	w, _, st := recordedStream(clk, newMetrics(prometheus.NewRegistry()), podsResource(t), true)
	defer close(w.done)
	// The pacer's loop does not run: the test calls its write as the loop
	// would, for each notification.
	pc := newPacer(clk, 0)
	p := &pacedWatch{t: t, clk: clk, w: w, wt: newWatcher(request.Everything(""), 100, 1<<20)}
	e := pc.add(st, p.wt)
	now := clk.Now()
	for rev := int64(1); rev <= 3; rev++ {
		e.lastWrite = now.Add(time.Millisecond)
		p.enqueue(rev)
		pc.write(e, now, false, false)
		if len(pc.due) != 0 {
			t.Fatalf("revision %d: the watch was scheduled for %v (now %v)", rev, pc.due[0].at, now)
		}
		p.expect(rev)
	}
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
	p.w.slow.Store(int64(2 * p.every))
	p.clk.Step(every)
	p.expect(2) // took two intervals
	p.w.slow.Store(0)
	p.enqueue(3)
	p.expect(3)
}

// notedOnce waits until the pacer has handled a notification after the
// last it waited for.
func (p *pacedWatch) notedOnce() {
	p.t.Helper()
	p.notedN(1)
}

// notedN waits until the pacer has handled n notifications after the last
// it waited for.
func (p *pacedWatch) notedN(n int) {
	p.t.Helper()
	for n > 0 {
		select {
		case k := <-p.noted:
			n -= k
		case <-time.After(10 * time.Second):
			p.t.Fatal("the pacer was not notified")
		}
	}
}

// forgetNoted forgets the notifications the pacer handled so far.
func (p *pacedWatch) forgetNoted() {
	for len(p.noted) > 0 {
		<-p.noted
	}
}

// handBack writes revision 1 (at once: the watch is quiet), then revs
// within the interval with the session stream full: when they are due, the
// pacer finds no room and hands the batch to the watch's goroutine, which
// waits for room (until room). The notifications the pacer handled by
// then are forgotten.
func (p *pacedWatch) handBack(revs ...int64) {
	p.t.Helper()
	p.enqueue(1)
	p.expect(1)
	p.sw.full.Store(true)
	p.enqueue(revs...)
	p.parked()
	p.clk.Step(p.every)
	select {
	case <-p.sw.waiting:
	case <-time.After(10 * time.Second):
		p.t.Fatal("the batch without room was not handed to the watch's goroutine")
	}
	p.forgetNoted()
}

// room ends the session stream's want of room.
func (p *pacedWatch) room() {
	p.sw.full.Store(false)
	p.sw.room <- struct{}{}
}

// TestPacedWatchWithoutRoom: a batch the session stream has no room for is
// written by the watch's goroutine, which waits for the room (the pacer,
// which writes every watch of the session, never waits on one client);
// what is queued meanwhile is written after it, by the pacer again, paced.
func TestPacedWatchWithoutRoom(t *testing.T) {
	p := newPacedWatch(t, 20*time.Millisecond, sessionPacer)
	p.handBack(2, 3)
	p.enqueue(4)
	p.notedOnce() // the pacer found the stream being written, and let it be
	p.none()
	p.room()
	p.expect(2, 3)
	p.parked() // written just now: 4 waits out the interval
	p.none()
	p.clk.Step(p.every)
	p.expect(4)
	p.enqueue(5)
	p.parked()
	p.clk.Step(p.every)
	p.expect(5)
}

// TestPacedWatchSlowHandBack: a handed-back write that took longer than
// the interval (the client made room slowly) is not paced again: the next
// event is written at once, as serve does (TestSlowWriteIsNotPacedAgain).
func TestPacedWatchSlowHandBack(t *testing.T) {
	p := newPacedWatch(t, 20*time.Millisecond, sessionPacer)
	p.handBack(2)
	p.w.slow.Store(int64(2 * p.every))
	p.room()
	p.expect(2) // took two intervals
	p.w.slow.Store(0)
	p.enqueue(3)
	p.expect(3)
}

// TestPacedWatchHalfFullAfterHandBack: a queue that reached half its
// bound while the watch's goroutine was writing (its notice found the
// stream taken) is written as soon as the goroutine is done, without
// waiting out the interval.
func TestPacedWatchHalfFullAfterHandBack(t *testing.T) {
	p := newPacedWatch(t, 20*time.Millisecond, sessionPacer)
	p.handBack(2)
	var burst []int64
	for rev := int64(3); rev < 3+50; rev++ { // half of 100
		burst = append(burst, rev)
	}
	p.enqueue(burst...)
	p.notedN(2) // the first event's and the half's: the stream was taken
	p.room()
	p.expect(2)
	p.expect(burst...)
}
