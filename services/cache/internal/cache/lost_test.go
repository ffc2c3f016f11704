package cache

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/stream"
)

// The stream deleted under a running shard (an operator's mistake, or NATS
// restarted with memory storage or a wiped store), and created again by
// ingest as a new generation: sequences restart at 1, with a resync
// marker, and changes made meanwhile are in no stream.

// recreate deletes the stream and creates it again as ingest does when it
// finds it gone: the next generation, a floor at the revision before
// etcd's, a resync marker first; h.put then appends with the generation's
// message ids.
func (h *history) recreate(t *testing.T, gen int64) (resync int64) {
	t.Helper()
	if err := h.js.DeleteStream(t.Context(), "HERALD"); err != nil {
		t.Fatal(err)
	}
	resp, err := h.etcd.Get(t.Context(), stream.RevProbeKey)
	if err != nil {
		t.Fatal(err)
	}
	rev := resp.Header.Revision
	g := stream.Generation{Number: gen, ClusterID: resp.Header.ClusterId, FirstRevision: rev, Floor: rev - 1}
	h.st, err = h.js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "HERALD", Subjects: stream.Subjects(), Storage: jetstream.MemoryStorage,
		Metadata: g.SetMetadata(nil)})
	if err != nil {
		t.Fatal(err)
	}
	h.gen = gen
	h.publish(t, stream.SubjectProgress, stream.Resync(rev))
	return rev
}

// putLost writes pod ns/name to etcd only: a change made while the stream
// was gone, which nobody appended.
func (h *history) putLost(t *testing.T, ns, name string) int64 {
	t.Helper()
	resp, err := h.etcd.Put(t.Context(), "/registry/pods/"+ns+"/"+name,
		fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":%q,"namespace":%q},"spec":{"nodeName":"n1"}}`, name, ns), clientv3.WithPrevKV())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// follower is a following watch run aside.
type follower struct {
	st   *watchStream
	done chan error
}

func follow(t *testing.T, v *Server, req *heraldv1.WatchRequest) *follower {
	req.Follow = true
	f := &follower{st: &watchStream{ctx: t.Context(), sent: make(chan *heraldv1.WatchResponse, 1000)}, done: make(chan error, 1)}
	go func() { f.done <- v.Watch(req, f.st) }()
	return f
}

// events waits until the watch has sent events up to revision until (or
// ended) and returns its events as "rev:name", bookmarks left out.
func (f *follower) events(t *testing.T, until int64) ([]string, error) {
	t.Helper()
	var got []string
	deadline := time.After(20 * time.Second)
	for {
		select {
		case r := <-f.st.sent:
			got = append(got, eventRevs(revs(r.Events))...)
			for _, ev := range r.Events {
				if ev.Revision >= until {
					return got, nil
				}
			}
		case err := <-f.done:
			for {
				select {
				case r := <-f.st.sent:
					got = append(got, eventRevs(revs(r.Events))...)
				default:
					return got, err
				}
			}
		case <-deadline:
			t.Fatalf("after 20s, the watch sent %v, not yet revision %d", got, until)
		}
	}
}

func revStrings(revs ...int64) []string {
	out := make([]string, len(revs))
	for i, r := range revs {
		out[i] = fmt.Sprint(r)
	}
	return out
}

func TestStreamLostAndCreatedAgain(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after int // puts appended to the new stream right after its resync marker
	}{
		// The new stream's sequences pass the one the shard's consumer
		// would resume from before the consumer is created again.
		{"past the resume point", 12},
		// They stay below it: a consumer waiting there would wait forever.
		{"short of the resume point", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := startHistory(t)
			for i := range 8 {
				h.put(t, "a", fmt.Sprintf("p%d", i%4), i)
			}
			s, v, _ := startShard(t, h, 0)
			before := s.Head()
			old := follow(t, v, &heraldv1.WatchRequest{Resource: "pods", AfterRevision: before})

			lost := h.putLost(t, "a", "lost")
			resync := h.recreate(t, 2)
			var after []int64
			for i := range tc.after {
				after = append(after, h.put(t, "a", fmt.Sprintf("q%d", i), i))
			}
			last := resync
			if len(after) > 0 {
				last = after[len(after)-1]
			}
			eventually(t, "the shard rebuilt at the new generation's head", func() string {
				if s.Head() < last || s.gen.Load() != 2 || s.Ready() != nil {
					return fmt.Sprintf("head %d (want %d), generation %d, ready: %v", s.Head(), last, s.gen.Load(), s.Ready())
				}
				return ""
			})
			if n := testutil.ToFloat64(s.m.resyncs); n != 1 {
				t.Errorf("herald_cache_resyncs_total = %v, want 1", n)
			}

			// The watch that followed the lost stream is cut and got
			// nothing the lost stream did not hold: no revision after the
			// change nobody appended, as if that change had not happened.
			got, err := old.events(t, last)
			if err == nil {
				t.Fatalf("the watch from before the loss was not cut; it sent %v", got)
			}
			if len(got) > 0 {
				t.Fatalf("the watch from %d sent %v after the stream was lost", before, got)
			}

			// The lost change is served, from etcd.
			list, err := v.List(t.Context(), &heraldv1.ListRequest{Resource: "pods"})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.ContainsFunc(list.Items, func(it []byte) bool { return strings.Contains(string(it), `"name":"lost"`) }) {
				t.Errorf("LIST after the rebuild: %d items, without the change at %d", len(list.Items), lost)
			}
			// Resuming from before the new generation: 410.
			if _, _, err := watch(t, v, &heraldv1.WatchRequest{Resource: "pods", AfterRevision: before}); status.Code(err) != codes.OutOfRange {
				t.Errorf("watch from %d (before the floor %d): %v, want OutOfRange", before, resync-1, err)
			}
			// A watch from the rebuilt state sees every later change
			// once, in order.
			from := s.Head()
			w := follow(t, v, &heraldv1.WatchRequest{Resource: "pods", AfterRevision: from})
			var later []int64
			for i := range 3 {
				later = append(later, h.put(t, "a", fmt.Sprintf("r%d", i), i))
			}
			got, err = w.events(t, later[len(later)-1])
			if want := revStrings(later...); err != nil || !slices.Equal(got, want) {
				t.Errorf("watch from %d: %v, %v; want %v", from, got, err, want)
			}
		})
	}
}
