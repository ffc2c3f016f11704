package checker

import (
	"fmt"
	"reflect"
	"testing"

	heraldv1 "herald.dev/libs/proto/herald/v1"
)

func put(rev int64, key, value string) Change { return Change{Rev: rev, Key: key, Value: value} }
func del(rev int64, key string) Change        { return Change{Rev: rev, Key: key, Delete: true} }

// rec is stream message seq holding part of revision rev's changes.
func rec(seq uint64, rev int64, part, parts uint32, changes ...Change) Record {
	r := &heraldv1.Record{Revision: rev, Part: part, Parts: parts}
	for _, c := range changes {
		kind := heraldv1.Change_PUT
		if c.Delete {
			kind = heraldv1.Change_DELETE
		}
		r.Changes = append(r.Changes, &heraldv1.Change{Kind: kind, Key: c.Key, Value: []byte(c.Value)})
	}
	return Record{Seq: seq, Record: r}
}

func progress(seq uint64, rev int64) Record {
	return Record{Seq: seq, Record: &heraldv1.Record{Revision: rev, Progress: true, Parts: 1}}
}

func resync(seq uint64, rev int64) Record {
	return Record{Seq: seq, Record: &heraldv1.Record{Revision: rev, Resync: true, Parts: 1}}
}

// errorStrings turns a report into its messages, nil for none.
func errorStrings(errs []error) []string {
	var out []string
	for _, err := range errs {
		out = append(out, err.Error())
	}
	return out
}

func TestStreamChanges(t *testing.T) {
	a, b, c := put(0, "/p/a", "a"), put(0, "/p/b", "b"), put(0, "/p/c", "c")
	at := func(rev int64, ch Change) Change { ch.Rev = rev; return ch }
	cases := []struct {
		name    string
		recs    []Record
		changes []Change
		errs    []string
	}{
		{"empty", nil, nil, nil},
		{"clean, with a split revision and markers",
			[]Record{rec(1, 5, 0, 1, a), progress(2, 5), rec(3, 6, 0, 2, b), rec(4, 6, 1, 2, c), resync(5, 6), progress(6, 7), rec(7, 8, 0, 1, del(0, "/p/a"))},
			[]Change{at(5, a), at(6, b), at(6, c), del(8, "/p/a")}, nil},
		{"reordered",
			[]Record{rec(1, 6, 0, 1, b), rec(2, 5, 0, 1, a)},
			[]Change{at(6, b), at(5, a)},
			[]string{"seq 2: revision 5 after 6 (reordered)"}},
		{"a message written twice",
			[]Record{rec(1, 5, 0, 1, a), rec(2, 5, 0, 1, a)},
			[]Change{at(5, a), at(5, a)},
			[]string{"seq 2: revision 5 part 0 after part 0 (duplicate)"}},
		{"a revision written again later",
			[]Record{rec(1, 5, 0, 1, a), rec(2, 7, 0, 1, b), rec(3, 5, 0, 1, a), rec(4, 7, 0, 1, b)},
			[]Change{at(5, a), at(7, b), at(5, a), at(7, b)},
			[]string{"seq 3: revision 5 after 7 (reordered)", "seq 4: revision 7 appears twice"}},
		{"a split revision cut short",
			[]Record{rec(1, 5, 0, 2, a), rec(2, 6, 0, 1, b)},
			[]Change{at(5, a), at(6, b)},
			[]string{"seq 2: revision 5 ended at part 0 of 2"}},
		{"a split revision missing its first part",
			[]Record{rec(1, 5, 1, 2, a), rec(2, 6, 0, 1, b)},
			[]Change{at(5, a), at(6, b)},
			[]string{"seq 1: revision 5 starts at part 1"}},
		{"a part skipped",
			[]Record{rec(1, 5, 0, 3, a), rec(2, 5, 2, 3, b)},
			[]Change{at(5, a), at(5, b)},
			[]string{"seq 2: revision 5 part 2 after part 0 (a part lost)"}},
		{"markers going back",
			[]Record{rec(1, 6, 0, 1, a), progress(2, 5), resync(3, 4)},
			[]Change{at(6, a)},
			[]string{"seq 2: progress or resync 5 after revision 6", "seq 3: progress or resync 4 after revision 6"}},
		{"the last revision still being written",
			[]Record{rec(1, 5, 0, 1, a), rec(2, 6, 0, 2, b)},
			[]Change{at(5, a), at(6, b)}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			changes, errs := StreamChanges(c.recs)
			if !reflect.DeepEqual(changes, c.changes) {
				t.Errorf("changes %v, want %v", changes, c.changes)
			}
			if got := errorStrings(errs); !reflect.DeepEqual(got, c.errs) {
				t.Errorf("errors %q, want %q", got, c.errs)
			}
		})
	}
}

