package ingest

import "k8s.io/utils/clock"

// WithClock runs the replica's own timing on c instead of the wall clock:
// the backoff between leadership terms (and between attempts to create the
// stream), the progress interval and its coalescing, and the time records
// are stamped with. Tests step a fake clock instead of sleeping. The leader
// lease runs on etcd's clock, never on this one.
func WithClock(c clock.WithTicker) Option { return func(i *Ingest) { i.clock = c } }
