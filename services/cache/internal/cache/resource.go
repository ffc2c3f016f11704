package cache

import (
	"sort"
	"strings"
	"sync"

	"github.com/google/btree"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
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
	events []*heraldv1.Event
	state  *tree
}

// resourceState is the cache of one resource: its current objects, a window
// of its most recent revisions, and the watch streams following it.
//
// Invariants (under mu):
//   - state holds every object as of revision head (the shard's head when
//     the resource was last touched; later revisions did not change it).
//   - window holds, in increasing revision order, every revision of this
//     resource after windowStart; base is the state at windowStart.
//   - every subscriber has been sent (or queued) every event up to the
//     revision it was registered at, and is queued every later one.
type resourceState struct {
	res      *kube.Resource
	capacity int          // events in the window
	parts    map[int]bool // owned namespace partitions; nil: all

	mu          sync.RWMutex
	state       *tree
	window      []slot // oldest first; sum of len(events) <= capacity, except one oversized revision
	events      int
	windowStart int64
	base        *tree
	subs        map[*subscriber]struct{}
}

func newResourceState(res *kube.Resource, capacity int) *resourceState {
	return &resourceState{res: res, capacity: capacity, state: btree.NewG(32, lessEntry), subs: map[*subscriber]struct{}{}}
}

// reset replaces the state with a snapshot at rev and empties the window.
// Subscribers are cut off: they cannot be given a consistent history.
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
}

// applyRevision applies one revision's changes of this resource and fans the
// resulting events out to subscribers. It runs on the shard's single apply
// goroutine.
func (r *resourceState) applyRevision(rev int64, evs []*heraldv1.Event, puts []*kube.Object, keys []string) {
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
			delete(r.subs, s)
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
	ev := []*heraldv1.Event{{Type: heraldv1.EventType_BOOKMARK, Revision: rev}}
	for s := range r.subs {
		s.offer(ev)
	}
}

// get returns the current object at key.
func (r *resourceState) get(key string) *kube.Object {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if e, ok := r.state.Get(&entry{key: key}); ok {
		return e.obj
	}
	return nil
}

// stateAt returns the resource's state as of rev, if the window still
// knows it: the current state for rev >= the last windowed revision,
// otherwise the state after the latest windowed revision <= rev.
func (r *resourceState) stateAt(rev, head int64) (*tree, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.stateAtLocked(rev, head)
}

// stateAtLocked is stateAt with mu held.
func (r *resourceState) stateAtLocked(rev, head int64) (*tree, bool) {
	if rev >= head {
		return r.state.Clone(), true
	}
	if rev < r.windowStart {
		return nil, false
	}
	i := sort.Search(len(r.window), func(i int) bool { return r.window[i].rev > rev })
	if i == 0 {
		return r.base.Clone(), true
	}
	if i == len(r.window) {
		return r.state.Clone(), true
	}
	return r.window[i-1].state.Clone(), true
}

// since returns the window's events after rev in order, and ok=false when rev
// is older than the window.
func (r *resourceState) since(rev int64) ([]*heraldv1.Event, bool) {
	if rev < r.windowStart {
		return nil, false
	}
	i := sort.Search(len(r.window), func(i int) bool { return r.window[i].rev > rev })
	var out []*heraldv1.Event
	for _, s := range r.window[i:] {
		out = append(out, s.events...)
	}
	return out, true
}

// scan calls fn for the objects of t in key order, starting after key
// after (exclusive) and restricted to prefix, until fn returns false.
func scan(t *tree, prefix, after string, fn func(*entry) bool) {
	start := prefix
	if after != "" && after >= prefix {
		start = after + "\x00"
	}
	t.AscendGreaterOrEqual(&entry{key: start}, func(e *entry) bool {
		if !strings.HasPrefix(e.key, prefix) {
			return false
		}
		return fn(e)
	})
}
