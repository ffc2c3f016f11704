package stream

import (
	"fmt"
	"slices"
	"testing"

	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// part is a record of revision rev, part n of parts, whose one change's key
// names it ("<rev>.<n>").
func part(rev int64, n, parts uint32) *heraldv1.Record {
	return &heraldv1.Record{Revision: rev, Part: n, Parts: parts,
		Changes: []*heraldv1.Change{{Kind: heraldv1.Change_PUT, Key: fmt.Sprintf("%d.%d", rev, n)}}}
}

func TestAssembler(t *testing.T) {
	type out struct {
		rev  int64
		keys []string
	}
	for _, tc := range []struct {
		name string
		in   []*heraldv1.Record
		want []out // the revisions handed out, in order
	}{
		{"whole revisions", []*heraldv1.Record{part(1, 0, 1), part(2, 0, 1)},
			[]out{{1, []string{"1.0"}}, {2, []string{"2.0"}}}},
		{"complete split", []*heraldv1.Record{part(1, 0, 3), part(1, 1, 3), part(1, 2, 3)},
			[]out{{1, []string{"1.0", "1.1", "1.2"}}}},
		{"markers between parts", []*heraldv1.Record{part(1, 0, 2), Progress(1), part(1, 1, 2), Resync(2)},
			[]out{{1, []string{"1.0", "1.1"}}}},
		{"last part missing", []*heraldv1.Record{part(1, 0, 3), part(1, 1, 3), part(2, 0, 1)},
			[]out{{2, []string{"2.0"}}}},
		{"middle part missing", []*heraldv1.Record{part(1, 0, 3), part(1, 2, 3), part(2, 0, 1)},
			[]out{{2, []string{"2.0"}}}},
		{"first part missing", []*heraldv1.Record{part(1, 1, 2), part(2, 0, 2), part(2, 1, 2)},
			[]out{{2, []string{"2.0", "2.1"}}}},
		{"duplicate part", []*heraldv1.Record{part(1, 0, 3), part(1, 1, 3), part(1, 1, 3), part(1, 2, 3)},
			[]out{{1, []string{"1.0", "1.1", "1.2"}}}},
		{"duplicate first part", []*heraldv1.Record{part(1, 0, 2), part(1, 0, 2), part(1, 1, 2)},
			[]out{{1, []string{"1.0", "1.1"}}}},
		{"duplicate of a revision handed out", []*heraldv1.Record{part(1, 0, 2), part(1, 1, 2), part(1, 0, 2), part(1, 1, 2), part(1, 0, 1)},
			[]out{{1, []string{"1.0", "1.1"}}}},
		{"older revision after a newer", []*heraldv1.Record{part(5, 0, 1), part(4, 0, 1), part(6, 0, 1)},
			[]out{{5, []string{"5.0"}}, {6, []string{"6.0"}}}},
		{"part of another revision", []*heraldv1.Record{part(1, 0, 2), part(2, 1, 2), part(1, 1, 2), part(3, 0, 1)},
			[]out{{3, []string{"3.0"}}}},
		{"interleaved revisions", []*heraldv1.Record{part(1, 0, 2), part(2, 0, 2), part(1, 1, 2), part(2, 1, 2)},
			nil},
		{"new revision starts before the last ends", []*heraldv1.Record{part(1, 0, 2), part(2, 0, 2), part(2, 1, 2)},
			[]out{{2, []string{"2.0", "2.1"}}}},
		{"whole revision interrupts a split", []*heraldv1.Record{part(1, 0, 2), part(2, 0, 1), part(1, 1, 2)},
			[]out{{2, []string{"2.0"}}}},
		{"part beyond parts", []*heraldv1.Record{part(1, 0, 2), part(1, 2, 2), part(1, 1, 2)},
			nil},
		{"parts unset is whole", []*heraldv1.Record{{Revision: 3}},
			[]out{{3, nil}}},
	} {
		var a Assembler
		var got []out
		for _, rec := range tc.in {
			if changes, ok := a.Add(rec); ok {
				o := out{rev: rec.Revision}
				for _, c := range changes {
					o.keys = append(o.keys, c.Key)
				}
				got = append(got, o)
			}
		}
		if !slices.EqualFunc(got, tc.want, func(a, b out) bool { return a.rev == b.rev && slices.Equal(a.keys, b.keys) }) {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestAssemblerReset: after Reset, a reader placed elsewhere in the stream
// gets revisions again, and a revision in progress is forgotten.
func TestAssemblerReset(t *testing.T) {
	var a Assembler
	a.Add(part(5, 0, 1))
	a.Add(part(6, 0, 2))
	a.Reset()
	if _, ok := a.Add(part(6, 1, 2)); ok {
		t.Error("a part after Reset completed a revision begun before it")
	}
	if c, ok := a.Add(part(5, 0, 1)); !ok || len(c) != 1 {
		t.Errorf("revision 5 after Reset: %v, %v", c, ok)
	}
}
