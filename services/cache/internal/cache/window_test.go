package cache

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/btree"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// The window's own tests: pure logic, no etcd or NATS. A window is reset
// at revision 10 (as after a snapshot) and revisions are applied as the
// shard's apply goroutine does.

const snapRev = 10

func registry(t testing.TB) *kube.Registry {
	t.Helper()
	reg, err := kube.LoadRegistry("", kube.DefaultPrefix)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

func pods(t testing.TB) *kube.Resource {
	t.Helper()
	r, ok := registry(t).ByID("pods")
	if !ok {
		t.Fatal("no pods in the built-in registry")
	}
	return r
}

func newWindow(t testing.TB, capacity int) *resourceState {
	t.Helper()
	rs := newResourceState(pods(t), capacity)
	rs.reset(btree.NewG(32, lessEntry), snapRev)
	return rs
}

// change is one object written (or deleted) in a revision.
type change struct {
	ns, name string
	del      bool
}

func put(ns, name string) change { return change{ns: ns, name: name} }
func del(ns, name string) change { return change{ns: ns, name: name, del: true} }

// apply applies one revision of changes as the shard does: one event per
// change, the objects prepared at rev.
func apply(t testing.TB, rs *resourceState, rev int64, cs ...change) []*event {
	t.Helper()
	var evs []*event
	var objs []*kube.Object
	var keys []string
	for _, c := range cs {
		ev := &heraldv1.Event{Type: heraldv1.EventType_ADDED, Revision: rev, Namespace: c.ns, Name: c.name}
		var obj *kube.Object
		if c.del {
			ev.Type = heraldv1.EventType_DELETED
		} else {
			o, err := testPrepare(rs.res, c.ns, c.name, fmt.Appendf(nil, `{"metadata":{"name":%q,"namespace":%q}}`, c.name, c.ns), rev)
			if err != nil {
				t.Fatal(err)
			}
			obj = o
		}
		evs = append(evs, wireEvent(ev))
		objs = append(objs, obj)
		keys = append(keys, rs.res.ObjectKey(c.ns, c.name))
	}
	rs.applyRevision(rev, evs, objs, keys)
	return evs
}

// revs lists the events' revisions and names as "rev:name" ("rev:" for a
// bookmark), in order.
func revs[E interface {
	GetRevision() int64
	GetName() string
}](evs []E) []string {
	out := make([]string, 0, len(evs))
	for _, ev := range evs {
		out = append(out, fmt.Sprintf("%d:%s", ev.GetRevision(), ev.GetName()))
	}
	return out
}

// names lists the objects of a snapshot with the revision each was written
// at, in key order.
func names(s snapshot) []string {
	var out []string
	s.scan("", "", func(e *entry) bool {
		out = append(out, fmt.Sprintf("%s@%d", e.obj.Name, e.obj.Rev))
		return true
	})
	return out
}

// drain returns what is queued on sub, without waiting.
func drain(sub *subscriber) []*event {
	var out []*event
	for {
		select {
		case evs := <-sub.events():
			out = append(out, evs...)
		default:
			return out
		}
	}
}

func assertTooOld(t *testing.T, err error, rev, start int64) {
	t.Helper()
	var old *tooOldError
	if !errors.As(err, &old) {
		t.Fatalf("err = %v, want a *tooOldError", err)
	}
	if old.rev != rev || old.start != start {
		t.Fatalf("too old: rev %d start %d, want rev %d start %d", old.rev, old.start, rev, start)
	}
	if want := fmt.Sprintf("too old resource version: %d (%d)", rev, start+1); err.Error() != want {
		t.Fatalf("message %q, want %q", err.Error(), want)
	}
}

func TestWindowApplyAndWatchAfter(t *testing.T) {
	rs := newWindow(t, 100)
	apply(t, rs, 11, put("a", "p1"))
	apply(t, rs, 12, put("a", "p2"), put("b", "p3"))
	apply(t, rs, 13, del("a", "p1"))

	for _, tc := range []struct {
		after, head int64
		from        int64
		want        []string
		wantHead    int64
	}{
		{after: 10, head: 13, from: 10, want: []string{"11:p1", "12:p2", "12:p3", "13:p1"}, wantHead: 13},
		{after: 11, head: 13, from: 11, want: []string{"12:p2", "12:p3", "13:p1"}, wantHead: 13},
		{after: 13, head: 13, from: 13, want: []string{}, wantHead: 13},
		// The shard's head may be past the resource's last revision (other
		// resources changed), or behind it (the shard publishes its head
		// once every resource applied the revision).
		{after: 0, head: 20, from: 20, want: []string{}, wantHead: 20},
		{after: 11, head: 12, from: 11, want: []string{"12:p2", "12:p3", "13:p1"}, wantHead: 13},
		{after: 15, head: 20, from: 15, want: []string{}, wantHead: 20},
	} {
		start, err := rs.watchAfter(tc.after, tc.head, nil)
		if err != nil {
			t.Fatalf("after %d: %v", tc.after, err)
		}
		if got := revs(start.events); !slices.Equal(got, tc.want) || start.from != tc.from || start.head != tc.wantHead || start.state != nil {
			t.Errorf("after %d head %d: from %d head %d events %v, want from %d head %d events %v",
				tc.after, tc.head, start.from, start.head, got, tc.from, tc.wantHead, tc.want)
		}
	}
	if o := rs.get(rs.res.ObjectKey("a", "p2")); o == nil || o.Rev != 12 {
		t.Errorf("get p2 = %v, want it at 12", o)
	}
	if o := rs.get(rs.res.ObjectKey("a", "p1")); o != nil {
		t.Errorf("get p1 = %v after its deletion", o)
	}
	_, err := rs.watchAfter(9, 13, nil)
	assertTooOld(t, err, 9, snapRev)
}

// The window holds capacity events; the oldest revisions leave it whole, and
// the revision just before the oldest one it holds is the oldest it can
// serve.
func TestWindowCapacityBoundary(t *testing.T) {
	rs := newWindow(t, 3)
	apply(t, rs, 11, put("a", "p1"))
	apply(t, rs, 12, put("a", "p2"))
	apply(t, rs, 13, put("a", "p3"))
	if start, err := rs.watchAfter(10, 13, nil); err != nil || len(start.events) != 3 {
		t.Fatalf("at capacity: %d events, %v; want 3 events from 10", len(start.events), err)
	}
	apply(t, rs, 14, put("a", "p4"))
	_, err := rs.watchAfter(10, 14, nil)
	assertTooOld(t, err, 10, 11)
	start, err := rs.watchAfter(11, 14, nil)
	if err != nil || !slices.Equal(revs(start.events), []string{"12:p2", "13:p3", "14:p4"}) {
		t.Fatalf("after 11: %v, %v", revs(start.events), err)
	}

	// A revision larger than the capacity is kept whole, alone.
	apply(t, rs, 15, put("a", "q1"), put("a", "q2"), put("a", "q3"), put("a", "q4"))
	_, err = rs.watchAfter(13, 15, nil)
	assertTooOld(t, err, 13, 14)
	start, err = rs.watchAfter(14, 15, nil)
	if err != nil || len(start.events) != 4 {
		t.Fatalf("after 14: %v, %v; want the 4 events of 15", revs(start.events), err)
	}
	// The next revision pushes it out.
	apply(t, rs, 16, put("a", "p5"))
	_, err = rs.watchAfter(14, 16, nil)
	assertTooOld(t, err, 14, 15)
	if start, err = rs.watchAfter(15, 16, nil); err != nil || !slices.Equal(revs(start.events), []string{"16:p5"}) {
		t.Fatalf("after 15: %v, %v", revs(start.events), err)
	}
}

func TestWindowStateAt(t *testing.T) {
	rs := newResourceState(pods(t), 4)
	base := btree.NewG(32, lessEntry)
	o, err := testPrepare(rs.res, "a", "p0", []byte(`{"metadata":{"name":"p0","namespace":"a"}}`), 7)
	if err != nil {
		t.Fatal(err)
	}
	base.ReplaceOrInsert(&entry{key: rs.res.ObjectKey("a", "p0"), obj: o})
	rs.reset(base, snapRev)
	apply(t, rs, 11, put("a", "p1"))
	apply(t, rs, 12, put("a", "p0"))
	apply(t, rs, 14, del("a", "p1")) // 13 changed another resource

	before, err := rs.stateAt(12, 14)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		rev, head int64
		want      []string
	}{
		{10, 14, []string{"p0@7"}},
		{11, 14, []string{"p0@7", "p1@11"}},
		{12, 14, []string{"p0@12", "p1@11"}},
		{13, 14, []string{"p0@12", "p1@11"}},
		{14, 14, []string{"p0@12"}},
		{20, 20, []string{"p0@12"}},
		// The shard has not published 14 yet: 13 is still the state
		// before it, not the current state.
		{13, 13, []string{"p0@12", "p1@11"}},
	} {
		s, err := rs.stateAt(tc.rev, tc.head)
		if err != nil {
			t.Fatalf("state at %d: %v", tc.rev, err)
		}
		if got := names(s); !slices.Equal(got, tc.want) {
			t.Errorf("state at %d (head %d) = %v, want %v", tc.rev, tc.head, got, tc.want)
		}
	}
	_, err = rs.stateAt(9, 14)
	assertTooOld(t, err, 9, snapRev)
	// Not reached: the current state is not the state at 15.
	if _, err := rs.stateAt(15, 14); !errors.Is(err, errTooLarge) {
		t.Errorf("state at 15 with the head at 14: %v, want errTooLarge", err)
	}

	// Outside the window once evicted; a snapshot handed out earlier
	// does not change.
	apply(t, rs, 15, put("a", "p2"), put("a", "p3"))
	apply(t, rs, 16, put("a", "p4"))
	_, err = rs.stateAt(11, 16)
	assertTooOld(t, err, 11, 12)
	if s, err := rs.stateAt(12, 16); err != nil || !slices.Equal(names(s), []string{"p0@12", "p1@11"}) {
		t.Errorf("state at 12 (the window's start) = %v, %v", names(s), err)
	}
	if got := names(before); !slices.Equal(got, []string{"p0@12", "p1@11"}) {
		t.Errorf("a snapshot taken at 12 now reads %v", got)
	}
}

