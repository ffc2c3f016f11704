package fanout

import (
	"container/heap"
	"context"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// pacer writes the watches of session streams (libs/watchsession) from one
// goroutine, paced as Server.serve paces a watch on its own goroutine: a
// watch written less than every ago waits out the rest, then everything
// queued meanwhile goes in one write; a quiet watch is written to at once;
// one whose queue is at half its bound or more is written to when the
// pacer learns of it, without waiting out the interval.
//
// A watch of its own wakes its goroutine once per write (and a busy one
// keeps a timer): on a broadcast, thousands of wake-ups per interval. The
// watches of a session share a pacer (Server.pacerFor), which wakes once
// for all of those due and writes each into the session without waiting
// (watchsession.SegmentWriter.TryWriteSegments). A watch whose stream has no
// room now (its client reads slowly) is handed back to its goroutine,
// which waits for the room and writes the batch: one slow client never
// holds up the others.
type pacer struct {
	clock clock.WithTicker
	every time.Duration

	mu    sync.Mutex
	ready []note // watches with something new queued, in order
	wake  chan struct{}

	// The loop's own.
	spare []note
	due   dueHeap // busy watches, by when they are written next

	// testNoted, when set, is called after the loop has handled n
	// notifications.
	testNoted func(n int)
}

// note is a watch's notification: it has something queued (urgent: half
// its queue's bound).
type note struct {
	e      *paced
	urgent bool
}

func newPacer(clk clock.WithTicker, every time.Duration) *pacer {
	return &pacer{clock: clk, every: every, wake: make(chan struct{}, 1)}
}

// paced is a watch a pacer writes. Its stream is written under mu: by the
// pacer, which only tries mu and never waits on the client, or by the
// watch's goroutine (Server.servePaced), which may.
type paced struct {
	p  *pacer
	st *stream
	wt *watcher

	mu        sync.Mutex
	lastWrite time.Time
	batch     []queued
	// handed: the pacer could not write a batch now (or the write
	// failed); the goroutine writes it (back is signalled), and the pacer
	// leaves the stream alone until then. gone: the watch's handler has
	// returned (or is returning): nobody writes the stream.
	handed, gone bool
	back         chan struct{} // (cap 1)

	// The pacer's loop's own: when the watch is written next, and its
	// index in the pacer's due (-1: not there).
	at  time.Time
	idx int
}

// add returns a watch p writes; wt's events notify p. Call it before wt
// joins a hub, and leave when the watch ends.
func (p *pacer) add(st *stream, wt *watcher) *paced {
	e := &paced{p: p, st: st, wt: wt, back: make(chan struct{}, 1), idx: -1}
	wt.notify = e.notify
	return e
}

// notify tells the pacer that e has something queued. The hub calls it as
// it dispatches: it never waits on the loop.
func (e *paced) notify(urgent bool) {
	p := e.p
	p.mu.Lock()
	p.ready = append(p.ready, note{e, urgent})
	p.mu.Unlock()
	signal(p.wake)
}

// own runs f, which writes the stream and returns how many events it
// wrote, as the watch's goroutine: a batch the pacer handed back is part of
// what f writes. Then the pacer is told of what was queued meanwhile (it
// may have found the stream busy and let it be). It returns the stream's
// error: a write failed, and the watch ends.
func (e *paced) own(now func() time.Time, f func() int) error {
	if err := e.owned(now, f); err != nil {
		return err
	}
	e.renotify()
	return nil
}

func (e *paced) owned(now func() time.Time, f func() int) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	handed := e.handed
	e.handed, e.st.blocked = false, false
	// From the write's start, as serve paces: a write that took the
	// interval (a slow client) is not paced again.
	start := now()
	if f() > 0 || handed {
		e.lastWrite = start
	}
	return e.st.err
}

// renotify tells the pacer of what e has queued, if anything: it may have
// found the stream being written by the watch's goroutine and let it be.
func (e *paced) renotify() {
	if n, half := e.wt.level(); n > 0 {
		e.notify(half)
	}
}