func TestResyncs(t *testing.T) {
	recs := []Record{rec(1, 5, 0, 1, put(0, "/p/a", "a")), resync(2, 6), progress(3, 7), resync(4, 9)}
	if got := Resyncs(recs); !reflect.DeepEqual(got, []int64{6, 9}) {
		t.Errorf("Resyncs = %v, want [6 9]", got)
	}
}

// history is etcd's history under /p/ with the revisions 7 and 10 spent
// outside it and a transaction at 8.
var history = []Change{
	put(5, "/p/a", "a1"),
	put(6, "/p/b", "b1"),
	put(8, "/p/c", "c1"),
	put(8, "/p/b", "b2"),
	put(9, "/p/a", "a2"),
	del(11, "/p/a"),
}

// edit returns base with the entries at the given indexes replaced by the
// given lists (nil removes one).
func edit[T any](base []T, edits map[int][]T) []T {
	var out []T
	for i, e := range base {
		if r, ok := edits[i]; ok {
			out = append(out, r...)
			continue
		}
		out = append(out, e)
	}
	return out
}

func TestCompare(t *testing.T) {
	h := history
	with := func(edits map[int][]Change) []Change { return edit(h, edits) }
	var long []Change
	for i := range 30 {
		long = append(long, put(int64(i+1), "/p/x", "v"))
	}
	checkReports(t, Compare, []reportCase[Change]{
		{"equal", h, h, nil},
		{"both empty", nil, nil, nil},
		{"lost", h, with(map[int][]Change{1: nil}), []string{"lost: 6 PUT /p/b"}},
		{"lost at the end", h, h[:5], []string{"lost: 11 DELETE /p/a"}},
		{"lost from a transaction", h, with(map[int][]Change{2: nil}), []string{"lost: 8 PUT /p/c"}},
		{"nothing", h[:2], nil, []string{"lost: 5 PUT /p/a", "lost: 6 PUT /p/b"}},
		{"duplicate", h, with(map[int][]Change{1: {h[1], h[1]}}), []string{"duplicate in stream: 6 PUT /p/b"}},
		{"duplicate at the end", h, append(h[:6:6], h[5]), []string{"duplicate in stream: 11 DELETE /p/a"}},
		{"duplicate in a transaction", h, with(map[int][]Change{2: {h[2], h[2]}}), []string{"duplicate in stream: 8 PUT /p/c"}},
		{"a revision etcd does not have", h, with(map[int][]Change{1: {h[1], put(7, "/p/x", "x")}}), []string{"extra in stream: 7 PUT /p/x"}},
		{"a key etcd did not change at that revision", h, with(map[int][]Change{3: {h[3], put(8, "/p/x", "x")}}), []string{"extra in stream: 8 PUT /p/x"}},
		{"after the end", h, append(h[:6:6], put(12, "/p/x", "x")), []string{"extra in stream: 12 PUT /p/x"}},
		{"reordered", h, with(map[int][]Change{0: {h[1]}, 1: {h[0]}}), []string{"lost: 5 PUT /p/a", "extra in stream: 5 PUT /p/a"}},
		{"reordered within a transaction", h, with(map[int][]Change{2: {h[3]}, 3: {h[2]}}), []string{"lost: 8 PUT /p/c", "extra in stream: 8 PUT /p/c"}},
		{"another value", h, with(map[int][]Change{4: {put(9, "/p/a", "a2-stale")}}), []string{`different: etcd has 9 PUT /p/a "a2", stream has 9 PUT /p/a "a2-stale"`}},
		{"a put for a delete", h, with(map[int][]Change{5: {put(11, "/p/a", "a3")}}), []string{`different: etcd has 11 DELETE /p/a "", stream has 11 PUT /p/a "a3"`}},
		{"a long value is cut", h[:1], []Change{put(5, "/p/a", fmt.Sprintf("%0100d", 1))}, []string{fmt.Sprintf(`different: etcd has 5 PUT /p/a "a1", stream has 5 PUT /p/a "%080d"`, 0)}},
		{"a long report stops", long, nil, append(repeat(20, func(i int) string { return fmt.Sprintf("lost: %d PUT /p/x", i+1) }), "... more differences")},
	})
}

// reportCase is a history seen (got) against the one that must be seen
// (want), and the report a check must give, message for message.
type reportCase[T any] struct {
	name      string
	want, got []T
	report    []string
}

func checkReports[T any](t *testing.T, check func(want, got []T) []error, cases []reportCase[T]) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := errorStrings(check(c.want, c.got)); !reflect.DeepEqual(got, c.report) {
				t.Errorf("report %q, want %q", got, c.report)
			}
		})
	}
}

func repeat(n int, f func(int) string) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = f(i)
	}
	return out
}