func TestWindowWatchState(t *testing.T) {
	rs := newWindow(t, 100)
	apply(t, rs, 11, put("a", "p1"))
	apply(t, rs, 12, put("b", "p2"))

	start, err := rs.watchState(0, 15, nil)
	if err != nil || start.state == nil || start.from != 15 || start.head != 15 || len(start.events) != 0 {
		t.Fatalf("state at the head: %+v, %v", start, err)
	}
	if got := names(*start.state); !slices.Equal(got, []string{"p1@11", "p2@12"}) {
		t.Errorf("state at the head = %v", got)
	}
	start, err = rs.watchState(11, 12, nil)
	if err != nil || start.from != 11 || start.head != 12 || !slices.Equal(revs(start.events), []string{"12:p2"}) {
		t.Fatalf("state at 11: %+v, %v", start, err)
	}
	if got := names(*start.state); !slices.Equal(got, []string{"p1@11"}) {
		t.Errorf("state at 11 = %v", got)
	}
	sub := newSubscriber(4)
	_, err = rs.watchState(9, 12, sub)
	assertTooOld(t, err, 9, snapRev)
	apply(t, rs, 13, put("a", "p3"))
	if q := drain(sub); len(q) != 0 {
		t.Errorf("a subscriber refused as too old was queued %v", revs(q))
	}
}

