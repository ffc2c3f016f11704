package cache

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/btree"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	clocktesting "k8s.io/utils/clock/testing"

	"herald.dev/libs/kube"
	"herald.dev/libs/kube/request"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/rv"
)

// Server.Watch as an adapter: what it sends for what the window gives it.
// The shard is built by hand around one window (no etcd, no NATS): every
// request here is for a revision the shard has reached.

// watchStream is a Cache_WatchServer whose responses go to a channel. With
// ack set, Send returns only once the test acknowledges the response: the
// test knows where the stream's goroutine is.
type watchStream struct {
	grpc.ServerStream
	ctx  context.Context
	sent chan *heraldv1.WatchResponse
	ack  chan struct{}
}

func (s *watchStream) Context() context.Context { return s.ctx }

func (s *watchStream) Send(r *heraldv1.WatchResponse) error {
	select {
	case s.sent <- r:
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
	if s.ack == nil {
		return nil
	}
	select {
	case <-s.ack:
		return nil
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
}

func testServer(t *testing.T, rs *resourceState, head int64, buffer int) (*Server, *Shard) {
	t.Helper()
	s := &Shard{cfg: Config{SubscriberBuffer: buffer, WaitTimeout: time.Second}, reg: registry(t), m: newMetrics(prometheus.NewRegistry()),
		advanced: make(chan struct{}), firstUp: make(chan struct{})}
	s.states.Store(&map[string]*resourceState{rs.res.ID(): rs})
	s.ready.Store(true)
	s.head.Store(head)
	return NewServer(s), s
}

// watch runs Watch and returns its responses, flattened to "rev:name"
// ("rev:" for a bookmark), and its error; the stream is never waited on.
func watch(t *testing.T, v *Server, req *heraldv1.WatchRequest) ([]string, [][]*heraldv1.Event, error) {
	t.Helper()
	st := &watchStream{ctx: t.Context(), sent: make(chan *heraldv1.WatchResponse, 1000)}
	err := v.Watch(req, st)
	close(st.sent)
	var flat []string
	var resps [][]*heraldv1.Event
	for r := range st.sent {
		flat = append(flat, revs(r.Events)...)
		resps = append(resps, r.Events)
	}
	return flat, resps, err
}

func TestWatchReplayFromTheWindow(t *testing.T) {
	rs := newWindow(t, 100)
	apply(t, rs, 11, put("a", "p1"), put("b", "p2"))
	apply(t, rs, 12, put("a", "p3"))
	v, _ := testServer(t, rs, 14, 8)

	got, _, err := watch(t, v, &heraldv1.WatchRequest{Resource: "pods", AfterRevision: 10})
	if want := []string{"10:", "11:p1", "11:p2", "12:p3", "14:"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("all namespaces: %v, %v; want %v", got, err, want)
	}
	got, _, err = watch(t, v, &heraldv1.WatchRequest{Resource: "pods", Namespace: "b", AfterRevision: 10})
	if want := []string{"10:", "11:p2", "14:"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("namespace b: %v, %v; want %v", got, err, want)
	}
	got, _, err = watch(t, v, &heraldv1.WatchRequest{Resource: "pods"})
	if want := []string{"14:", "14:"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("from now: %v, %v; want %v", got, err, want)
	}
	got, _, err = watch(t, v, &heraldv1.WatchRequest{Resource: "pods", Namespace: "a", InitialEvents: true})
	if want := []string{"11:p1", "12:p3", "14:", "14:"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("initial events: %v, %v; want %v", got, err, want)
	}
	got, _, err = watch(t, v, &heraldv1.WatchRequest{Resource: "pods", InitialEvents: true, StateRevision: 11})
	if want := []string{"11:p1", "11:p2", "11:", "12:p3", "14:"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("state at 11: %v, %v; want %v", got, err, want)
	}
	_, _, err = watch(t, v, &heraldv1.WatchRequest{Resource: "pods", InitialEvents: true, StateRevision: 9})
	if status.Code(err) != codes.OutOfRange || status.Convert(err).Message() != "too old resource version: 9 (11)" {
		t.Errorf("state at 9: %v, want OutOfRange too old", err)
	}
}

// A response holds up to watchBatch events but never splits a revision.
func TestWatchBatchesWholeRevisions(t *testing.T) {
	rs := newWindow(t, 10_000)
	var big []change
	for i := range watchBatch + 10 {
		big = append(big, put("a", fmt.Sprintf("p%03d", i)))
	}
	apply(t, rs, 11, put("a", "first"))
	apply(t, rs, 12, big...)
	apply(t, rs, 13, put("a", "last"))
	v, _ := testServer(t, rs, 13, 8)
	_, resps, err := watch(t, v, &heraldv1.WatchRequest{Resource: "pods", AfterRevision: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(resps) != 2 || len(resps[0]) != 2+watchBatch+10 || len(resps[1]) != 2 {
		t.Fatalf("responses of %d events, want [bookmark, 11, 12...] and [13, bookmark]", lens(resps))
	}
}

// A response is sent once its objects reach watchBatchBytes, however few
// its events, but a revision is still never split: what a reader holds per
// stream is bounded by bytes, not only by events.
func TestWatchBatchesBoundedByBytes(t *testing.T) {
	st := &watchStream{ctx: t.Context(), sent: make(chan *heraldv1.WatchResponse, 100)}
	w := &watchSender{stream: st}
	obj := make([]byte, 50<<10)
	add := func(rev int64, n int) {
		for range n {
			if err := w.add(wireEvent(&heraldv1.Event{Type: heraldv1.EventType_MODIFIED, Revision: rev, Object: obj, PrevObject: obj[:10<<10]})); err != nil {
				t.Fatal(err)
			}
		}
	}
	add(1, 1) // 60 KiB
	add(2, 1) // 120 KiB
	add(3, 1) // 180 KiB: past the bound, sent before the next revision
	add(4, 5) // one revision of 300 KiB: whole
	add(5, 1)
	if err := w.flush(); err != nil {
		t.Fatal(err)
	}
	close(st.sent)
	var got []string
	for r := range st.sent {
		got = append(got, strings.Join(revs(r.Events), ","))
	}
	if want := []string{"1:,2:,3:", "4:,4:,4:,4:,4:", "5:"}; !slices.Equal(got, want) {
		t.Errorf("responses %q, want %q", got, want)
	}
}

func lens(resps [][]*heraldv1.Event) []int {
	var out []int
	for _, r := range resps {
		out = append(out, len(r))
	}
	return out
}

// A following watch streams the window's revisions as they come, and is
// ended with Aborted when the window cuts it off.
func TestWatchFollowsUntilCut(t *testing.T) {
	rs := newWindow(t, 100)
	v, s := testServer(t, rs, snapRev, 1)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	st := &watchStream{ctx: ctx, sent: make(chan *heraldv1.WatchResponse), ack: make(chan struct{})}
	done := make(chan error, 1)
	go func() { done <- v.Watch(&heraldv1.WatchRequest{Resource: "pods", Namespace: "a", Follow: true}, st) }()
	next := func() []string {
		t.Helper()
		r := <-st.sent
		return revs(r.Events)
	}

	if got := next(); !slices.Equal(got, []string{"10:", "10:"}) {
		t.Fatalf("start: %v", got)
	}
	st.ack <- struct{}{} // registered before its start was sent
	apply(t, rs, 11, put("b", "p1"), put("a", "p2"))
	if got := next(); !slices.Equal(got, []string{"11:p2"}) {
		t.Fatalf("live: %v", got)
	}
	st.ack <- struct{}{}
	rs.bookmark(12)
	if got := next(); !slices.Equal(got, []string{"12:"}) {
		t.Fatalf("bookmark: %v", got)
	}
	st.ack <- struct{}{}
	// The client stops reading while 13 is being sent: 14 fills the
	// stream's queue of one, 15 cuts it off.
	apply(t, rs, 13, put("a", "p3"))
	if got := next(); !slices.Equal(got, []string{"13:p3"}) {
		t.Fatalf("before the cut: %v", got)
	}
	apply(t, rs, 14, put("a", "p4"))
	rs.bookmark(15) // dropped: no room, no cut
	select {
	case <-done:
		t.Fatal("a dropped bookmark ended the stream")
	default:
	}
	apply(t, rs, 16, put("a", "p5"))
	st.ack <- struct{}{}
	var err error
	for err == nil {
		select {
		case err = <-done:
		case r := <-st.sent: // 14, queued before the cut, may still go out
			if got := revs(r.Events); !slices.Equal(got, []string{"14:p4"}) {
				t.Fatalf("after the cut: %v", got)
			}
			st.ack <- struct{}{}
		}
	}
	if status.Code(err) != codes.Aborted || status.Convert(err).Message() != errTooSlow.Error() {
		t.Fatalf("Watch ended with %v, want Aborted: %v", err, errTooSlow)
	}
	if n := testutil.ToFloat64(s.m.subsCut.WithLabelValues("too_slow")); n != 1 {
		t.Errorf("too_slow cuts = %v, want 1", n)
	}
	if n := testutil.ToFloat64(s.m.subs.WithLabelValues("pods")); n != 0 {
		t.Errorf("%v streams still counted after the cut", n)
	}
}

// A resync cuts a following watch off with Aborted and errResync.
func TestWatchCutByResync(t *testing.T) {
	rs := newWindow(t, 100)
	v, s := testServer(t, rs, snapRev, 8)
	st := &watchStream{ctx: t.Context(), sent: make(chan *heraldv1.WatchResponse, 8)}
	done := make(chan error, 1)
	go func() { done <- v.Watch(&heraldv1.WatchRequest{Resource: "pods", Follow: true}, st) }()
	<-st.sent // the start: registered
	rs.reset(btree.NewG(32, lessEntry), 40)
	if err := <-done; status.Code(err) != codes.Aborted || status.Convert(err).Message() != errResync.Error() {
		t.Fatalf("Watch ended with %v, want Aborted: %v", err, errResync)
	}
	if n := testutil.ToFloat64(s.m.subsCut.WithLabelValues("resync")); n != 1 {
		t.Errorf("resync cuts = %v, want 1", n)
	}
}

// A watch's selectors reach the cache (deep resumes): only events that can
// concern the watcher are sent, transitions included — an object leaving
// the selection still goes out, for the watcher to see as DELETED.
func TestWatchSelectorsKeepTransitions(t *testing.T) {
	v, _ := testServer(t, newWindow(t, 10), 10, 8)
	_, _, err := watch(t, v, &heraldv1.WatchRequest{Resource: "pods", AfterRevision: 10, LabelSelector: "app in (", FieldSelector: ""})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("malformed selector: %v, want InvalidArgument", err)
	}
	sel, err := request.ParseSelector(pods(t), "a", "app=web", "spec.nodeName=n1")
	if err != nil {
		t.Fatal(err)
	}
	w := &watchSender{sel: sel}
	web, db := heraldv1.SortedPairs(map[string]string{"app": "web"}), heraldv1.SortedPairs(map[string]string{"app": "db"})
	n1, n2 := heraldv1.SortedPairs(map[string]string{"spec.nodeName": "n1"}), heraldv1.SortedPairs(map[string]string{"spec.nodeName": "n2"})
	ev := func(typ heraldv1.EventType, ns string, l, f, pl, pf []*heraldv1.Pair) *heraldv1.Event {
		return &heraldv1.Event{Type: typ, Namespace: ns, Labels: l, Fields: f, PrevLabels: pl, PrevFields: pf}
	}
	for _, c := range []struct {
		name string
		ev   *heraldv1.Event
		want bool
	}{
		{"bookmark", &heraldv1.Event{Type: heraldv1.EventType_BOOKMARK}, true},
		{"added, matching", ev(heraldv1.EventType_ADDED, "a", web, n1, nil, nil), true},
		{"added, other namespace", ev(heraldv1.EventType_ADDED, "b", web, n1, nil, nil), false},
		{"added, other label", ev(heraldv1.EventType_ADDED, "a", db, n1, nil, nil), false},
		{"added, other field", ev(heraldv1.EventType_ADDED, "a", web, n2, nil, nil), false},
		{"modified, entering", ev(heraldv1.EventType_MODIFIED, "a", web, n1, db, n1), true},
		{"modified, leaving by label", ev(heraldv1.EventType_MODIFIED, "a", db, n1, web, n1), true},
		{"modified, leaving by field", ev(heraldv1.EventType_MODIFIED, "a", web, n2, web, n1), true},
		{"modified, never matching", ev(heraldv1.EventType_MODIFIED, "a", db, n1, web, n2), false},
		{"deleted, matching", ev(heraldv1.EventType_DELETED, "a", web, n1, nil, nil), true},
		{"deleted, not matching", ev(heraldv1.EventType_DELETED, "a", db, n1, web, n1), false},
		{"modified, unchanged selection, matching", unchanged(ev(heraldv1.EventType_MODIFIED, "a", web, n1, nil, nil)), true},
		{"modified, unchanged selection, not matching", unchanged(ev(heraldv1.EventType_MODIFIED, "a", db, n1, nil, nil)), false},
	} {
		if got := w.concerns(wireEvent(c.ev)); got != c.want {
			t.Errorf("%s: concerns = %v, want %v", c.name, got, c.want)
		}
	}
}

func unchanged(ev *heraldv1.Event) *heraldv1.Event {
	ev.PrevUnchanged = true
	return ev
}

// A stream that asks for omit_unchanged_prev gets a MODIFIED event whose
// labels and fields did not change without its previous state, which the
// window does not hold either (only the previous object, shared); a stream
// that did not ask gets it made for it, under the event's revision. Every
// other event goes whole. Only a stream that asks with_protobuf gets the
// objects' protobuf. The window's events are never changed.
func TestWatchPrevAndProtobufAsAsked(t *testing.T) {
	rs := newWindow(t, 100)
	apply(t, rs, 11, put("a", "p1"), put("a", "p2"))
	web, db := heraldv1.SortedPairs(map[string]string{"app": "web"}), heraldv1.SortedPairs(map[string]string{"app": "db"})
	prev, err := testPrepare(rs.res, "a", "p1", []byte(`{"metadata":{"name":"p1","namespace":"a","labels":{"app":"web"}}}`), 11)
	if err != nil {
		t.Fatal(err)
	}
	f := heraldv1.SortedPairs(prev.Fields)
	p1 := &heraldv1.Event{Type: heraldv1.EventType_MODIFIED, Revision: 12, Namespace: "a", Name: "p1",
		Object: []byte(`{"new":1}`), Labels: web, Fields: f, ObjectProtobuf: []byte("k8s\x00"), ObservedUnixNano: 7, Traceparent: "tp",
		PrevUnchanged: true}
	p2 := &heraldv1.Event{Type: heraldv1.EventType_MODIFIED, Revision: 12, Namespace: "a", Name: "p2",
		Object: []byte(`{"new":2}`), Labels: db, Fields: f, ObjectProtobuf: []byte("k8s\x00"), ObservedUnixNano: 7, Traceparent: "tp",
		PrevObject: []byte(`{"old":2}`), PrevLabels: web, PrevFields: f}
	window := []*heraldv1.Event{proto.CloneOf(p1), proto.CloneOf(p2)}
	rs.applyRevision(12, []*event{prepared(window[0], prev), prepared(window[1], nil)}, []*kube.Object{nil, nil},
		[]string{rs.res.ObjectKey("a", "p1"), rs.res.ObjectKey("a", "p2")})
	v, _ := testServer(t, rs, 12, 8)

	for _, omit := range []bool{false, true} {
		for _, withProtobuf := range []bool{false, true} {
			_, resps, err := watch(t, v, &heraldv1.WatchRequest{Resource: "pods", AfterRevision: 11, OmitUnchangedPrev: omit, WithProtobuf: withProtobuf})
			if err != nil {
				t.Fatal(err)
			}
			var got []*heraldv1.Event
			for _, r := range resps {
				for _, ev := range r {
					if ev.Type == heraldv1.EventType_MODIFIED {
						got = append(got, ev)
					}
				}
			}
			if len(got) != 2 {
				t.Fatalf("omit %v, protobuf %v: %d MODIFIED events, want 2", omit, withProtobuf, len(got))
			}
			want1, want2 := proto.CloneOf(p1), proto.CloneOf(p2)
			if !omit {
				want1.PrevObject, want1.PrevLabels, want1.PrevFields = prev.WithRev(12), web, f
			}
			if !withProtobuf {
				want1.ObjectProtobuf, want2.ObjectProtobuf = nil, nil
			}
			if !proto.Equal(got[0], want1) {
				t.Errorf("omit %v, protobuf %v, selection unchanged: sent %v, want %v", omit, withProtobuf, got[0], want1)
			}
			if !proto.Equal(got[1], want2) {
				t.Errorf("omit %v, protobuf %v, labels changed: sent %v, want %v", omit, withProtobuf, got[1], want2)
			}
		}
	}
	if !proto.Equal(window[0], p1) || !proto.Equal(window[1], p2) {
		t.Errorf("the window's events changed: %v, %v", window[0], window[1])
	}
}

// A continue token carries the revision of its list's first page, which
// another replica (or another shard) may have served: a replica that has
// not reached that revision waits for it, and never serves its older state
// under the token's revision (objects missing, deleted ones still there).
func TestListContinueWaitsForTheTokensRevision(t *testing.T) {
	rs := newWindow(t, 100)
	apply(t, rs, snapRev+1, put("a", "p1"), put("a", "p3"))
	v, s := testServer(t, rs, snapRev+1, 1)
	fc := clocktesting.NewFakeClock(time.Unix(1, 0))
	WithClock(fc)(s)
	// The first page ended at p1, at snapRev+3, on a replica that had
	// applied the next two revisions.
	tok := rv.After(rs.res.ObjectKey("a", "p1"), snapRev+3).Encode(rs.res.NamespacePrefix(""))
	type result struct {
		resp *heraldv1.ListResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := v.List(t.Context(), &heraldv1.ListRequest{Resource: "pods", Continue: tok, Limit: 10})
		done <- result{resp, err}
	}()
	var r result
	waiting := false
	for !waiting {
		select {
		case r = <-done:
			t.Fatalf("served at once, head %d, token at %d: %v %v", s.Head(), snapRev+3, keysOf(r.resp), r.err)
		default:
			waiting = fc.HasWaiters()
			runtime.Gosched()
		}
	}
	apply(t, rs, snapRev+2, put("a", "p2"))
	s.setHead(snapRev + 2)
	apply(t, rs, snapRev+3, del("a", "p3"))
	s.setHead(snapRev + 3)
	r = <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if got, want := keysOf(r.resp), []string{rs.res.ObjectKey("a", "p2")}; !slices.Equal(got, want) || r.resp.Revision != snapRev+3 {
		t.Fatalf("continued page at %d: %v, want %v at %d", r.resp.Revision, got, want, snapRev+3)
	}

	// A token the shard does not reach in time is refused, never served.
	fc = clocktesting.NewFakeClock(time.Unix(1, 0))
	WithClock(fc)(s)
	tok = rv.After(rs.res.ObjectKey("a", "p1"), snapRev+9).Encode(rs.res.NamespacePrefix(""))
	go func() {
		resp, err := v.List(t.Context(), &heraldv1.ListRequest{Resource: "pods", Continue: tok, Limit: 10})
		done <- result{resp, err}
	}()
	for !fc.HasWaiters() {
		select {
		case r = <-done:
			t.Fatalf("served at once, head %d, token at %d: %v %v", s.Head(), snapRev+9, keysOf(r.resp), r.err)
		default:
			runtime.Gosched()
		}
	}
	fc.Step(s.cfg.WaitTimeout)
	if r = <-done; status.Code(r.err) != codes.DeadlineExceeded {
		t.Fatalf("token never reached: %v %v, want DeadlineExceeded", keysOf(r.resp), r.err)
	}
}

func keysOf(resp *heraldv1.ListResponse) []string {
	if resp == nil {
		return nil
	}
	return resp.Keys
}

// TestListAtRevisionWithLimitIsExact: a paged list at a resourceVersion
// without resourceVersionMatch is exact (kube-apiserver's legacy rule), a
// list without a limit or with NotOlderThan is not, and neither is a GET,
// which takes no limit.
func TestListAtRevisionWithLimitIsExact(t *testing.T) {
	rs := newWindow(t, 100)
	apply(t, rs, snapRev+1, put("a", "p1"))
	apply(t, rs, snapRev+2, put("a", "p2"))
	v, _ := testServer(t, rs, snapRev+2, 1)
	at := fmt.Sprint(snapRev + 1)
	p1, p2 := rs.res.ObjectKey("a", "p1"), rs.res.ObjectKey("a", "p2")
	for _, tc := range []struct {
		name string
		req  *heraldv1.ListRequest
		rev  int64
		keys []string
	}{
		{"limit", &heraldv1.ListRequest{Resource: "pods", ResourceVersion: at, Limit: 10}, snapRev + 1, []string{p1}},
		{"limit exact", &heraldv1.ListRequest{Resource: "pods", ResourceVersion: at, ResourceVersionMatch: "Exact", Limit: 10}, snapRev + 1, []string{p1}},
		{"no limit", &heraldv1.ListRequest{Resource: "pods", ResourceVersion: at}, snapRev + 2, []string{p1, p2}},
		{"limit not older", &heraldv1.ListRequest{Resource: "pods", ResourceVersion: at, ResourceVersionMatch: "NotOlderThan", Limit: 10}, snapRev + 2, []string{p1, p2}},
		{"get with limit", &heraldv1.ListRequest{Resource: "pods", Namespace: "a", Name: "p2", ResourceVersion: at, Limit: 10}, snapRev + 2, []string{p2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := v.List(t.Context(), tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if got := keysOf(resp); !slices.Equal(got, tc.keys) || resp.Revision != tc.rev {
				t.Errorf("at %d: %v, want %v at %d", resp.Revision, got, tc.keys, tc.rev)
			}
		})
	}
}
