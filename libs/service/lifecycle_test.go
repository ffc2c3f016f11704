package service

import (
	"context"
	"errors"
	"testing"
	"time"
)

// within bounds the waits of a test: a hang fails the test instead of
// blocking the suite.
func within(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestServiceRunsAndStops(t *testing.T) {
	ctx := within(t)
	var calls []string
	proceed := make(chan struct{})
	s := NewService("x",
		func(context.Context) error { calls = append(calls, "starting"); <-proceed; return nil },
		func(ctx context.Context) error { calls = append(calls, "running"); <-ctx.Done(); return nil },
		func(failure error) error { calls = append(calls, "stopping"); return failure })
	if s.State() != New || s.Ready() == nil {
		t.Fatalf("new service: state %s, ready %v", s.State(), s.Ready())
	}
	if err := s.StartAsync(ctx); err != nil {
		t.Fatal(err)
	}
	if s.State() != Starting || s.Ready() == nil {
		t.Fatalf("starting service: state %s, ready %v", s.State(), s.Ready())
	}
	close(proceed)
	if err := s.AwaitRunning(ctx); err != nil {
		t.Fatal(err)
	}
	if s.State() != Running || s.Ready() != nil {
		t.Fatalf("running service: state %s, ready %v", s.State(), s.Ready())
	}
	if err := s.StartAsync(ctx); err == nil {
		t.Error("second start accepted")
	}
	s.StopAsync()
	if err := s.AwaitTerminated(ctx); err != nil {
		t.Fatal(err)
	}
	if s.State() != Terminated || s.Ready() == nil {
		t.Fatalf("stopped service: state %s, ready %v", s.State(), s.Ready())
	}
	if got := len(calls); got != 3 || calls[0] != "starting" || calls[1] != "running" || calls[2] != "stopping" {
		t.Errorf("calls %v, want starting, running, stopping", calls)
	}
}

func TestServiceFailsInStarting(t *testing.T) {
	ctx := within(t)
	boom := errors.New("boom")
	stopped := false
	s := NewService("x", func(context.Context) error { return boom }, nil, func(error) error { stopped = true; return nil })
	if err := s.StartAsync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.AwaitRunning(ctx); !errors.Is(err, boom) {
		t.Errorf("AwaitRunning: %v, want %v", err, boom)
	}
	if err := s.AwaitTerminated(ctx); !errors.Is(err, boom) {
		t.Errorf("AwaitTerminated: %v, want %v", err, boom)
	}
	if s.State() != Failed || !errors.Is(s.Failure(), boom) {
		t.Errorf("state %s, failure %v", s.State(), s.Failure())
	}
	if stopped {
		t.Error("stopping ran after a failed start")
	}
}

func TestServiceFailsInRunning(t *testing.T) {
	ctx := within(t)
	boom := errors.New("boom")
	var stoppedWith error
	s := NewService("x", nil, func(context.Context) error { return boom }, func(f error) error { stoppedWith = f; return nil })
	if err := s.StartAsync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.AwaitTerminated(ctx); !errors.Is(err, boom) {
		t.Errorf("AwaitTerminated: %v, want %v", err, boom)
	}
	if s.State() != Failed || !errors.Is(stoppedWith, boom) {
		t.Errorf("state %s, stopping saw %v", s.State(), stoppedWith)
	}
}

// A stop while starting ends in Terminated without running. A starting
// function that honours the stop fails (no failure: the stop caused it)
// and releases what it acquired itself; one that ignores it and succeeds
// has its stopping function run.
func TestServiceStopWhileStarting(t *testing.T) {
	for _, tc := range []struct {
		name        string
		honour      bool
		wantStopped bool
	}{
		{"starting honours the stop", true, false},
		{"starting ignores the stop", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := within(t)
			entered, proceed := make(chan struct{}), make(chan struct{})
			ran, stopped := false, false
			s := NewService("x",
				func(ctx context.Context) error {
					close(entered)
					if tc.honour {
						<-ctx.Done()
						return ctx.Err()
					}
					<-proceed
					return nil
				},
				func(context.Context) error { ran = true; return nil },
				func(error) error { stopped = true; return nil })
			if err := s.StartAsync(ctx); err != nil {
				t.Fatal(err)
			}
			<-entered
			s.StopAsync()
			close(proceed)
			if err := s.AwaitTerminated(ctx); err != nil {
				t.Errorf("a stop while starting is no failure: %v", err)
			}
			if s.State() != Terminated || ran || stopped != tc.wantStopped {
				t.Errorf("state %s, running ran %v, stopping ran %v (want %v)", s.State(), ran, stopped, tc.wantStopped)
			}
			if err := s.AwaitRunning(ctx); err == nil {
				t.Error("AwaitRunning of a service stopped while starting: nil")
			}
		})
	}
}

func TestServiceStopBeforeStart(t *testing.T) {
	ctx := within(t)
	s := NewService("x", nil, nil, nil)
	s.StopAsync()
	if s.State() != Terminated {
		t.Fatalf("state %s", s.State())
	}
	if err := s.StartAsync(ctx); err == nil {
		t.Error("start after stop accepted")
	}
	if err := s.AwaitTerminated(ctx); err != nil {
		t.Error(err)
	}
}

// Errors that only report the requested stop are no failure; others are.
func TestServiceStopErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		err     error
		failure bool
	}{
		{"canceled", context.Canceled, false},
		{"wrapped canceled", errors.Join(errors.New("serving"), context.Canceled), false},
		{"other", errors.New("flush failed"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := within(t)
			s := NewService("x", nil, func(ctx context.Context) error { <-ctx.Done(); return tc.err }, nil)
			if err := s.StartAsync(ctx); err != nil {
				t.Fatal(err)
			}
			if err := s.AwaitRunning(ctx); err != nil {
				t.Fatal(err)
			}
			s.StopAsync()
			err := s.AwaitTerminated(ctx)
			if (err != nil) != tc.failure {
				t.Errorf("failure %v, want one: %v", err, tc.failure)
			}
		})
	}
}

func TestServiceStoppingError(t *testing.T) {
	ctx := within(t)
	boom := errors.New("close failed")
	s := NewService("x", nil, nil, func(error) error { return boom })
	if err := s.StartAsync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.AwaitRunning(ctx); err != nil {
		t.Fatal(err)
	}
	s.StopAsync()
	if err := s.AwaitTerminated(ctx); !errors.Is(err, boom) || s.State() != Failed {
		t.Errorf("state %s, failure %v; want Failed with %v", s.State(), err, boom)
	}
}

func TestAwaitRunningHonoursContext(t *testing.T) {
	s := NewService("x", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }, nil, nil)
	if err := s.StartAsync(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.StopAsync()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.AwaitRunning(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("AwaitRunning: %v, want context.Canceled", err)
	}
}
