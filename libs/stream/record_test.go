package stream

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	heraldv1 "herald.dev/libs/proto/herald/v1"
)

func TestMsgID(t *testing.T) {
	for _, tc := range []struct {
		rec  *heraldv1.Record
		want string
	}{
		{&heraldv1.Record{Revision: 42, Parts: 1}, "42.0"},
		{&heraldv1.Record{Revision: 42, Part: 2, Parts: 3}, "42.2"},
		{Progress(42), "p42"},
		{Resync(42), "r42"},
		{&heraldv1.Record{Revision: 9_000_000_000, Parts: 1}, "9000000000.0"},
	} {
		if got := MsgID(tc.rec); got != tc.want {
			t.Errorf("MsgID(%v) = %q, want %q", tc.rec, got, tc.want)
		}
	}
}

func TestMarkers(t *testing.T) {
	p, r := Progress(7), Resync(8)
	if !p.Progress || p.Resync || p.Revision != 7 || p.Parts != 1 || !IsMarker(p) {
		t.Errorf("Progress(7) = %v", p)
	}
	if !r.Resync || r.Progress || r.Revision != 8 || r.Parts != 1 || !IsMarker(r) {
		t.Errorf("Resync(8) = %v", r)
	}
	if IsMarker(&heraldv1.Record{Revision: 7, Parts: 1}) {
		t.Error("a revision is not a marker")
	}
}

func TestNext(t *testing.T) {
	for _, tc := range []struct {
		name string
		rec  *heraldv1.Record
		rev  int64
		part uint32
	}{
		{"whole revision", &heraldv1.Record{Revision: 10, Parts: 1}, 11, 0},
		{"first of three parts", &heraldv1.Record{Revision: 10, Part: 0, Parts: 3}, 10, 1},
		{"middle part", &heraldv1.Record{Revision: 10, Part: 1, Parts: 3}, 10, 2},
		{"last part", &heraldv1.Record{Revision: 10, Part: 2, Parts: 3}, 11, 0},
		{"progress", Progress(10), 11, 0},
		{"resync", Resync(10), 11, 0},
		{"parts unset", &heraldv1.Record{Revision: 10}, 11, 0},
	} {
		if rev, part := Next(tc.rec); rev != tc.rev || part != tc.part {
			t.Errorf("%s: Next = %d, %d; want %d, %d", tc.name, rev, part, tc.rev, tc.part)
		}
	}
}

func change(key string, valueBytes int) *heraldv1.Change {
	return &heraldv1.Change{Kind: heraldv1.Change_PUT, Key: key, Value: bytes.Repeat([]byte("x"), valueBytes), CreateRevision: 1}
}

func TestFrame(t *testing.T) {
	const max = 4096
	many := make([]*heraldv1.Change, 20)
	for i := range many {
		many[i] = change("/registry/pods/default/p"+strings.Repeat("i", i), 700)
	}
	for _, tc := range []struct {
		name    string
		changes []*heraldv1.Change
		parts   int
	}{
		{"one small change", []*heraldv1.Change{change("/registry/pods/default/a", 10)}, 1},
		{"many changes", many, 4}, // about 750 bytes each: five fill a part
		{"one change too large for a message", []*heraldv1.Change{change("/registry/pods/default/a", 2*max)}, 3},
		{"large between small", []*heraldv1.Change{change("/a", 10), change("/b", 2*max), change("/c", 10)}, 3},
	} {
		recs := Frame(99, tc.changes, max, 1234)
		if len(recs) != tc.parts {
			t.Errorf("%s: %d parts, want %d", tc.name, len(recs), tc.parts)
		}
		var all []*heraldv1.Change
		for n, rec := range recs {
			if rec.Revision != 99 || rec.Part != uint32(n) || rec.Parts != uint32(len(recs)) || rec.ObservedUnixNano != 1234 || IsMarker(rec) {
				t.Errorf("%s: part %d = revision %d part %d/%d", tc.name, n, rec.Revision, rec.Part, rec.Parts)
			}
			if len(rec.Changes) == 0 {
				t.Errorf("%s: part %d is empty", tc.name, n)
			}
			// Every part fits, headers included.
			if size := proto.Size(rec); size > max-256+64 {
				t.Errorf("%s: part %d is %d bytes (limit %d)", tc.name, n, size, max)
			}
			all = append(all, rec.Changes...)
		}
		all = Join(all)
		if len(all) != len(tc.changes) {
			t.Fatalf("%s: %d changes framed, want %d", tc.name, len(all), len(tc.changes))
		}
		for i := range all {
			if !proto.Equal(all[i], tc.changes[i]) {
				t.Errorf("%s: change %d out of order or altered", tc.name, i)
			}
		}
	}
}

