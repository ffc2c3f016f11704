package fanout

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	"herald.dev/libs/kube/request"
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// The ring keeps the newest events within both bounds, and a watcher that
// joins before what it holds is sent to the cache rather than given a gap.
func TestRingBounds(t *testing.T) {
	pods := podsResource(t)
	obj := bytes.Repeat([]byte("x"), 1000)
	cost := newItem(&heraldv1.Event{Object: obj}).cost()
	all, err := request.ParseSelector(pods, "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		limits    ringLimits
		wantItems int
	}{
		{"by events", ringLimits{events: 5, bytes: 1 << 30}, 5},
		{"by bytes", ringLimits{events: 1000, bytes: 3*cost + cost/2}, 3},
		{"one oversized event is kept", ringLimits{events: 1000, bytes: 1}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHub(pods, nil, tc.limits, slog.New(slog.NewTextHandler(io.Discard, nil)), newMetrics(prometheus.NewRegistry()), clock.RealClock{})
			h.mu.Lock()
			h.isSynced = true
			for rev := int64(1); rev <= 20; rev++ {
				h.dispatch(newItem(&heraldv1.Event{Type: heraldv1.EventType_ADDED, Revision: rev, Namespace: "default", Name: "p", Object: obj}))
			}
			h.head.Store(20) // as flush does once the revisions are queued
			if len(h.ring) != tc.wantItems {
				t.Fatalf("ring holds %d events, want %d", len(h.ring), tc.wantItems)
			}
			if h.ringBytes != tc.wantItems*cost {
				t.Errorf("ringBytes = %d, want %d", h.ringBytes, tc.wantItems*cost)
			}
			first := int64(20 - tc.wantItems + 1)
			if h.ring[0].ev.Revision != first || h.ringStart != first-1 {
				t.Errorf("ring starts at revision %d (ringStart %d), want %d (%d)", h.ring[0].ev.Revision, h.ringStart, first, first-1)
			}
			h.mu.Unlock()

			// Joining at ringStart: the ring has everything after it.
			backlog, head, ok := h.join(newWatcher(all, 100, 1<<20), first-1)
			if !ok || head != 20 || len(backlog) != tc.wantItems || backlog[0].ev.Revision != first {
				t.Errorf("join at %d: ok=%v head=%d backlog=%d, want ok, head 20, %d events from %d", first-1, ok, head, len(backlog), tc.wantItems, first)
			}
			// One revision earlier is no longer covered.
			if _, _, ok := h.join(newWatcher(all, 100, 1<<20), first-2); ok {
				t.Errorf("join at %d succeeded; the ring starts after it", first-2)
			}
		})
	}
}

