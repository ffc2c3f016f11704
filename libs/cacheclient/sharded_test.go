package cacheclient

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	clocktesting "k8s.io/utils/clock/testing"

	"herald.dev/libs/cacheclient/cachetest"
	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/rv"
)

const (
	added    = heraldv1.EventType_ADDED
	modified = heraldv1.EventType_MODIFIED
)

// testSharded is pods split over two shards (partitions 0-7: a, 8-15: b),
// everything else on c.
func testSharded(t *testing.T, opts ...Option) (*Sharded, [3]*cachetest.Shard) {
	sp := cachetest.NewSplit(t)
	return New(sp.Reg, sp.Shards, sp.Clients(), opts...), [3]*cachetest.Shard{sp.A, sp.B, sp.C}
}

// namespaceOn returns a namespace whose partition is on shard a (first) or b.
func namespaceOn(first bool) string {
	for i := 0; ; i++ {
		ns := fmt.Sprintf("ns-%d", i)
		if (kube.Partition(ns) < 8) == first {
			return ns
		}
	}
}

func page(rev int64, keys ...string) *heraldv1.ListResponse {
	p := &heraldv1.ListResponse{Revision: rev}
	for _, k := range keys {
		p.Keys = append(p.Keys, k)
		p.Items = append(p.Items, []byte(k))
	}
	return p
}

func count(n int64) *int64 { return &n }

func TestMergePages(t *testing.T) {
	withMore := func(p *heraldv1.ListResponse, remaining *int64) *heraldv1.ListResponse {
		p.Continue, p.RemainingItemCount = "more", remaining
		return p
	}
	tests := []struct {
		name        string
		pages       []*heraldv1.ListResponse
		limit       int64
		ignoreLimit bool
		keys        []string
		cont        string // the key the continue token resumes after; "": none
		remaining   *int64
	}{
		{name: "interleaved, no limit", pages: []*heraldv1.ListResponse{page(9, "/a", "/c", "/e"), page(9, "/b", "/d")},
			keys: []string{"/a", "/b", "/c", "/d", "/e"}},
		{name: "limit cuts across shards", pages: []*heraldv1.ListResponse{page(9, "/a", "/c", "/e"), page(9, "/b", "/d", "/f")}, limit: 3,
			keys: []string{"/a", "/b", "/c"}, cont: "/c"}, // a count only when a shard gave one
		{name: "limit met exactly, nothing left", pages: []*heraldv1.ListResponse{page(9, "/a"), page(9, "/b")}, limit: 2,
			keys: []string{"/a", "/b"}},
		{name: "a shard has more pages, counted", pages: []*heraldv1.ListResponse{withMore(page(9, "/a", "/b"), count(5)), page(9, "/c", "/d")}, limit: 2,
			keys: []string{"/a", "/b"}, cont: "/b", remaining: count(7)},
		{name: "a shard has more pages, uncounted (selectors)", pages: []*heraldv1.ListResponse{page(9, "/a", "/c"), withMore(page(9, "/b", "/d"), nil)}, limit: 2,
			keys: []string{"/a", "/b"}, cont: "/b"},
		{name: "resourceVersion=0 ignores the limit", pages: []*heraldv1.ListResponse{page(9, "/a", "/c"), page(9, "/b")}, limit: 1, ignoreLimit: true,
			keys: []string{"/a", "/b", "/c"}},
		{name: "empty shards", pages: []*heraldv1.ListResponse{page(9), page(9)}, limit: 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := mergePages(tt.pages, tt.limit, tt.ignoreLimit, "/")
			if got.Revision != 9 {
				t.Errorf("revision %d, want the first shard's 9", got.Revision)
			}
			if len(got.Keys) != len(tt.keys) || (len(tt.keys) > 0 && !reflect.DeepEqual(got.Keys, tt.keys)) {
				t.Fatalf("keys %q, want %q", got.Keys, tt.keys)
			}
			for i, it := range got.Items {
				if string(it) != got.Keys[i] {
					t.Fatalf("item %d is %q, its key %q", i, it, got.Keys[i])
				}
			}
			if tt.cont == "" {
				if got.Continue != "" || got.RemainingItemCount != nil {
					t.Fatalf("continue %q remaining %v, want none", got.Continue, got.RemainingItemCount)
				}
				return
			}
			tok, err := rv.DecodeToken(got.Continue, "/")
			if err != nil || tok != rv.After(tt.cont, 9) {
				t.Fatalf("continue token %+v (%v), want after %q at 9", tok, err, tt.cont)
			}
			if (got.RemainingItemCount == nil) != (tt.remaining == nil) || (tt.remaining != nil && *got.RemainingItemCount != *tt.remaining) {
				t.Fatalf("remainingItemCount %v, want %v", got.RemainingItemCount, tt.remaining)
			}
		})
	}
}

