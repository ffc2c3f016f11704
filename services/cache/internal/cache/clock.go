package cache

import "k8s.io/utils/clock"

// waitClock is the time a shard's reads wait on (waitFor): its deadline and
// the period of its progress requests.
type waitClock = clock.WithTicker

// WithClock makes the shard's waits run on c instead of the wall clock, so
// that tests drive them without sleeping.
func WithClock(c clock.WithTicker) Option { return func(s *Shard) { s.clock = c } }

// waitClock is the shard's clock: the wall clock unless WithClock gave
// another.
func (s *Shard) waitClock() waitClock {
	if s.clock == nil {
		return clock.RealClock{}
	}
	return s.clock
}
