package cache

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/google/btree"

	"herald.dev/libs/kube"
)

// entry is one current object in a resource's tree, ordered by key.
type entry struct {
	key string
	obj *kube.Object
}

func lessEntry(a, b *entry) bool { return a.key < b.key }

type tree = btree.BTreeG[*entry]

// slot is one revision of a resource in the window: its events and the
// state of the resource right after it (a copy-on-write clone of the tree).
type slot struct {
	rev    int64
	events []*event
	state  *tree
}

// resourceState is the window of one resource, as the Kubernetes cacher's
// watchCache is: its current objects, its most recent revisions with the
// state after each, and the watch streams following it. It owns its lock;
// callers use its methods, which each take the lock once, and never its
// fields (res and parts are set when the shard is built and never change).
//
// Every revision passed to it must be whole (all of this resource's changes
// in it), and revisions come from one goroutine in increasing order. head,
// where a method takes it, is the shard's applied revision read before the
// call: revisions up to it that are not in the window did not change this
// resource, so the state is also the state at head.
//
// Invariants (under mu):
//   - Ordering: applyRevision updates the state, appends the revision to the
//     window and queues it on every subscriber in one hold of the lock, so a
//     reader sees the history up to a whole revision, never part of one, and
//     every subscriber receives revisions in increasing order.
//   - The window holds every revision of this resource in (windowStart,
//     last], oldest first; base is the state at windowStart and each slot's
//     state the state after its revision. It holds at most capacity events,
//     except that the newest revision is kept whole even when it alone holds
//     more. Making room drops the oldest revision, whose revision becomes
//     windowStart.
//   - Too old: the window can serve a revision rev (its state, the events
//     after it) if and only if rev >= windowStart. An older one gets a
//     *tooOldError naming windowStart; the watch server may then replay the
//     stream's history up to windowStart (deep resume) and ask again.
//   - No gap, no duplicate: watchAfter and watchState return the events after
//     the requested revision up to the window's head and register the
//     subscriber in the same hold of the lock; every later revision is queued
//     on the subscriber, none of the earlier ones is.
//   - A subscriber is cut off, and removed, when a revision does not fit its
//     queue (errTooSlow) and when reset replaces the state (errResync, every
//     subscriber: the window cannot give them a consistent history across a
//     rebuild). A bookmark never cuts: it is dropped when it does not fit.
//   - Snapshots handed out are copy-on-write clones: readers never take the
//     lock to read them and never see a later change.
type resourceState struct {
	res      *kube.Resource
	capacity int          // events in the window
	parts    map[int]bool // owned namespace partitions; nil: all

	mu          sync.RWMutex
	state       *tree
	window      []slot // oldest first
	events      int    // sum of len(events) over window
	windowStart int64
	base        *tree
	subs        map[*subscriber]struct{}
	// protobufSubs: how many of subs asked with_protobuf (written under
	// mu, read by the apply goroutine before it decodes a revision).
	protobufSubs atomic.Int32
}

func newResourceState(res *kube.Resource, capacity int) *resourceState {
	return &resourceState{res: res, capacity: capacity, state: btree.NewG(32, lessEntry), subs: map[*subscriber]struct{}{}}
}

// tooOldError says a revision is older than the window's start.
type tooOldError struct {
	rev   int64 // the revision asked for
	start int64 // windowStart: the oldest revision the window can serve
}

// Error is the Kubernetes 410 message; it names, as Herald always has, the
// first revision after the window's start.
func (e *tooOldError) Error() string {
	return fmt.Sprintf("too old resource version: %d (%d)", e.rev, e.start+1)
}

// snapshot is a resource's state at one revision: a clone the window no
// longer changes, read without its lock.
type snapshot struct{ t *tree }

// get returns the object at key, or nil.
func (s snapshot) get(key string) *kube.Object {
	if e, ok := s.t.Get(&entry{key: key}); ok {
		return e.obj
	}
	return nil
}