func TestListRouting(t *testing.T) {
	ctx := t.Context()
	c, sh := testSharded(t)
	sh[0].ListFunc = func(*heraldv1.ListRequest) (*heraldv1.ListResponse, error) { return page(40, "/p/1", "/p/3"), nil }
	sh[1].ListFunc = func(*heraldv1.ListRequest) (*heraldv1.ListResponse, error) { return page(40, "/p/2"), nil }
	sh[2].ListFunc = func(*heraldv1.ListRequest) (*heraldv1.ListResponse, error) { return page(41, "/n/1"), nil }

	// Cluster-wide over a split resource: the first shard resolves the
	// revision, the second serves exactly it.
	sel := &heraldv1.Selector{Labels: []*heraldv1.Requirement{{Key: "app", Operator: "=", Values: []string{"x"}}}}
	got, err := c.List(ctx, &heraldv1.ListRequest{Resource: "pods", LabelSelector: "app=x", Selector: sel, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"/p/1", "/p/2", "/p/3"}; !reflect.DeepEqual(got.Keys, want) || got.Revision != 40 {
		t.Fatalf("merged %q at %d, want %q at 40", got.Keys, got.Revision, want)
	}
	if r := sh[1].Lists()[0]; r.ResourceVersion != "40" || r.ResourceVersionMatch != string(rv.MatchExact) || r.LabelSelector != "app=x" || !proto.Equal(r.Selector, sel) || r.Limit != 10 {
		t.Fatalf("second shard asked %+v, want exactly revision 40 with the same selectors and limit", r)
	}
	// A continue token carries the revision to every shard; one without a
	// revision (kube-apiserver's for the latest state) gets the first
	// shard's.
	pods, _ := c.reg.ByID("pods")
	prefix := pods.NamespacePrefix("")
	tok := rv.After(prefix+"ns/p1", 40).Encode(prefix)
	if _, err := c.List(ctx, &heraldv1.ListRequest{Resource: "pods", Continue: tok, Limit: 1}); err != nil {
		t.Fatal(err)
	}
	if r := sh[1].Lists()[1]; r.Continue != tok || r.ResourceVersion != "" {
		t.Fatalf("second shard asked %+v, want the continue token", r)
	}
	latest := rv.Token{Start: prefix + "ns/p1\x00"}.Encode(prefix)
	if _, err := c.List(ctx, &heraldv1.ListRequest{Resource: "pods", Continue: latest, Limit: 1}); err != nil {
		t.Fatal(err)
	}
	if r := sh[1].Lists()[2]; r.Continue != tok || r.ResourceVersion != "" {
		t.Fatalf("second shard asked %+v for a token without revision, want the first shard's revision 40", r)
	}
	// One namespace, or an unsplit resource: one shard, the request as is.
	for _, tc := range []struct {
		req   *heraldv1.ListRequest
		shard int
	}{
		{&heraldv1.ListRequest{Resource: "pods", Namespace: namespaceOn(true)}, 0},
		{&heraldv1.ListRequest{Resource: "pods", Namespace: namespaceOn(false)}, 1},
		{&heraldv1.ListRequest{Resource: "nodes"}, 2},
	} {
		before := len(sh[tc.shard].Lists())
		if _, err := c.List(ctx, tc.req); err != nil {
			t.Fatal(err)
		}
		if l := sh[tc.shard].Lists(); len(l) != before+1 || l[before] != tc.req {
			t.Fatalf("%+v did not go, unchanged, to shard %d", tc.req, tc.shard)
		}
	}
	if n := len(sh[0].Lists()) + len(sh[1].Lists()); n != 8 {
		t.Fatalf("%d LISTs on the pods shards, want 8", n)
	}
	if _, err := c.List(ctx, &heraldv1.ListRequest{Resource: "widgets"}); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown resource: %v, want NotFound", err)
	}
}