// TestFrameLargeChanges: a change of any size, a PUT's value or a
// DELETE's previous value, is cut into fragments that each fit in a
// message, and comes back from an Assembler exactly as it went in.
func TestFrameLargeChanges(t *testing.T) {
	const max = 900 << 10
	big := func(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }
	for _, tc := range []struct {
		name    string
		changes []*heraldv1.Change
	}{
		{"1.4 MiB put", []*heraldv1.Change{{Kind: heraldv1.Change_PUT, Key: "/registry/configmaps/default/big", Value: big(1400<<10, 'v'), CreateRevision: 7}}},
		{"1.5 MiB delete", []*heraldv1.Change{{Kind: heraldv1.Change_DELETE, Key: "/registry/configmaps/default/big", PrevValue: big(1536<<10, 'p')}}},
		{"value and prev value", []*heraldv1.Change{{Kind: heraldv1.Change_PUT, Key: "/k", Value: big(1<<20, 'v'), PrevValue: big(1<<20, 'p')}}},
		{"exactly at the edge", []*heraldv1.Change{{Kind: heraldv1.Change_PUT, Key: "/k", Value: big(max-fragmentOverhead-2-64, 'v')}}},
		{"small, large, small", []*heraldv1.Change{change("/a", 10),
			{Kind: heraldv1.Change_PUT, Key: "/b", Value: big(3<<20, 'b')}, change("/c", 10)}},
	} {
		recs := Frame(5, tc.changes, max, 0)
		var a Assembler
		var got []*heraldv1.Change
		for i, rec := range recs {
			data := encode(t, rec)
			// Headers (id, expected stream and sequence, traceparent) need a
			// few hundred bytes of the message.
			if len(data)+300 > max {
				t.Errorf("%s: part %d is %d bytes, over %d with headers", tc.name, i, len(data), max)
			}
			changes, ok := a.Add(rec)
			if ok != (i == len(recs)-1) {
				t.Fatalf("%s: part %d/%d complete = %v", tc.name, i, len(recs), ok)
			}
			got = changes
		}
		if len(got) != len(tc.changes) {
			t.Fatalf("%s: %d changes back, want %d", tc.name, len(got), len(tc.changes))
		}
		for i := range got {
			if !proto.Equal(got[i], tc.changes[i]) {
				t.Errorf("%s: change %d altered (value %d bytes, prev %d; want %d, %d)", tc.name, i,
					len(got[i].Value), len(got[i].PrevValue), len(tc.changes[i].Value), len(tc.changes[i].PrevValue))
			}
		}
	}
}