// scan calls fn for the objects in key order, starting at key from
// (included; "": the first) and restricted to prefix, until fn returns
// false.
func (s snapshot) scan(prefix, from string, fn func(*entry) bool) {
	start := prefix
	if from > prefix {
		start = from
	}
	s.t.AscendGreaterOrEqual(&entry{key: start}, func(e *entry) bool {
		if !strings.HasPrefix(e.key, prefix) {
			return false
		}
		return fn(e)
	})
}

// reset replaces the state with t, a snapshot at rev, and empties the window
// (it starts at rev). Every subscriber is cut off with errResync.
func (r *resourceState) reset(t *tree, rev int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.state = t
	r.base = t.Clone()
	r.window = nil
	r.events = 0
	r.windowStart = rev
	for s := range r.subs {
		s.cut(errResync)
	}
	r.subs = map[*subscriber]struct{}{}
	r.protobufSubs.Store(0)
}

// applyRevision applies one revision's changes of this resource (puts[i] is
// the new object at keys[i], nil for a delete), appends its events to the
// window, dropping the oldest revisions beyond capacity, and queues them on
// every subscriber, cutting off those whose queue is full. It runs on the
// shard's single apply goroutine.
func (r *resourceState) applyRevision(rev int64, evs []*event, puts []*kube.Object, keys []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, k := range keys {
		if puts[i] == nil {
			r.state.Delete(&entry{key: k})
		} else {
			r.state.ReplaceOrInsert(&entry{key: k, obj: puts[i]})
		}
	}
	r.window = append(r.window, slot{rev: rev, events: evs, state: r.state.Clone()})
	r.events += len(evs)
	for r.events > r.capacity && len(r.window) > 1 {
		old := r.window[0]
		r.window[0] = slot{}
		r.window = r.window[1:]
		r.events -= len(old.events)
		r.windowStart = old.rev
		r.base = old.state
	}
	for s := range r.subs {
		if !s.send(evs) {
			r.removeLocked(s)
		}
	}
}

// bookmark tells subscribers the shard reached rev with no change to this
// resource. A subscriber too busy to take it simply misses it.
func (r *resourceState) bookmark(rev int64) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if len(r.subs) == 0 {
		return
	}
	ev := []*event{bookmark(rev)}
	for s := range r.subs {
		s.offer(ev)
	}
}

// objects returns the current objects in key order.
func (r *resourceState) objects() []*kube.Object {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]*kube.Object, 0, r.state.Len())
	r.state.Ascend(func(e *entry) bool {
		out = append(out, e.obj)
		return true
	})
	return out
}

// get returns the current object at key, or nil.
func (r *resourceState) get(key string) *kube.Object {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if e, ok := r.state.Get(&entry{key: key}); ok {
		return e.obj
	}
	return nil
}

// stateAt returns the resource's state as of rev, a *tooOldError when
// rev is older than the window, or errTooLarge when the shard has not
// reached it (head: the shard's applied revision).
func (r *resourceState) stateAt(rev, head int64) (snapshot, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.stateAtLocked(rev, r.headLocked(head))
}

// watchStart is what a watch begins with: taken, with its subscription, in
// one hold of the window's lock.
type watchStart struct {
	// from: the revision the watch starts after (the state's revision for
	// a watch with initial events).
	from int64
	// state: with initial events, the state at from; else nil.
	state *snapshot
	// events: the window's events in (from, head], in order.
	events []*event
	// head: the window's head. A subscriber registered with this start is
	// queued every revision after head and none before.
	head int64
}

// watchAfter returns the window's events after after (0: from the head,
// none) and registers sub (nil: a replay that does not follow). When after
// is older than the window it returns a *tooOldError and registers nothing.
func (r *resourceState) watchAfter(after, head int64, sub *subscriber) (watchStart, error) {
	return r.watch(after, false, head, sub)
}