func TestMergeRelease(t *testing.T) {
	m := newMerge(2)
	ev := func(rev int64) *heraldv1.Event { return cachetest.Event(modified, rev, "x") }
	m.add(0, []*heraldv1.Event{ev(3), ev(5), ev(8)}, 8)
	m.add(1, []*heraldv1.Event{ev(4), ev(5)}, 5)
	if got := revisions(m.release(nil)); !reflect.DeepEqual(got, []int64{3, 4, 5, 5}) || m.safe() != 5 {
		t.Fatalf("released %v (safe %d), want [3 4 5 5] through 5", got, m.safe())
	}
	if got := m.release(nil); len(got) != 0 {
		t.Fatalf("released %v again", revisions(got))
	}
	m.add(1, nil, 9) // progress without events
	if got := revisions(m.release(nil)); !reflect.DeepEqual(got, []int64{8}) || m.safe() != 8 {
		t.Fatalf("released %v (safe %d), want [8] through 8", got, m.safe())
	}
}

func revisions(evs []*heraldv1.Event) []int64 {
	var out []int64
	for _, ev := range evs {
		out = append(out, ev.Revision)
	}
	return out
}

// shape is a response as "rev" per event, "b<rev>" per bookmark.
func shape(resp *heraldv1.WatchResponse) []string {
	var out []string
	for _, ev := range resp.Events {
		if ev.Type == heraldv1.EventType_BOOKMARK {
			out = append(out, fmt.Sprintf("b%d", ev.Revision))
		} else {
			out = append(out, fmt.Sprint(ev.Revision))
		}
	}
	return out
}

func recvShape(t *testing.T, st interface {
	Recv() (*heraldv1.WatchResponse, error)
}, want ...string) {
	t.Helper()
	resp, err := st.Recv()
	if err != nil {
		t.Fatalf("Recv: %v, want %v", err, want)
	}
	if got := shape(resp); !reflect.DeepEqual(got, want) {
		t.Fatalf("received %v, want %v", got, want)
	}
}

