// Package limits bounds what one client, and all of them together, may
// hold of a frontdoor at once: request and watch slots (Limiter), overall
// and per user, refused with 429 rather than queued.
package limits

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Limiter bounds concurrent requests of one kind (non-watch requests, or
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
type Limiter struct {
	max, perUser int
	// InUseGauge, when not nil, counts the slots taken
	// (apiserver_current_inflight_requests of the limiter's kind).
	InUseGauge prometheus.Gauge

	mu    sync.Mutex
	total int
	users map[string]int
}

// New returns a Limiter of max slots, at most perUser of them for one
// user (0: no per-user bound but max).
func New(max, perUser int) *Limiter {
	if perUser <= 0 {
		perUser = max
	}
	return &Limiter{max: max, perUser: min(perUser, max), users: map[string]int{}}
}

// Why a request was refused (metric label).
const (
	Total   = "total"
	PerUser = "per-user"
	Fair    = "fair-share"
)

// Acquire takes a slot for user; when ok, release returns it (once,
// however often it is called).
func (l *Limiter) Acquire(user string) (release func(), refused string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.users[user]
	switch {
	case l.total >= l.max:
		return nil, Total
	case n >= l.perUser:
		return nil, PerUser
	case l.total >= l.max-l.max/4 && n > 0 && n >= max(1, l.max/(len(l.users)+1)):
		return nil, Fair
	}
	l.total++
	l.users[user] = n + 1
	if l.InUseGauge != nil {
		l.InUseGauge.Inc()
	}
	// One small object: an established watch holds its slot for its
	// whole life.
	sl := &slot{l: l, user: user}
	return sl.release, ""
}

// slot is a slot taken of l by user.
type slot struct {
	l        *Limiter
	user     string
	released atomic.Bool
}

func (s *slot) release() {
	if s.released.CompareAndSwap(false, true) {
		s.l.release(s.user)
	}
}

func (l *Limiter) release(user string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.InUseGauge != nil {
		l.InUseGauge.Dec()
	}
	l.total--
	if n := l.users[user] - 1; n > 0 {
		l.users[user] = n
	} else {
		delete(l.users, user)
	}
}

// InUse returns the slots taken.
func (l *Limiter) InUse() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}