func TestWindowSubscriberFollows(t *testing.T) {
	rs := newWindow(t, 100)
	apply(t, rs, 11, put("a", "p1"))
	sub := newSubscriber(8)
	start, err := rs.watchAfter(10, 11, sub)
	if err != nil || !slices.Equal(revs(start.events), []string{"11:p1"}) {
		t.Fatalf("start: %v, %v", revs(start.events), err)
	}
	apply(t, rs, 12, put("a", "p2"), put("b", "p3"))
	rs.bookmark(13)
	apply(t, rs, 14, del("a", "p1"))
	if got, want := revs(drain(sub)), []string{"12:p2", "12:p3", "13:", "14:p1"}; !slices.Equal(got, want) {
		t.Errorf("queued %v, want %v", got, want)
	}
	if rs.queued() != 0 {
		t.Errorf("queued() = %d after draining", rs.queued())
	}
	rs.unsubscribe(sub)
	apply(t, rs, 15, put("a", "p4"))
	rs.bookmark(16)
	if q := drain(sub); len(q) != 0 {
		t.Errorf("an unsubscribed subscriber was queued %v", revs(q))
	}
	if sub.err() != nil {
		t.Errorf("unsubscribing cut the subscriber: %v", sub.err())
	}
}

// A subscriber whose queue is full when a revision comes is cut off with
// errTooSlow and leaves the window; a bookmark that does not fit is
// dropped and cuts nothing.
func TestWindowSlowSubscriberIsCut(t *testing.T) {
	rs := newWindow(t, 100)
	slow, fast := newSubscriber(2), newSubscriber(8)
	for _, sub := range []*subscriber{slow, fast} {
		if _, err := rs.watchAfter(0, snapRev, sub); err != nil {
			t.Fatal(err)
		}
	}
	apply(t, rs, 11, put("a", "p1"))
	apply(t, rs, 12, put("a", "p2"))
	rs.bookmark(13) // does not fit slow's queue
	select {
	case <-slow.done():
		t.Fatalf("a dropped bookmark cut the subscriber: %v", slow.err())
	default:
	}
	if slow.err() != nil {
		t.Fatalf("err() = %v before any cut", slow.err())
	}
	if n := rs.queued(); n != 5 {
		t.Errorf("queued() = %d, want 2 + 3", n)
	}
	apply(t, rs, 14, put("a", "p3")) // does not fit either: cut
	select {
	case <-slow.done():
	default:
		t.Fatal("a subscriber with a full queue was not cut off")
	}
	if !errors.Is(slow.err(), errTooSlow) {
		t.Errorf("err() = %v, want errTooSlow", slow.err())
	}
	apply(t, rs, 15, put("a", "p4"))
	if got, want := revs(drain(slow)), []string{"11:p1", "12:p2"}; !slices.Equal(got, want) {
		t.Errorf("slow was queued %v, want only %v (nothing after its cut)", got, want)
	}
	if got, want := revs(drain(fast)), []string{"11:p1", "12:p2", "13:", "14:p3", "15:p4"}; !slices.Equal(got, want) {
		t.Errorf("fast was queued %v, want %v", got, want)
	}
}

