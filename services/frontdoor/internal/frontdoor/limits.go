package frontdoor

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// limiter bounds concurrent requests of one kind (non-watch requests, or
// open watches) overall and per user, so that one client cannot starve the
// others:
//
//   - never more than max at once;
//   - never more than perUser for one user (0: no per-user bound);
//   - once the pool is contended (less than a quarter of it free), a user
//     who already holds at least a fair share (max divided by the users
//     holding slots, plus one for a newcomer) is refused, so the free
//     quarter stays available to users who hold little or nothing.
//
// The frontdoor's two pools divide the work as kube-apiserver's priority
// and fairness does: a watch's initialization (authorizing it and waiting
// for a fanout replica to start the stream) holds a slot of the request
// pool, like any read, so that a fleet opening watches at once is paced per
// user; an established watch holds only a slot of the watch pool, which
// bounds memory, has no per-user bound by default (a DaemonSet's thousands
// of pods share one ServiceAccount) and never takes slots from watches
// already established: they are not cut to make room.
//
// A refused request is answered 429 with Retry-After by the caller; nothing
// waits in a queue, so a flood costs the server no memory beyond the
// connections themselves. The per-user map only holds users with slots.
type limiter struct {
	max, perUser int
	// inUseGauge, when not nil, counts the slots taken
	// (apiserver_current_inflight_requests of the limiter's kind).
	inUseGauge prometheus.Gauge

	mu    sync.Mutex
	total int
	users map[string]int
}

func newLimiter(max, perUser int) *limiter {
	if perUser <= 0 {
		perUser = max
	}
	return &limiter{max: max, perUser: min(perUser, max), users: map[string]int{}}
}

// Why a request was refused (metric label).
const (
	limitTotal = "total"
	limitUser  = "per-user"
	limitFair  = "fair-share"
)

// acquire takes a slot for user; when ok, release returns it (once,
// however often it is called).
func (l *limiter) acquire(user string) (release func(), refused string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.users[user]
	switch {
	case l.total >= l.max:
		return nil, limitTotal
	case n >= l.perUser:
		return nil, limitUser
	case l.total >= l.max-l.max/4 && n > 0 && n >= max(1, l.max/(len(l.users)+1)):
		return nil, limitFair
	}
	l.total++
	l.users[user] = n + 1
	if l.inUseGauge != nil {
		l.inUseGauge.Inc()
	}
	// One small object: an established watch holds its slot for its
	// whole life.
	sl := &slot{l: l, user: user}
	return sl.release, ""
}

// slot is a slot taken of l by user.
type slot struct {
	l        *limiter
	user     string
	released atomic.Bool
}

func (s *slot) release() {
	if s.released.CompareAndSwap(false, true) {
		s.l.release(s.user)
	}
}

func (l *limiter) release(user string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inUseGauge != nil {
		l.inUseGauge.Dec()
	}
	l.total--
	if n := l.users[user] - 1; n > 0 {
		l.users[user] = n
	} else {
		delete(l.users, user)
	}
}

// inUse returns the slots taken.
func (l *limiter) inUse() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}
