package cache

import (
	"errors"
	"sync"
)

// Why a window cuts a subscriber off. Both tell the watcher to resume from
// the last revision it received: errTooSlow from the window (or the stream's
// history), errResync only from the stream's history, since the window was
// rebuilt and no longer holds the revisions just before its new start.
var (
	errTooSlow = errors.New("watch stream fell behind the shard")
	errResync  = errors.New("the shard rebuilt its state; resume from the last revision received")
)

// subscriber is one following Watch stream: a bounded queue of whole
// revisions between the window, which fills it from the apply goroutine, and
// the stream's own goroutine, which drains it.
//
// Invariants:
//   - Every queued slice is one revision's events (or one bookmark), queued
//     in increasing revision order: the window queues under its lock, and
//     revisions are applied by one goroutine in order.
//   - Queueing never blocks. A revision that does not fit cuts the
//     subscriber off (errTooSlow) rather than dropping it: a gap would be
//     silent, a cut is seen and resumed from. A bookmark that does not fit
//     is dropped: the next event or bookmark carries the progress.
//   - Once cut, nothing more is queued, and err() says why; what was queued
//     before the cut may still be drained but is not a complete history.
type subscriber struct {
	ch     chan []*event
	cutoff chan struct{} // closed when cut off
	once   sync.Once
	cause  error // set once, before cutoff is closed
	// protobuf: the stream asked with_protobuf (resourceState.wantsProtobuf).
	protobuf bool
}

// newSubscriber returns a subscriber that holds up to buffer revisions.
func newSubscriber(buffer int) *subscriber {
	return &subscriber{ch: make(chan []*event, buffer), cutoff: make(chan struct{})}
}

// events is the queue: one revision's events, or one bookmark, per receive.
func (s *subscriber) events() <-chan []*event { return s.ch }

// done is closed when the subscriber is cut off; err then says why.
func (s *subscriber) done() <-chan struct{} { return s.cutoff }

// err is why the subscriber was cut off (errTooSlow or errResync); nil while
// it is not.
func (s *subscriber) err() error {
	select {
	case <-s.cutoff:
		return s.cause
	default:
		return nil
	}
}

// queued is the number of revisions waiting to be sent.
func (s *subscriber) queued() int { return len(s.ch) }

// send queues one revision's events or cuts the subscriber off; false means
// it is (now or already) cut off.
func (s *subscriber) send(evs []*event) bool {
	select {
	case <-s.cutoff:
		return false
	default:
	}
	select {
	case s.ch <- evs:
		return true
	default:
		s.cut(errTooSlow)
		return false
	}
}

// offer queues events only if there is room (bookmarks).
func (s *subscriber) offer(evs []*event) {
	select {
	case s.ch <- evs:
	default:
	}
}

// cut ends the subscriber with err; only the first cut counts.
func (s *subscriber) cut(err error) {
	s.once.Do(func() {
		s.cause = err
		close(s.cutoff)
	})
}
