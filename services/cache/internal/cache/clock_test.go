package cache

import (
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"google.golang.org/grpc/status"
	clocktesting "k8s.io/utils/clock/testing"
)

// A read waiting for a revision the shard has not reached gives up after
// the wait timeout on the shard's clock, and returns as soon as the head
// reaches it.
func TestWaitForRunsOnTheClock(t *testing.T) {
	_, s := testServer(t, newWindow(t, 10), snapRev, 1)
	fc := clocktesting.NewFakeClock(time.Unix(1, 0))
	WithClock(fc)(s)
	s.cfg.WaitTimeout = 3 * time.Second

	wait := func(rev int64) <-chan error {
		done := make(chan error, 1)
		go func() { done <- s.waitFor(t.Context(), rev, "pods") }()
		for !fc.HasWaiters() { // its deadline and its ticker are set
			runtime.Gosched()
		}
		return done
	}

	done := wait(12)
	fc.Step(2999 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("waitFor returned %v before its timeout", err)
	default:
	}
	fc.Step(time.Millisecond)
	err := <-done
	if !errors.Is(err, errTooLarge) {
		t.Fatalf("waitFor = %v, want errTooLarge", err)
	}
	// Worded as kube-apiserver's watch cache words it (frontdoor adds its
	// "Timeout: " prefix with the 504).
	if got, want := status.Convert(errStatus(err)).Message(), fmt.Sprintf("Too large resource version: 12, current: %d", s.head.Load()); got != want {
		t.Fatalf("message %q, want %q", got, want)
	}

	done = wait(12)
	s.setHead(11)
	s.setHead(12)
	if err := <-done; err != nil {
		t.Fatalf("waitFor = %v once the head reached 12", err)
	}
	if err := s.waitFor(t.Context(), 12, "pods"); err != nil {
		t.Fatalf("waitFor a reached revision = %v", err)
	}
}

// A watch resuming after a revision the shard has not reached waits as long
// as the shard keeps applying revisions (a replica catching up after its
// start), up to the catch-up cap; without progress for the wait timeout it
// fails as too large. (Real time: the head advances on a ticker.)
func TestWaitCatchingUp(t *testing.T) {
	_, s := testServer(t, newWindow(t, 10), snapRev, 1)
	// The ticker's 20 ms against a 1 s wait timeout: a loaded machine may
	// delay a tick by hundreds of milliseconds (300 ms was not enough).
	s.cfg.WaitTimeout = time.Second
	s.cfg.CatchUpTimeout = time.Hour
	advance := func(every time.Duration, until int64) (stop func()) {
		done := make(chan struct{})
		stopped := make(chan struct{})
		go func() {
			defer close(stopped)
			tick := time.NewTicker(every)
			defer tick.Stop()
			for rev := s.Head() + 1; rev <= until; rev++ {
				select {
				case <-done:
					return
				case <-tick.C:
					s.setHead(rev)
				}
			}
		}()
		return func() { close(done); <-stopped }
	}

	// Catching up for 4 wait timeouts: the watch waits it out.
	target := s.Head() + 200
	stop := advance(20*time.Millisecond, target)
	start := time.Now()
	err := s.waitCatchingUp(t.Context(), target, "pods")
	stop()
	if err != nil || s.Head() < target {
		t.Fatalf("waitCatchingUp while the shard catches up = %v after %v (head %d, want %d)", err, time.Since(start), s.Head(), target)
	}
	// A read (not a resume) keeps its plain bound.
	stop = advance(50*time.Millisecond, 1<<62)
	if err := s.waitFor(t.Context(), s.Head()+1000, "pods"); !errors.Is(err, errTooLarge) {
		t.Errorf("waitFor while the shard catches up = %v, want errTooLarge after wait-timeout", err)
	}
	// The cap bounds even a shard that keeps going.
	s.cfg.CatchUpTimeout = 2 * time.Second
	start = time.Now()
	err = s.waitCatchingUp(t.Context(), 1<<62, "pods")
	stop()
	if !errors.Is(err, errTooLarge) || time.Since(start) < s.cfg.CatchUpTimeout {
		t.Errorf("waitCatchingUp past the cap = %v after %v, want errTooLarge after %v", err, time.Since(start), s.cfg.CatchUpTimeout)
	}
	// No progress: too large after the wait timeout.
	s.cfg.CatchUpTimeout = time.Hour
	start = time.Now()
	if err := s.waitCatchingUp(t.Context(), s.Head()+1, "pods"); !errors.Is(err, errTooLarge) || time.Since(start) < s.cfg.WaitTimeout {
		t.Errorf("waitCatchingUp without progress = %v after %v, want errTooLarge after the wait timeout", err, time.Since(start))
	}
}