// watchState returns the state at rev (0: at the head) and the window's
// events after it, and registers sub (nil: a replay that does not follow).
// When rev is older than the window it returns a *tooOldError and registers
// nothing.
func (r *resourceState) watchState(rev, head int64, sub *subscriber) (watchStart, error) {
	return r.watch(rev, true, head, sub)
}

// watch takes a watch's start after from (0: the head), with the state at
// from when withState, and registers sub, in one hold of the lock.
func (r *resourceState) watch(from int64, withState bool, head int64, sub *subscriber) (watchStart, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	start := watchStart{from: from, head: r.headLocked(head)}
	if start.from == 0 {
		start.from = start.head
	}
	if withState {
		st, err := r.stateAtLocked(start.from, start.head)
		if err != nil {
			return watchStart{}, err
		}
		start.state = &st
	}
	evs, err := r.sinceLocked(start.from)
	if err != nil {
		return watchStart{}, err
	}
	start.events = evs
	r.subscribeLocked(sub)
	return start, nil
}

// unsubscribe removes sub (already removed if it was cut off).
func (r *resourceState) unsubscribe(sub *subscriber) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.removeLocked(sub)
}

// wantsProtobuf reports whether a following stream asked with_protobuf:
// only then does the shard encode the protobuf of the objects it applies
// (watchevent.FromChange), once per event, for all of them.
func (r *resourceState) wantsProtobuf() bool { return r.protobufSubs.Load() > 0 }

// queued is the number of revisions queued on the subscribers, not yet sent.
func (r *resourceState) queued() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	n := 0
	for s := range r.subs {
		n += s.queued()
	}
	return n
}

func (r *resourceState) subscribeLocked(sub *subscriber) {
	if sub != nil {
		r.subs[sub] = struct{}{}
		if sub.protobuf {
			r.protobufSubs.Add(1)
		}
	}
}

func (r *resourceState) removeLocked(sub *subscriber) {
	if _, ok := r.subs[sub]; !ok {
		return
	}
	delete(r.subs, sub)
	if sub.protobuf {
		r.protobufSubs.Add(-1)
	}
}

// headLocked is the newest revision the state is known to be at: the
// shard's head, or the window's newest revision when the shard has not
// published it yet (it advances once every resource applied it).
func (r *resourceState) headLocked(head int64) int64 {
	if n := len(r.window); n > 0 {
		head = max(head, r.window[n-1].rev)
	}
	return head
}

// stateAtLocked returns the state as of rev: the current state for rev ==
// head, otherwise the state after the newest windowed revision <= rev. A
// revision after head is refused with errTooLarge: the state does not
// reflect it yet, and serving the current state under its number would
// hide what happened since (callers wait for the shard to reach it first).
func (r *resourceState) stateAtLocked(rev, head int64) (snapshot, error) {
	if rev > head {
		return snapshot{}, errTooLarge
	}
	if rev == head {
		return snapshot{r.state.Clone()}, nil
	}
	if rev < r.windowStart {
		return snapshot{}, &tooOldError{rev: rev, start: r.windowStart}
	}
	i := sort.Search(len(r.window), func(i int) bool { return r.window[i].rev > rev })
	switch i {
	case 0:
		return snapshot{r.base.Clone()}, nil
	case len(r.window):
		return snapshot{r.state.Clone()}, nil
	}
	return snapshot{r.window[i-1].state.Clone()}, nil
}

// sinceLocked returns the window's events after rev in order, or a
// *tooOldError when rev is older than the window.
func (r *resourceState) sinceLocked(rev int64) ([]*event, error) {
	if rev < r.windowStart {
		return nil, &tooOldError{rev: rev, start: r.windowStart}
	}
	i := sort.Search(len(r.window), func(i int) bool { return r.window[i].rev > rev })
	var out []*event
	for _, s := range r.window[i:] {
		out = append(out, s.events...)
	}
	return out, nil
}
