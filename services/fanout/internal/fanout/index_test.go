package fanout

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"herald.dev/libs/kube"
	"herald.dev/libs/kube/request"
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

func podsResource(t testing.TB) *kube.Resource {
	reg, err := kube.NewRegistry(kube.DefaultPrefix, kube.DefaultResources())
	if err != nil {
		t.Fatal(err)
	}
	r, _ := reg.ByID("pods")
	return r
}

func TestWatcherIndex(t *testing.T) {
	pods := podsResource(t)
	mk := func(name, ns, fieldSel string) *watcher {
		sel, err := request.ParseSelector(pods, ns, "", fieldSel)
		if err != nil {
			t.Fatal(err)
		}
		w := newWatcher(sel, 1, 1)
		w.reason = name // a label for the test
		return w
	}
	x := newWatcherIndex()
	ws := []*watcher{
		mk("all", "", ""),
		mk("all-labels", "", "status.phase=Running"),
		mk("ns-a", "a", ""),
		mk("ns-b", "b", ""),
		mk("node-1", "", "spec.nodeName=n1"),
		mk("node-2", "", "spec.nodeName=n2"),
		mk("node-1-in-a", "a", "spec.nodeName=n1"),
		mk("unscheduled", "", "spec.nodeName="),
	}
	for _, w := range ws {
		x.add(w)
	}
	visit := func(ev *heraldv1.Event) string {
		var got []string
		x.each(ev, func(w *watcher) { got = append(got, w.reason) })
		sort.Strings(got)
		return fmt.Sprint(got)
	}
	cases := []struct {
		ev   *heraldv1.Event
		want string
	}{
		{&heraldv1.Event{Namespace: "a", Fields: heraldv1.SortedPairs(map[string]string{"spec.nodeName": "n1"})}, "[all all-labels node-1 node-1-in-a ns-a]"},
		{&heraldv1.Event{Namespace: "b", Fields: heraldv1.SortedPairs(map[string]string{"spec.nodeName": "n2"}), PrevFields: heraldv1.SortedPairs(map[string]string{"spec.nodeName": "n1"})},
			"[all all-labels node-1 node-1-in-a node-2 ns-b]"},
		{&heraldv1.Event{Namespace: "c", Fields: heraldv1.SortedPairs(map[string]string{"spec.nodeName": ""})}, "[all all-labels unscheduled]"},
		{&heraldv1.Event{Namespace: "c"}, "[all all-labels]"},
	}
	for _, c := range cases {
		if got := visit(c.ev); got != c.want {
			t.Errorf("event %v visits %s, want %s", c.ev, got, c.want)
		}
	}
	for _, w := range ws {
		x.remove(w)
	}
	if x.n != 0 || len(x.all) != 0 || len(x.byNS) != 0 || len(x.byNode) != 0 {
		t.Fatalf("index not empty after removing everything: %+v", x)
	}
}

// A MODIFIED event that comes without its previous state (prev_unchanged)
// reaches the watchers its object matches as MODIFIED, never as ADDED, and
// no other watcher: the previous state selected alike.
func TestDispatchPrevUnchanged(t *testing.T) {
	pods := podsResource(t)
	h := newHub(pods, nil, ringLimits{events: 16, bytes: 1 << 30}, slog.New(slog.NewTextHandler(io.Discard, nil)), newMetrics(prometheus.NewRegistry()), clock.RealClock{})
	mk := func(ls, fs string) *watcher {
		sel, err := request.ParseSelector(pods, "", ls, fs)
		if err != nil {
			t.Fatal(err)
		}
		w := newWatcher(sel, 4, 1<<20)
		h.watchers.add(w)
		return w
	}
	all, web, db, n1, n2 := mk("", ""), mk("app=web", ""), mk("app=db", ""), mk("", "spec.nodeName=n1"), mk("", "spec.nodeName=n2")
	h.mu.Lock()
	n := h.dispatch(newItem(&heraldv1.Event{Type: heraldv1.EventType_MODIFIED, Revision: 5, Namespace: "default", Name: "p",
		Object: []byte(`{"kind":"Pod"}`), Labels: heraldv1.SortedPairs(map[string]string{"app": "web"}),
		Fields: heraldv1.SortedPairs(map[string]string{"metadata.name": "p", "metadata.namespace": "default", "spec.nodeName": "n1"}), PrevUnchanged: true}))
	h.mu.Unlock()
	if n != 3 {
		t.Errorf("queued to %d watchers, want 3", n)
	}
	for name, c := range map[string]struct {
		w    *watcher
		want []request.Transition
	}{"all": {all, []request.Transition{request.AsModified}}, "app=web": {web, []request.Transition{request.AsModified}},
		"app=db": {db, nil}, "node n1": {n1, []request.Transition{request.AsModified}}, "node n2": {n2, nil}} {
		var got []request.Transition
		for _, q := range c.w.take(nil) {
			got = append(got, q.t)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: transitions %v, want %v", name, got, c.want)
		}
	}
}

// BenchmarkDispatchKubelets dispatches pod events to 5,000 kubelet-like
// watchers, one node each: "indexed" selects with spec.nodeName (the index
// finds the one watcher), "linear" selects the same pods with a label
// selector (every watcher is tested, as kube-apiserver does for labels).
func BenchmarkDispatchKubelets(b *testing.B) {
	pods := podsResource(b)
	const nodes = 5000
	for _, mode := range []string{"indexed", "linear"} {
		b.Run(mode, func(b *testing.B) {
			h := newHub(pods, nil, ringLimits{events: 1024, bytes: 1 << 30}, slog.New(slog.NewTextHandler(io.Discard, nil)), newMetrics(prometheus.NewRegistry()), clock.RealClock{})
			ws := make([]*watcher, nodes)
			for i := range nodes {
				fs, ls := fmt.Sprintf("spec.nodeName=node-%d", i), ""
				if mode == "linear" {
					fs, ls = "", fmt.Sprintf("node=node-%d", i)
				}
				sel, err := request.ParseSelector(pods, "", ls, fs)
				if err != nil {
					b.Fatal(err)
				}
				ws[i] = newWatcher(sel, 4, 1<<20)
				h.watchers.add(ws[i])
			}
			obj := []byte(`{"kind":"Pod"}`)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				node := fmt.Sprintf("node-%d", i%nodes)
				ev := &heraldv1.Event{Type: heraldv1.EventType_MODIFIED, Revision: int64(i + 1), Namespace: "default", Name: "p", Object: obj,
					Fields: heraldv1.SortedPairs(map[string]string{"spec.nodeName": node}), PrevFields: heraldv1.SortedPairs(map[string]string{"spec.nodeName": node}),
					Labels: heraldv1.SortedPairs(map[string]string{"node": node}), PrevLabels: heraldv1.SortedPairs(map[string]string{"node": node})}
				h.mu.Lock()
				if n := h.dispatch(newItem(ev)); n != 1 {
					b.Fatalf("queued to %d watchers, want 1", n)
				}
				h.mu.Unlock()
				if got := ws[i%nodes].take(nil); len(got) != 1 {
					b.Fatalf("watcher has %d queued", len(got))
				}
			}
		})
	}
}