// TestJoin: continuations join the change before them of the same key;
// malformed ones (first, or after another key) are dropped, never joined
// to the wrong object.
func TestJoin(t *testing.T) {
	put := func(key, v string) *heraldv1.Change {
		return &heraldv1.Change{Kind: heraldv1.Change_PUT, Key: key, Value: []byte(v)}
	}
	cont := func(key, v string) *heraldv1.Change { return &heraldv1.Change{Key: key, Value: []byte(v)} }
	head := put("/a", "ab")
	got := Join([]*heraldv1.Change{cont("/a", "orphan"), head, cont("/a", "cd"), cont("/a", "ef"), put("/b", "x"), cont("/a", "gh")})
	want := []*heraldv1.Change{put("/a", "abcdef"), put("/b", "x")}
	if len(got) != len(want) {
		t.Fatalf("Join = %v, want %v", got, want)
	}
	for i := range got {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("Join[%d] = %v, want %v", i, got[i], want[i])
		}
	}
	if string(head.Value) != "ab" {
		t.Errorf("Join modified its input: %q", head.Value)
	}
	plain := []*heraldv1.Change{put("/a", "1"), put("/b", "2")}
	if got := Join(plain); &got[0] != &plain[0] {
		t.Error("Join copied changes without continuations")
	}
}

// TestFrameAssemble: what Frame cuts, an Assembler puts back together, in
// order, once.
func TestFrameAssemble(t *testing.T) {
	var a Assembler
	for rev, n := range []int{1, 3, 20, 1, 57} {
		changes := make([]*heraldv1.Change, n)
		for i := range changes {
			changes[i] = change("/registry/configmaps/default/c", 500)
		}
		recs := Frame(int64(rev+1), changes, 2048, 0)
		for i, rec := range recs {
			got, ok := a.Add(rec)
			if ok != (i == len(recs)-1) {
				t.Fatalf("revision %d part %d/%d: complete = %v", rev+1, i, len(recs), ok)
			}
			if ok && len(got) != n {
				t.Fatalf("revision %d: %d changes back, want %d", rev+1, len(got), n)
			}
		}
	}
}

func TestDecode(t *testing.T) {
	roundTrip(t, &heraldv1.Record{Revision: 5, Part: 1, Parts: 2, Changes: []*heraldv1.Change{change("/k", 3)}})
	if rec, err := Decode([]byte("\xff\xff\xff not a record")); err == nil {
		t.Errorf("Decode(garbage) = %v, want an error", rec)
	}
	if rec, err := Decode(nil); err != nil || rec.Revision != 0 {
		t.Errorf("Decode(nil) = %v, %v; want an empty record", rec, err)
	}
}

// FuzzDecode: stream bytes never panic a reader, whatever they hold, and
// what decodes survives the rules applied to records.
func FuzzDecode(f *testing.F) {
	for _, rec := range []*heraldv1.Record{
		{Revision: 5, Parts: 1, Changes: []*heraldv1.Change{change("/registry/pods/default/a", 10)}},
		{Revision: 5, Part: 1, Parts: 3},
		Progress(9), Resync(10),
	} {
		f.Add(encode(f, rec))
	}
	f.Add([]byte{0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		rec, err := Decode(data)
		if err != nil {
			return
		}
		MsgID(rec)
		rev, part := Next(rec)
		if rec.Revision < math.MaxInt64 && (rev < rec.Revision || rev == rec.Revision && (part != rec.Part+1 || part >= rec.Parts)) {
			t.Fatalf("Next(%v) = %d, %d: not after it", rec, rev, part)
		}
		var a Assembler
		if changes, ok := a.Add(rec); ok && len(changes) != len(Join(rec.Changes)) {
			t.Fatalf("a whole revision came back with %d changes, had %d", len(changes), len(Join(rec.Changes)))
		}
		roundTrip(t, rec)
	})
}

// encode marshals rec.
func encode(t testing.TB, rec *heraldv1.Record) []byte {
	t.Helper()
	b, err := Encode(rec)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// roundTrip checks that rec decodes back as itself.
func roundTrip(t testing.TB, rec *heraldv1.Record) {
	t.Helper()
	got, err := Decode(encode(t, rec))
	if err != nil || !proto.Equal(got, rec) {
		t.Fatalf("Decode(encode(%v)) = %v, %v", rec, got, err)
	}
}
