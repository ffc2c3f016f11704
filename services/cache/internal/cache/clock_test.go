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