// reset (a resync) replaces the state, restarts the window at its revision
// and cuts every subscriber off with errResync.
func TestWindowReset(t *testing.T) {
	rs := newWindow(t, 100)
	apply(t, rs, 11, put("a", "p1"))
	sub := newSubscriber(8)
	if _, err := rs.watchAfter(11, 11, sub); err != nil {
		t.Fatal(err)
	}
	fresh := btree.NewG(32, lessEntry)
	o, err := testPrepare(rs.res, "a", "p9", []byte(`{"metadata":{"name":"p9","namespace":"a"}}`), 30)
	if err != nil {
		t.Fatal(err)
	}
	fresh.ReplaceOrInsert(&entry{key: rs.res.ObjectKey("a", "p9"), obj: o})
	rs.reset(fresh, 40)

	if !errors.Is(sub.err(), errResync) {
		t.Fatalf("subscriber err = %v, want errResync", sub.err())
	}
	apply(t, rs, 41, put("a", "p2"))
	if q := drain(sub); len(q) != 0 {
		t.Errorf("a subscriber cut by the reset was queued %v", revs(q))
	}
	_, err = rs.watchAfter(11, 41, nil)
	assertTooOld(t, err, 11, 40)
	start, err := rs.watchAfter(40, 41, nil)
	if err != nil || !slices.Equal(revs(start.events), []string{"41:p2"}) {
		t.Errorf("after 40: %v, %v", revs(start.events), err)
	}
	if s, err := rs.stateAt(40, 41); err != nil || !slices.Equal(names(s), []string{"p9@30"}) {
		t.Errorf("state at 40 = %v, %v", names(s), err)
	}
	if rs.get(rs.res.ObjectKey("a", "p1")) != nil {
		t.Error("the state before the reset survived it")
	}
}

