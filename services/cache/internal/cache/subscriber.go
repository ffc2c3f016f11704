package cache

import (
	"errors"
	"sync"

	heraldv1 "herald.dev/libs/proto/herald/v1"
)

var (
	errTooSlow = errors.New("watch stream fell behind the shard")
	errResync  = errors.New("the shard rebuilt its state; resume from the last revision received")
)

// subscriber is one following Watch stream. The apply goroutine queues
// whole revisions; the stream's own goroutine sends them. A subscriber whose
// queue is full is cut off (the caller resumes from its last revision from
// the window) so that the apply goroutine never blocks.
type subscriber struct {
	ch   chan []*heraldv1.Event
	done chan struct{}
	once sync.Once
	err  error
}

func newSubscriber(buffer int) *subscriber {
	return &subscriber{ch: make(chan []*heraldv1.Event, buffer), done: make(chan struct{})}
}

// send queues events or cuts the subscriber off; false means cut off.
func (s *subscriber) send(evs []*heraldv1.Event) bool {
	select {
	case <-s.done:
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
func (s *subscriber) offer(evs []*heraldv1.Event) {
	select {
	case s.ch <- evs:
	default:
	}
}

func (s *subscriber) cut(err error) {
	s.once.Do(func() {
		s.err = err
		close(s.done)
	})
}