// The hub's head passes a revision only once all its events are queued to
// every watcher they concern: serve writes a bookmark at head without the
// hub's lock, and a bookmark that went out before an event it covers would
// let a client whose stream ends between the two resume past that event.
// Watchers whose queues overflow on the revision's first and on its second
// event (the only one the second sees) tell, as they fall behind (their
// writers are urged from inside the dispatch), where head stood.
func TestHubHeadPassesWholeQueuedRevisions(t *testing.T) {
	pods := podsResource(t)
	all, err := request.ParseSelector(pods, "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	h := newHub(pods, nil, ringLimits{events: 100, bytes: 1 << 30}, slog.New(slog.NewTextHandler(io.Discard, nil)), newMetrics(prometheus.NewRegistry()), clock.RealClock{})
	h.isSynced, h.ringStart = true, 10
	h.head.Store(10)
	onlyB, err := request.ParseSelector(pods, "", "x=b", "")
	if err != nil {
		t.Fatal(err)
	}
	var seen []int64
	for _, sel := range []*request.Selector{all, onlyB} { // full at the first event of 11, at the second
		w := newWatcher(sel, 0, 1<<20)
		w.notify = func(urgent bool) {
			if w.behind.Load() {
				seen = append(seen, h.head.Load())
			}
		}
		if _, _, ok := h.join(w, 10); !ok {
			t.Fatal("cannot join at the head")
		}
	}
	ev := func(name string) *heraldv1.Event {
		return &heraldv1.Event{Type: heraldv1.EventType_ADDED, Revision: 11, Namespace: "default", Name: name, Labels: heraldv1.SortedPairs(map[string]string{"x": name}), Object: []byte("{}")}
	}
	h.flush([]*heraldv1.Event{ev("a"), ev("b")})
	if len(seen) != 2 || seen[0] != 10 || seen[1] != 10 {
		t.Errorf("head while revision 11 was being queued: %v, want [10 10]", seen)
	}
	if head := h.head.Load(); head != 11 {
		t.Errorf("head %d once 11 is queued, want 11", head)
	}
}

// A watcher whose queue overflows falls behind instead of being closed: the
// hub stops queueing to it, its writer's takes top the queue up from the
// ring (only the events it sees), and it receives every event once, in
// order, until it has caught up and is queued to again. One that the ring
// has passed is closed, with what it was handed still queued for its
// writer.
func TestWatcherBehindCatchesUpFromTheRing(t *testing.T) {
	pods := podsResource(t)
	sel := func(ns string) *request.Selector {
		s, err := request.ParseSelector(pods, ns, "", "")
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	h := newHub(pods, nil, ringLimits{events: 30, bytes: 1 << 30}, slog.New(slog.DiscardHandler), newMetrics(prometheus.NewRegistry()), clock.RealClock{})
	h.isSynced = true
	all := newWatcher(sel(""), 4, 1<<20)
	mine := newWatcher(sel("mine"), 4, 1<<20)
	passed := newWatcher(sel(""), 4, 1<<20)
	for _, w := range []*watcher{all, mine, passed} {
		if _, _, ok := h.join(w, 0); !ok {
			t.Fatal("cannot join")
		}
	}
	rev := int64(0)
	put := func(n int) {
		for range n {
			rev++
			ns := "other"
			if rev%3 == 0 {
				ns = "mine"
			}
			h.flush([]*heraldv1.Event{{Type: heraldv1.EventType_ADDED, Revision: rev, Namespace: ns, Name: "p", Object: []byte("{}")}})
		}
	}
	// take drains w as its writer would, and returns the revisions.
	take := func(w *watcher) (revs []int64) {
		for {
			b := w.take(nil)
			if len(b) == 0 {
				return revs
			}
			for _, q := range b {
				revs = append(revs, q.it.ev.Revision)
			}
		}
	}
	behind := func() int {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.behind)
	}

	put(20)
	for _, w := range []*watcher{all, mine, passed} {
		if !w.behind.Load() || w.closedReason() != "" {
			t.Fatalf("after 20 events: behind=%v closed=%q, want behind and open", w.behind.Load(), w.closedReason())
		}
	}
	if n, urgent := all.level(); n != 4 || !urgent {
		t.Errorf("level of a watcher behind = %d, %v; want its 4 queued, urgent", n, urgent)
	}
	if got := behind(); got != 3 {
		t.Errorf("%d watchers behind, want 3", got)
	}
	if got := take(all); !reflect.DeepEqual(got, seq(1, 20, 1)) {
		t.Fatalf("watcher of every namespace got %v, want 1..20", got)
	}
	if got := take(mine); !reflect.DeepEqual(got, seq(3, 20, 3)) {
		t.Fatalf("watcher of one namespace got %v, want 3, 6, ..., 18", got)
	}
	if all.behind.Load() || mine.behind.Load() || behind() != 1 {
		t.Fatalf("caught up: behind %v %v, %d in all; want neither, 1 (the one not drained)", all.behind.Load(), mine.behind.Load(), behind())
	}
	put(3) // queued again, with the writer woken
	select {
	case <-all.wake:
	default:
		t.Error("a caught-up watcher was not woken for its next event")
	}
	if got := take(all); !reflect.DeepEqual(got, seq(21, 23, 1)) {
		t.Fatalf("after catching up, got %v, want 21..23", got)
	}

	// passed was handed 1..4; the ring of 30 drops 5 at event 35.
	put(11)
	if r := passed.closedReason(); r != "" {
		t.Fatalf("closed for %q at 34 events, with the ring still holding 5", r)
	}
	put(1)
	if r := passed.closedReason(); r != reasonQueueFull {
		t.Fatalf("closed for %q once the ring dropped 5, want %q", r, reasonQueueFull)
	}
	if got := take(passed); !reflect.DeepEqual(got, seq(1, 4, 1)) {
		t.Errorf("the closed watcher's writer got %v, want what it was handed, 1..4", got)
	}
	if got := behind(); got != 2 || !all.behind.Load() || !mine.behind.Load() {
		t.Errorf("%d watchers behind, want 2 (the two others, behind again)", got)
	}
	h.leave(all)
	h.leave(mine)
	if got := behind(); got != 0 {
		t.Errorf("%d watchers behind once they left, want 0", got)
	}
}

// seq is from, from+step, ..., up to to.
func seq(from, to, step int64) (s []int64) {
	for i := from; i <= to; i += step {
		s = append(s, i)
	}
	return s
}

// A revision queued in part is queued whole past the queue's bounds: a
// watcher falls behind between revisions (a transaction's events), never
// inside one, so that the ring, passing it, cannot leave it half a
// revision. The byte bound makes a watcher fall behind as the event bound
// does; an empty queue takes an event of any size.
func TestWatcherFallsBehindBetweenRevisions(t *testing.T) {
	pods := podsResource(t)
	all, err := request.ParseSelector(pods, "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	h := newHub(pods, nil, ringLimits{events: 100, bytes: 1 << 30}, slog.New(slog.DiscardHandler), newMetrics(prometheus.NewRegistry()), clock.RealClock{})
	h.isSynced = true
	byEvents := newWatcher(all, 2, 1<<20)
	byBytes := newWatcher(all, 100, 10)
	for _, w := range []*watcher{byEvents, byBytes} {
		if _, _, ok := h.join(w, 0); !ok {
			t.Fatal("cannot join")
		}
	}
	ev := func(rev int64, name string) *heraldv1.Event {
		return &heraldv1.Event{Type: heraldv1.EventType_ADDED, Revision: rev, Namespace: "default", Name: name, Object: []byte("12345678")}
	}
	h.flush([]*heraldv1.Event{ev(1, "a")})
	h.flush([]*heraldv1.Event{ev(2, "a"), ev(2, "b"), ev(2, "c")})
	h.flush([]*heraldv1.Event{ev(3, "a")})
	for _, tc := range []struct {
		name   string
		w      *watcher
		queued int
	}{
		{"by events", byEvents, 4}, // 1, then all of 2 past the bound of 2
		{"by bytes", byBytes, 1},   // 1 (8 bytes); 2's first event would pass the 10 bytes
	} {
		if n := tc.w.queued(); n != tc.queued || !tc.w.behind.Load() {
			t.Errorf("%s: %d queued, behind %v; want %d, behind", tc.name, n, tc.w.behind.Load(), tc.queued)
		}
	}
	lone := newWatcher(all, 100, 1)
	if _, _, ok := h.join(lone, 3); !ok {
		t.Fatal("cannot join")
	}
	h.flush([]*heraldv1.Event{ev(4, "a")})
	if n := lone.queued(); n != 1 || lone.behind.Load() {
		t.Errorf("an event larger than the byte bound, to an empty queue: %d queued, behind %v; want it queued", n, lone.behind.Load())
	}
}

// A watcher behind gets no bookmark at the hub's head until it has caught
// up: what it has not been sent up to the head is still in the ring, and a
// client whose stream ended after such a bookmark would resume past it.
func TestBookmarkTickWaitsForAWatcherBehind(t *testing.T) {
	pods := podsResource(t)
	all, err := request.ParseSelector(pods, "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	m := newMetrics(prometheus.NewRegistry())
	h := newHub(pods, nil, ringLimits{events: 100, bytes: 1 << 30}, slog.New(slog.DiscardHandler), m, clock.RealClock{})
	h.isSynced = true
	w := newWatcher(all, 2, 1<<20)
	if _, _, ok := h.join(w, 0); !ok {
		t.Fatal("cannot join")
	}
	for rev := int64(1); rev <= 5; rev++ {
		obj := fmt.Sprintf(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"default","resourceVersion":"%d"}}`, rev)
		h.flush([]*heraldv1.Event{{Type: heraldv1.EventType_MODIFIED, Revision: rev, Namespace: "default", Name: "p", Object: []byte(obj)}})
	}
	rec := httptest.NewRecorder()
	st := &stream{w: rec, rc: http.NewResponseController(rec), res: pods, f: jsonLines, enc: testEncoder(t, pods), m: m, clock: clock.RealClock{}, batches: &sync.Pool{}}
	var batch []queued
	// tick is one bookmark tick whose drain takes the queue rounds times;
	// it returns the types and resourceVersions written.
	tick := func(rounds int) (got []string) {
		rec.Body.Reset()
		st.bookmarkTick(h, w, func() int { return st.drain(w, &batch, rounds) })
		for _, line := range bytes.Split(bytes.TrimSpace(rec.Body.Bytes()), []byte("\n")) {
			var ev metav1.WatchEvent
			var obj metav1.PartialObjectMetadata
			if json.Unmarshal(line, &ev) != nil || json.Unmarshal(ev.Object.Raw, &obj) != nil {
				t.Fatalf("stream line %q", line)
			}
			got = append(got, ev.Type+" "+obj.ResourceVersion)
		}
		return got
	}
	for _, step := range []struct {
		rounds int
		want   []string
	}{
		{1, []string{"MODIFIED 1", "MODIFIED 2"}},               // behind, still behind after
		{8, []string{"MODIFIED 3", "MODIFIED 4", "MODIFIED 5"}}, // behind, caught up by the end
		{8, []string{"BOOKMARK 5"}},
	} {
		if got := tick(step.rounds); !reflect.DeepEqual(got, step.want) {
			t.Fatalf("bookmark tick: %v, want %v", got, step.want)
		}
	}
}

// A hub's event goes by reference on a session only once more than one
// watcher was handed it: queued by dispatch, or written from the ring to a
// watcher that joins (a wave of resumes after a restart shares the
// backlog); one queued to a single watcher (a kubelet's pod) goes as that
// watch's own bytes.
func TestItemsSharedByMany(t *testing.T) {
	pods := podsResource(t)
	all, err := request.ParseSelector(pods, "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	h := newHub(pods, nil, ringLimits{events: 100, bytes: 1 << 30}, slog.New(slog.NewTextHandler(io.Discard, nil)), newMetrics(prometheus.NewRegistry()), clock.RealClock{})
	h.mu.Lock()
	h.isSynced = true
	h.mu.Unlock()
	if _, _, ok := h.join(newWatcher(all, 100, 1<<20), 0); !ok {
		t.Fatal("join failed")
	}
	dispatch := func(rev int64) *item {
		it := newItem(&heraldv1.Event{Type: heraldv1.EventType_ADDED, Revision: rev, Namespace: "default", Name: "p", Object: []byte(`{}`)})
		it.shared = true
		h.mu.Lock()
		h.dispatch(it)
		h.head.Store(rev)
		h.mu.Unlock()
		return it
	}
	one := dispatch(1)
	if one.sharedByMany() {
		t.Fatal("an event queued to one watcher goes by reference")
	}
	backlog, _, ok := h.join(newWatcher(all, 100, 1<<20), 0)
	if !ok || len(backlog) != 1 || backlog[0] != one {
		t.Fatalf("second join: ok=%v backlog=%d", ok, len(backlog))
	}
	if !one.sharedByMany() {
		t.Error("the backlog of a second watcher does not go by reference")
	}
	if two := dispatch(2); !two.sharedByMany() {
		t.Error("an event queued to two watchers does not go by reference")
	}
	if catchUp := newItem(&heraldv1.Event{Revision: 3}); catchUp.sharedByMany() {
		t.Error("a catch-up's event goes by reference")
	}
}