func TestFollowMergesShardsByRevision(t *testing.T) {
	c, sh := testSharded(t)
	st, err := c.Watch(t.Context(), &heraldv1.WatchRequest{Resource: "pods", Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	a, b := <-sh[0].Watches, <-sh[1].Watches
	if !a.Req.Follow || a.Req.AfterRevision != 0 || !b.Req.Follow || b.Req.AfterRevision != 0 {
		t.Fatalf("shards asked %+v, %+v; want following from now", a.Req, b.Req)
	}
	// Each shard opens at its own revision; the merged stream is complete
	// after the latest.
	a.Send(cachetest.Bookmark(10))
	b.Send(cachetest.Bookmark(12))
	recvShape(t, st, "b12")

	// a runs ahead; b lags: nothing past b's 12 can go out yet (and 11 is
	// before the merged start).
	a.Send(cachetest.Event(modified, 11, "x"), cachetest.Event(modified, 13, "x"), cachetest.Event(added, 15, "y"))
	b.Send(cachetest.Event(modified, 14, "z"))
	recvShape(t, st, "13", "14")

	// b's progress releases a's 15; a bookmark says how far it is complete.
	b.Send(cachetest.Bookmark(20))
	recvShape(t, st, "15")
	a.Send(cachetest.Bookmark(20))
	recvShape(t, st, "b20")

	// Events of one revision on both shards go out together, by shard.
	b.Send(cachetest.Event(modified, 21, "z"), cachetest.Bookmark(22))
	a.Send(cachetest.Event(modified, 21, "x"), cachetest.Bookmark(23))
	recvShape(t, st, "21", "21", "b22")
}

// followBoth opens a following watch of pods over shards a and b, both
// started at revision 10; it returns the stream, the shards and their
// watches.
func followBoth(t *testing.T, opts ...Option) (grpc.ServerStreamingClient[heraldv1.WatchResponse], [3]*cachetest.Shard, *cachetest.Watch, *cachetest.Watch) {
	t.Helper()
	c, sh := testSharded(t, opts...)
	st, err := c.Watch(t.Context(), &heraldv1.WatchRequest{Resource: "pods", Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	a, b := <-sh[0].Watches, <-sh[1].Watches
	a.Send(cachetest.Bookmark(10))
	b.Send(cachetest.Bookmark(10))
	recvShape(t, st, "b10")
	return st, sh, a, b
}

func TestFollowResumesABrokenShard(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	st, sh, a, b := followBoth(t, WithClock(clk))
	a.Send(cachetest.Event(modified, 11, "x"), cachetest.Bookmark(14))
	b.Send(cachetest.Event(modified, 12, "z"))
	recvShape(t, st, "11", "12")

	// b's stream breaks: it is reopened after its own progress once the
	// pause has passed, and nothing is lost or repeated.
	b.Fail(status.Error(codes.Unavailable, "replica gone"))
	next := make(chan []string, 1)
	go func() {
		resp, err := st.Recv()
		if err != nil {
			next <- []string{err.Error()}
			return
		}
		next <- shape(resp)
	}()
	for !clk.HasWaiters() {
		runtime.Gosched() // the resume is waiting for the pause
	}
	clk.Step(resumePause)
	b2 := <-sh[1].Watches
	if !b2.Req.Follow || b2.Req.AfterRevision != 12 {
		t.Fatalf("resumed with %+v, want following after 12", b2.Req)
	}
	b2.Send(cachetest.Bookmark(12)) // the opening bookmark of a resume
	b2.Send(cachetest.Event(modified, 13, "z"), cachetest.Bookmark(16))
	if got := <-next; !reflect.DeepEqual(got, []string{"13", "b14"}) {
		t.Fatalf("received %v, want [13 b14]", got)
	}

	// A shard that cannot resume ends the merged stream.
	a.Fail(status.Error(codes.OutOfRange, "too old"))
	if _, err := st.Recv(); status.Code(err) != codes.OutOfRange {
		t.Fatalf("Recv: %v, want OutOfRange", err)
	}
}

func TestFollowFromARevision(t *testing.T) {
	c, sh := testSharded(t)
	st, err := c.Watch(t.Context(), &heraldv1.WatchRequest{Resource: "pods", Follow: true, AfterRevision: 30})
	if err != nil {
		t.Fatal(err)
	}
	recvShape(t, st, "b30")
	a, b := <-sh[0].Watches, <-sh[1].Watches
	if a.Req.AfterRevision != 30 || b.Req.AfterRevision != 30 {
		t.Fatalf("shards asked %+v, %+v; want after 30", a.Req, b.Req)
	}
	a.Send(cachetest.Bookmark(30), cachetest.Event(modified, 31, "x"), cachetest.Bookmark(33))
	b.Send(cachetest.Bookmark(30), cachetest.Event(modified, 32, "z"), cachetest.Bookmark(32))
	recvShape(t, st, "31", "32")
}

// scripted answers every watch on a shard with fn's events, then ends it.
func scripted(fn func(*heraldv1.WatchRequest) []*heraldv1.Event) func(*cachetest.Watch) {
	return func(w *cachetest.Watch) {
		w.Send(fn(w.Req)...)
		w.End()
	}
}

func TestReplayMergesUpToWhatEveryShardPassed(t *testing.T) {
	c, sh := testSharded(t)
	sh[0].OnWatch = scripted(func(req *heraldv1.WatchRequest) []*heraldv1.Event {
		return []*heraldv1.Event{cachetest.Bookmark(req.AfterRevision), cachetest.Event(modified, 6, "x"), cachetest.Event(modified, 8, "x"), cachetest.Bookmark(9)}
	})
	sh[1].OnWatch = scripted(func(req *heraldv1.WatchRequest) []*heraldv1.Event {
		return []*heraldv1.Event{cachetest.Bookmark(req.AfterRevision), cachetest.Event(modified, 7, "z"), cachetest.Event(modified, 10, "z"), cachetest.Bookmark(10)}
	})
	st, err := c.Watch(t.Context(), &heraldv1.WatchRequest{Resource: "pods", AfterRevision: 5})
	if err != nil {
		t.Fatal(err)
	}
	recvShape(t, st, "6", "7", "8", "b9") // 10: shard a has not passed it
	if _, err := st.Recv(); err == nil || err.Error() != "EOF" {
		t.Fatalf("Recv after the replay: %v, want EOF", err)
	}
}

func TestStateIsOneRevisionAcrossShards(t *testing.T) {
	c, sh := testSharded(t)
	var second *heraldv1.WatchRequest
	sh[0].OnWatch = scripted(func(req *heraldv1.WatchRequest) []*heraldv1.Event {
		if req.InitialEvents {
			return []*heraldv1.Event{cachetest.Event(added, 3, "a"), cachetest.Event(added, 5, "c"), cachetest.Bookmark(9), cachetest.Event(modified, 10, "a")}
		}
		return []*heraldv1.Event{cachetest.Bookmark(req.AfterRevision), cachetest.Bookmark(11)}
	})
	sh[1].OnWatch = scripted(func(req *heraldv1.WatchRequest) []*heraldv1.Event {
		if req.InitialEvents {
			second = req
			return []*heraldv1.Event{cachetest.Event(added, 4, "b"), cachetest.Bookmark(req.StateRevision)}
		}
		return []*heraldv1.Event{cachetest.Bookmark(req.AfterRevision), cachetest.Event(modified, 10, "b"), cachetest.Bookmark(11)}
	})
	st, err := c.Watch(t.Context(), &heraldv1.WatchRequest{Resource: "pods", InitialEvents: true, Consistent: true,
		LabelSelector: "app=web", FieldSelector: "spec.nodeName=n1", OmitUnchangedPrev: true})
	if err != nil {
		t.Fatal(err)
	}
	recvShape(t, st, "3", "5")
	recvShape(t, st, "4")
	if second.StateRevision != 9 || second.Consistent || second.LabelSelector != "app=web" || second.FieldSelector != "spec.nodeName=n1" || !second.OmitUnchangedPrev {
		t.Fatalf("second shard asked %+v, want the state exactly at 9 under the watcher's selectors and omit_unchanged_prev", second)
	}
	recvShape(t, st, "b9")
	recvShape(t, st, "10", "b11") // then what follows, merged
}

func TestOneShardPassesThrough(t *testing.T) {
	c, sh := testSharded(t)
	var got *heraldv1.WatchRequest
	sh[1].OnWatch = func(w *cachetest.Watch) { got = w.Req; w.End() }
	req := &heraldv1.WatchRequest{Resource: "pods", Namespace: namespaceOn(false), AfterRevision: 3}
	if _, err := c.Watch(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if got != req {
		t.Fatalf("shard b got %+v, want the request unchanged", got)
	}
}

// TestFollowBoundsWhatALaggingShardHoldsBack: with one shard stalled and
// the other flooding, the merge holds the flood back only up to its limits
// (events, then bytes); past them the merged stream ends with a LagError
// (ResourceExhausted) naming the lagging shard, instead of growing.
func TestFollowBoundsWhatALaggingShardHoldsBack(t *testing.T) {
	events := func(from, to int64) []*heraldv1.Event {
		var out []*heraldv1.Event
		for rev := from; rev <= to; rev++ {
			out = append(out, cachetest.Event(modified, rev, "x"))
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		limits MergeLimits
	}{
		{"events", MergeLimits{Events: 50, Bytes: 1 << 30}},
		{"bytes", MergeLimits{Events: 1 << 30, Bytes: 50 * int64(len(cachetest.Event(modified, 1, "x").Object))}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, _, a, b := followBoth(t, WithMergeLimits(tc.limits))
			// Within the limits, a's events wait for b and are released
			// when b catches up.
			a.Send(events(11, 50)...)
			b.Send(cachetest.Bookmark(50))
			resp, err := st.Recv()
			if err != nil || len(resp.Events) != 40 || resp.Events[39].Revision != 50 {
				t.Fatalf("after b caught up: %v %v, want the 40 events through 50", shape(resp), err)
			}
			// b stalls at 50; a floods past the limits.
			a.Send(events(51, 100)...)
			a.Send(events(101, 110)...)
			_, err = st.Recv()
			var lag *LagError
			if !errors.As(err, &lag) || status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("Recv: %v, want a LagError", err)
			}
			if lag.Shard != 1 || lag.Through != 50 || lag.Head != 110 || lag.Events <= 50 && lag.Bytes <= tc.limits.Bytes {
				t.Fatalf("lag %+v: want shard 1 at 50, a at 110, past the limits", lag)
			}
			if _, err := st.Recv(); !errors.As(err, &lag) {
				t.Fatalf("the stream did not stay ended: %v", err)
			}
		})
	}
}

// TestFollowBoundsBeforeEveryShardStarted: a shard that never opens its
// stream holds the others' events back too; the same limits end the merge.
func TestFollowBoundsBeforeEveryShardStarted(t *testing.T) {
	c, sh := testSharded(t, WithMergeLimits(MergeLimits{Events: 10, Bytes: 1 << 30}))
	st, err := c.Watch(t.Context(), &heraldv1.WatchRequest{Resource: "pods", Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := <-sh[0].Watches, <-sh[1].Watches
	a.Send(cachetest.Bookmark(10))
	for rev := int64(11); rev <= 21; rev++ { // b never opens
		a.Send(cachetest.Event(modified, rev, "x"))
	}
	var lag *LagError
	if _, err := st.Recv(); !errors.As(err, &lag) || lag.Shard != 1 || lag.Events != 11 {
		t.Fatalf("Recv: %v, want a LagError for shard 1 with 11 events held", err)
	}
}

// A replay (a deep resume may be the stream's whole history) is streamed:
// merged responses go out while the shards are still sending, each shard
// read only as far as the merge needs, and the request's selectors reach
// every shard.
func TestReplayStreamsAndCarriesSelectors(t *testing.T) {
	c, sh := testSharded(t)
	const n = 1000
	var reqs [2]*heraldv1.WatchRequest
	for i, name := range []string{"x", "z"} {
		sh[i].OnWatch = func(w *cachetest.Watch) {
			reqs[i] = w.Req
			go func() {
				w.Send(cachetest.Bookmark(w.Req.AfterRevision))
				for rev := range int64(n) {
					w.Send(cachetest.Event(modified, 2*(10+rev)+int64(i), name)) // interleaved
				}
				// Never ends: the replay must not wait for the end to
				// release what both shards have passed.
			}()
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second) // a replay that collects first never answers
	defer cancel()
	sel := &heraldv1.Selector{Labels: []*heraldv1.Requirement{{Key: "app", Operator: "=", Values: []string{"web"}}}}
	st, err := c.Watch(ctx, &heraldv1.WatchRequest{Resource: "pods", AfterRevision: 5, LabelSelector: "app=web", FieldSelector: "spec.nodeName=n1",
		Selector: sel, OmitUnchangedPrev: true, WithProtobuf: true})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Events) < 256 || resp.Events[0].Revision != 20 {
		t.Fatalf("first response: %d events from %d, want at least %d from 20", len(resp.Events), resp.Events[0].Revision, 256)
	}
	for i, r := range reqs {
		if r.LabelSelector != "app=web" || r.FieldSelector != "spec.nodeName=n1" || !proto.Equal(r.Selector, sel) || r.AfterRevision != 5 ||
			!r.OmitUnchangedPrev || !r.WithProtobuf {
			t.Errorf("shard %d asked %+v, want the selectors, after 5, omit_unchanged_prev and with_protobuf", i, r)
		}
	}
}

// A replay asks the shards in order, each once the one before has answered
// (a deep replay answers once it holds its slot): replays running side by
// side then take the caches' bounded replay slots in one order, and none
// can hold one shard's slot while queued for another's held by a replay
// that waits for it.
func TestReplayAsksShardsInOrder(t *testing.T) {
	sp := cachetest.NewSplit(t)
	var bAsked atomic.Bool
	var askedBeforeA atomic.Bool
	sp.A.OnWatch = scripted(func(req *heraldv1.WatchRequest) []*heraldv1.Event {
		return []*heraldv1.Event{cachetest.Bookmark(req.AfterRevision), cachetest.Event(modified, 6, "x"), cachetest.Bookmark(9)}
	})
	sp.B.OnWatch = scripted(func(req *heraldv1.WatchRequest) []*heraldv1.Event {
		bAsked.Store(true)
		return []*heraldv1.Event{cachetest.Bookmark(req.AfterRevision), cachetest.Event(modified, 7, "z"), cachetest.Bookmark(9)}
	})
	clients := sp.Clients()
	clients["a"] = onFirstRecv{CacheClient: sp.A, fn: func() { askedBeforeA.Store(bAsked.Load()) }}
	c := New(sp.Reg, sp.Shards, clients)
	st, err := c.Watch(t.Context(), &heraldv1.WatchRequest{Resource: "pods", AfterRevision: 5})
	if err != nil {
		t.Fatal(err)
	}
	recvShape(t, st, "6", "7", "b9")
	if askedBeforeA.Load() {
		t.Error("shard b was asked before shard a had answered")
	}
}

// onFirstRecv calls fn as its watch streams' first Recv starts.
type onFirstRecv struct {
	heraldv1.CacheClient
	fn func()
}

func (c onFirstRecv) Watch(ctx context.Context, req *heraldv1.WatchRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[heraldv1.WatchResponse], error) {
	st, err := c.CacheClient.Watch(ctx, req, opts...)
	if err != nil {
		return nil, err
	}
	return &firstRecvStream{ServerStreamingClient: st, fn: c.fn}, nil
}

type firstRecvStream struct {
	grpc.ServerStreamingClient[heraldv1.WatchResponse]
	fn   func()
	once sync.Once
}

func (s *firstRecvStream) Recv() (*heraldv1.WatchResponse, error) {
	s.once.Do(s.fn)
	return s.ServerStreamingClient.Recv()
}