// Watches that start while revisions are applied get every event after
// their start revision exactly once and in order: the window's part, then
// the subscriber's. Run with -race.
func TestWindowSubscribeNoGapNoDuplicate(t *testing.T) {
	const last = snapRev + 2000
	rs := newWindow(t, 1<<20)
	// The events of revision rev: one object o<rev>, and a second one in
	// another namespace every third revision; every fifth revision changes
	// another resource only (a bookmark).
	type ev struct {
		rev  int64
		name string
	}
	want := func(after, upTo int64) []ev {
		var out []ev
		for rev := after + 1; rev <= upTo; rev++ {
			if rev%5 == 0 {
				continue
			}
			out = append(out, ev{rev, fmt.Sprintf("o%d", rev)})
			if rev%3 == 0 {
				out = append(out, ev{rev, fmt.Sprintf("x%d", rev)})
			}
		}
		return out
	}
	var head atomic.Int64
	head.Store(snapRev)

	type watch struct {
		start watchStart
		sub   *subscriber
	}
	var (
		mu      sync.Mutex
		watches []watch
		wg      sync.WaitGroup
		applied = make(chan struct{})
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(applied)
		for rev := int64(snapRev + 1); rev <= last; rev++ {
			switch {
			case rev%5 == 0:
				head.Store(rev)
				rs.bookmark(rev)
				continue
			case rev%3 == 0:
				apply(t, rs, rev, put("a", fmt.Sprintf("o%d", rev)), put("b", fmt.Sprintf("x%d", rev)))
			default:
				apply(t, rs, rev, put("a", fmt.Sprintf("o%d", rev)))
			}
			head.Store(rev)
		}
	}()
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			prev := int64(0)
			for {
				// One watch every few revisions: enough to start at
				// every point of an apply, few enough to keep the
				// subscribers' queues small.
				h, next := head.Load(), prev+1+r.Int64N(10)
				for ; h < next; h = head.Load() {
					select {
					case <-applied:
						return
					default:
						runtime.Gosched()
					}
				}
				select {
				case <-applied:
					return
				default:
				}
				prev = h
				sub := newSubscriber(int(last-h) + 1)
				var start watchStart
				var err error
				if r.IntN(4) == 0 {
					start, err = rs.watchState(0, h, sub)
				} else {
					start, err = rs.watchAfter(max(snapRev, h-r.Int64N(50)), h, sub)
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				watches = append(watches, watch{start, sub})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()

	if len(watches) == 0 {
		t.Fatal("no watch started")
	}
	all := want(snapRev, last)
	for _, w := range watches {
		// What the watch must see: every event after from, in order.
		i := sort.Search(len(all), func(i int) bool { return all[i].rev > w.start.from })
		exp := all[i:]
		n := 0
		check := func(ev *event) {
			if n >= len(exp) || ev.Revision != exp[n].rev || ev.Name != exp[n].name {
				t.Fatalf("watch from %d (head %d): event %d is %d:%s, want %v", w.start.from, w.start.head, n, ev.Revision, ev.Name, exp[min(n, len(exp)-1):][:1])
			}
			n++
		}
		for _, ev := range w.start.events {
			if ev.Revision > w.start.head {
				t.Fatalf("start from %d head %d holds an event at %d", w.start.from, w.start.head, ev.Revision)
			}
			check(ev)
		}
		for _, ev := range drain(w.sub) {
			if ev.Type == heraldv1.EventType_BOOKMARK {
				continue
			}
			if ev.Revision <= w.start.head {
				t.Fatalf("start head %d, then queued an event at %d", w.start.head, ev.Revision)
			}
			check(ev)
		}
		if n != len(exp) {
			t.Fatalf("watch from %d (head %d): %d events, want %d", w.start.from, w.start.head, n, len(exp))
		}
		if w.start.state != nil {
			objs := 0
			w.start.state.scan("", "", func(e *entry) bool {
				if e.obj.Rev > w.start.from {
					t.Fatalf("the state at %d holds %s written at %d", w.start.from, e.obj.Name, e.obj.Rev)
				}
				objs++
				return true
			})
			if objs != i {
				t.Fatalf("the state at %d holds %d objects, want %d", w.start.from, objs, i)
			}
		}
	}
	t.Logf("%d watches checked", len(watches))
}

var testDecoder = sync.OnceValues(func() (*kube.Decoder, error) { return kube.NewDecoder(nil) })

// testPrepare decodes a stored JSON value of r at key (namespace, name) at
// rev, as the shard does.
func testPrepare(r *kube.Resource, namespace, name string, value []byte, rev int64) (*kube.Object, error) {
	d, err := testDecoder()
	if err != nil {
		return nil, err
	}
	return d.Decode(context.Background(), r, r.ObjectKey(namespace, name), namespace, name, value, rev)
}
