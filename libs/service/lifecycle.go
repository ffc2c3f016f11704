package service

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// State is where a Service is in its lifecycle.
type State int

const (
	// New: built, not started.
	New State = iota
	// Starting: the starting function runs (connect, load, catch up).
	Starting
	// Running: started; the running function runs. The only ready state.
	Running
	// Stopping: the running function has returned; the stopping function
	// runs.
	Stopping
	// Terminated: stopped, without failure.
	Terminated
	// Failed: starting or running failed (Service.Failure says why).
	Failed
)

func (s State) String() string {
	switch s {
	case New:
		return "New"
	case Starting:
		return "Starting"
	case Running:
		return "Running"
	case Stopping:
		return "Stopping"
	case Terminated:
		return "Terminated"
	case Failed:
		return "Failed"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// StartingFunc does a component's start-up work. ctx ends when the service
// is asked to stop; a starting function that fails cleans up after itself
// (the stopping function is not called).
type StartingFunc func(ctx context.Context) error

// RunningFunc serves until ctx ends (return nil) or serving fails.
type RunningFunc func(ctx context.Context) error

// StoppingFunc releases what starting acquired; failure is the running
// function's error (nil on a requested stop).
type StoppingFunc func(failure error) error

// Service is one component's lifecycle, after dskit's services.Service:
//
//	New -> Starting -> Running -> Stopping -> Terminated
//	          |            |          |
//	          +------------+----------+-> Failed
//
// Invariants: states only move forward, in that order; each function runs
// at most once, on one goroutine; the stopping function runs whenever the
// running one ran. Only StopAsync stops a service: it cancels the context
// of the function in progress, and after it an error that only reports the
// cancellation (wraps context.Canceled) is no failure, so a stop while
// starting ends in Terminated, not Failed (a process told to stop while it
// loads has not failed). Ending StartAsync's context instead is a failure
// of whatever function it interrupts.
type Service struct {
	name     string
	starting StartingFunc
	running  RunningFunc
	stopping StoppingFunc

	mu         sync.Mutex
	state      State
	failure    error
	stopAsked  bool
	cancel     context.CancelFunc
	leftStart  chan struct{} // closed when Starting ends (Running, Failed or Terminated)
	terminated chan struct{} // closed in Terminated or Failed
}

// NewService builds a lifecycle; any function may be nil (nothing to do;
// a nil running function waits for the stop).
func NewService(name string, starting StartingFunc, running RunningFunc, stopping StoppingFunc) *Service {
	return &Service{name: name, starting: starting, running: running, stopping: stopping,
		leftStart: make(chan struct{}), terminated: make(chan struct{})}
}

// Name is the component's name.
func (s *Service) Name() string { return s.name }

// State is the current state.
func (s *Service) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// Failure is why the service failed; nil unless Failed.
func (s *Service) Failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failure
}

// Ready is the lifecycle's readiness check: nil only while Running.
func (s *Service) Ready() error {
	if st := s.State(); st != Running {
		return fmt.Errorf("%s is %s", s.name, st)
	}
	return nil
}

// StartAsync starts the service in the background; the functions' context
// derives from ctx (see Service on ending it). It fails unless the service
// is New.
func (s *Service) StartAsync(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != New {
		return fmt.Errorf("%s: start in state %s", s.name, s.state)
	}
	ctx, s.cancel = context.WithCancel(ctx)
	s.state = Starting
	go s.main(ctx)
	return nil
}

// StopAsync asks the service to stop: a New one terminates at once, a
// Starting or Running one sees its context end. It never blocks.
func (s *Service) StopAsync() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopAsked = true
	switch s.state {
	case New:
		s.state = Terminated
		close(s.leftStart)
		close(s.terminated)
	case Starting, Running:
		s.cancel()
	}
}

// AwaitRunning waits until the service is Running (nil), has stopped or
// failed without getting there, or ctx ends.
func (s *Service) AwaitRunning(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-s.leftStart:
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch s.state {
	case Running:
		return nil
	case Failed:
		return fmt.Errorf("%s failed: %w", s.name, s.failure)
	}
	return fmt.Errorf("%s is %s, not Running", s.name, s.state)
}

// AwaitTerminated waits until the service is Terminated (nil) or Failed
// (its failure), or ctx ends.
func (s *Service) AwaitTerminated(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-s.terminated:
	}
	return s.Failure()
}

func (s *Service) main(ctx context.Context) {
	defer s.cancel()
	if s.starting != nil {
		if err := s.starting(ctx); err != nil {
			s.finish(s.failureOf(err), true)
			return
		}
	}
	s.mu.Lock()
	if s.stopAsked {
		// Asked to stop while starting, and starting ignored it: stop
		// without serving.
		s.mu.Unlock()
		s.stop(nil, true)
		return
	}
	s.state = Running
	close(s.leftStart)
	s.mu.Unlock()

	var err error
	if s.running != nil {
		err = s.running(ctx)
	} else {
		<-ctx.Done()
	}
	s.stop(s.failureOf(err), false)
}

// stop runs the stopping function and ends the lifecycle.
func (s *Service) stop(failure error, fromStart bool) {
	s.mu.Lock()
	s.state = Stopping
	if fromStart {
		close(s.leftStart)
	}
	s.mu.Unlock()
	if s.stopping != nil {
		if err := s.stopping(failure); err != nil && failure == nil {
			failure = fmt.Errorf("stopping: %w", err)
		}
	}
	s.finish(failure, false)
}

// failureOf is err unless it only reports a requested stop.
func (s *Service) failureOf(err error) error {
	if err == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopAsked && errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// finish moves to Terminated or Failed.
func (s *Service) finish(failure error, fromStart bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if failure != nil {
		s.state, s.failure = Failed, failure
	} else {
		s.state = Terminated
	}
	if fromStart {
		close(s.leftStart)
	}
	close(s.terminated)
}