func TestExpectedEvents(t *testing.T) {
	hist := []Change{
		put(5, "/registry/pods/ns1/a", "{}"),
		put(6, "/registry/pods/ns1/old", "{}"),
		put(7, "/registry/podtemplates/ns1/t", "{}"), // another resource sharing the prefix's start
		put(8, "/registry/pods/ns2/b", "{}"),
		del(9, "/registry/pods/ns1/a"),
		put(10, "/registry/pods/ns1/a", "{}"),
		put(10, "/registry/pods/ns1/a2", "{}"),
		del(11, "/registry/pods/ns1/old"),
	}
	existed := map[string]bool{"/registry/pods/ns1/old": true}
	cases := []struct {
		name   string
		prefix string
		want   []WatchEvent
	}{
		{"a resource", "/registry/pods/", []WatchEvent{
			{"ADDED", "ns1/a", 5}, {"MODIFIED", "ns1/old", 6}, {"ADDED", "ns2/b", 8},
			{"DELETED", "ns1/a", 9}, {"ADDED", "ns1/a", 10}, {"ADDED", "ns1/a2", 10}, {"DELETED", "ns1/old", 11},
		}},
		{"a namespace", "/registry/pods/ns1/", []WatchEvent{
			{"ADDED", "a", 5}, {"MODIFIED", "old", 6}, {"DELETED", "a", 9}, {"ADDED", "a", 10}, {"ADDED", "a2", 10}, {"DELETED", "old", 11},
		}},
		{"nothing under the prefix", "/registry/nodes/", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := ExpectedEvents(c.prefix, hist, existed); !reflect.DeepEqual(got, c.want) {
				t.Errorf("ExpectedEvents = %v, want %v", got, c.want)
			}
			if !reflect.DeepEqual(existed, map[string]bool{"/registry/pods/ns1/old": true}) {
				t.Errorf("ExpectedEvents changed existed: %v", existed)
			}
		})
	}
	if got := KeyName("/registry/nodes/", "/registry/nodes/n1"); got != "n1" {
		t.Errorf("KeyName of a cluster-scoped key = %q, want n1", got)
	}
}

func TestCheckWatch(t *testing.T) {
	w := ExpectedEvents("/p/", history, nil)
	ev := func(typ, key string, rv int64) WatchEvent { return WatchEvent{Type: typ, Key: key, RV: rv} }
	with := func(edits map[int][]WatchEvent) []WatchEvent { return edit(w, edits) }
	if want := []WatchEvent{ev("ADDED", "a", 5), ev("ADDED", "b", 6), ev("ADDED", "c", 8), ev("MODIFIED", "b", 8), ev("MODIFIED", "a", 9), ev("DELETED", "a", 11)}; !reflect.DeepEqual(w, want) {
		t.Fatalf("expected events %v, want %v", w, want)
	}
	checkReports(t, CheckWatch, []reportCase[WatchEvent]{
		{"equal", w, w, nil},
		{"nothing expected, nothing seen", nil, nil, nil},
		{"lost", w, with(map[int][]WatchEvent{1: nil}), []string{"lost: {Type:ADDED Key:b RV:6}"}},
		{"the last lost", w, w[:5], []string{"lost: {Type:DELETED Key:a RV:11}"}},
		{"duplicate", w, with(map[int][]WatchEvent{1: {w[1], w[1]}}), []string{"event 2: duplicate {Type:ADDED Key:b RV:6}"}},
		{"reordered", w, with(map[int][]WatchEvent{0: {w[1]}, 1: {w[0]}}), []string{
			"event 1: resourceVersion 5 after 6", "lost: {Type:ADDED Key:a RV:5}", "event 1: unexpected {Type:ADDED Key:a RV:5}"}},
		{"a revision not in etcd's history", w, with(map[int][]WatchEvent{1: {w[1], ev("ADDED", "x", 7)}}), []string{"event 2: unexpected {Type:ADDED Key:x RV:7}"}},
		{"another type", w, with(map[int][]WatchEvent{4: {ev("ADDED", "a", 9)}}), []string{"event 4: want {Type:MODIFIED Key:a RV:9}, got {Type:ADDED Key:a RV:9}"}},
		{"events of another namespace (a filter not applied)", w[:2], []WatchEvent{w[0], ev("ADDED", "other/x", 5), w[1]}, []string{"event 1: unexpected {Type:ADDED Key:other/x RV:5}"}},
		// A client that reconnects resumes from the last resourceVersion it
		// saw: from there it must see the rest once.
		{"resumed where it stopped", w, append(w[:3:3], w[3:]...), nil},
		{"resumed from too early", w, append(w[:5:5], w[2:]...), []string{
			"event 5: resourceVersion 8 after 9", "event 5: duplicate {Type:ADDED Key:c RV:8}", "event 6: duplicate {Type:MODIFIED Key:b RV:8}", "event 7: duplicate {Type:MODIFIED Key:a RV:9}"}},
		{"resumed too late (a 410 and a relist that sent no events)", w, append(w[:2:2], w[5:]...), []string{
			"lost: {Type:ADDED Key:c RV:8}", "lost: {Type:MODIFIED Key:b RV:8}", "lost: {Type:MODIFIED Key:a RV:9}"}},
	})
}