// leave ends the pacer's writes to the stream (waiting for one in
// progress, which does not wait on the client).
func (e *paced) leave() {
	e.mu.Lock()
	e.gone = true
	e.mu.Unlock()
}

// run writes the watches as they come due until ctx ends.
func (p *pacer) run(ctx context.Context) {
	t := p.clock.NewTimer(time.Hour)
	defer t.Stop()
	t.Stop()
	var armedAt time.Time // when t fires; zero: t is not armed
	for ctx.Err() == nil {
		var due <-chan time.Time
		overdue := false
		switch {
		case len(p.due) > 0:
			at := p.due[0].at
			wait := at.Sub(p.clock.Now())
			if overdue = wait <= 0; !overdue && !at.Equal(armedAt) {
				stopTimer(t)
				t.Reset(wait)
				armedAt = at
			}
			due = t.C()
		case !armedAt.IsZero():
			stopTimer(t)
			armedAt = time.Time{}
		}
		if !overdue { // due already: no timer (a fake clock's would wait for a step)
			select {
			case <-ctx.Done():
				return
			case <-p.wake:
			case <-due:
				armedAt = time.Time{}
			}
		}
		now := p.clock.Now()
		p.mu.Lock()
		notes := p.ready
		p.ready = p.spare[:0]
		p.mu.Unlock()
		for _, n := range notes {
			p.write(n.e, now, n.urgent, false)
		}
		if p.testNoted != nil {
			p.testNoted(len(notes))
		}
		clear(notes)
		p.spare = notes
		for len(p.due) > 0 && !p.due[0].at.After(now) {
			p.write(heap.Pop(&p.due).(*paced), now, false, true)
		}
	}
}

// stopTimer stops t and drops a time it sent and nobody received (a fake
// clock's timer keeps it).
func stopTimer(t clock.Timer) {
	t.Stop()
	select {
	case <-t.C():
	default:
	}
}

// write writes what e has queued, or schedules it. A watch written less
// than every ago waits out the rest (what comes meanwhile gathers in its
// queue) unless urgent (its queue is at half its bound); one already
// scheduled is written when it is due, and is then busy: it is scheduled
// again right away, keeping its cadence (and its next interval's first
// event finds it scheduled).
func (p *pacer) write(e *paced, now time.Time, urgent, due bool) {
	scheduled := e.idx >= 0
	if !urgent && !due {
		// The notice of the crossing may have been dropped (the
		// goroutine was writing): the level says.
		_, urgent = e.wt.level()
	}
	if scheduled && !urgent {
		return // written when due
	}
	if scheduled {
		heap.Remove(&p.due, e.idx) // written now, or by the goroutine
	}
	if !e.mu.TryLock() {
		// The goroutine is writing the stream; it tells the pacer of
		// what is queued when it is done.
		return
	}
	defer e.mu.Unlock()
	if e.gone || e.handed {
		return
	}
	busy := due || scheduled
	// Without an interval nothing waits: the watch's goroutine may have
	// written it after now was read, and a zero interval would then
	// leave a wait, and a watch due at once written again and again in
	// one pass while events come, holding up the others.
	if wait := p.every - now.Sub(e.lastWrite); p.every > 0 && !busy && !urgent && wait > 0 {
		p.schedule(e, now.Add(wait))
		return
	}
	st := e.st
	st.try = true
	n := st.drain(e.wt, &e.batch, 1)
	if n > 0 {
		st.flush()
	}
	st.try = false
	if st.blocked || st.err != nil {
		e.handed = true
		signal(e.back)
		return
	}
	if n > 0 {
		e.lastWrite = now
		if busy {
			p.schedule(e, now.Add(p.every))
		}
	}
}

func (p *pacer) schedule(e *paced, at time.Time) {
	e.at = at
	heap.Push(&p.due, e)
}

// dueHeap orders scheduled watches by when they are due (container/heap).
type dueHeap []*paced

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h dueHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}

func (h *dueHeap) Push(x any) {
	e := x.(*paced)
	e.idx = len(*h)
	*h = append(*h, e)
}

func (h *dueHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.idx = -1
	return e
}
