package stream

import (
	"testing"

	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// TestCheckGeneration: each rule on its own, and a stream that is etcd's.
func TestCheckGeneration(t *testing.T) {
	gen := Generation{Number: 3, ClusterID: 0xa, FirstRevision: 100, Floor: 90}
	for _, tc := range []struct {
		name     string
		recorded bool
		last     int64
		etcd     EtcdState
		want     Rule // "": etcd's history
	}{
		{"same etcd, ahead of the stream", true, 150, EtcdState{ClusterID: 0xa, Revision: 160}, ""},
		{"same etcd, at the stream's end", true, 160, EtcdState{ClusterID: 0xa, Revision: 160}, ""},
		{"empty stream", true, 0, EtcdState{ClusterID: 0xa, Revision: 5}, ""},
		{"another cluster", true, 150, EtcdState{ClusterID: 0xb, Revision: 1000}, RuleClusterID},
		{"revision regression", true, 150, EtcdState{ClusterID: 0xa, Revision: 120}, RuleRevisionRegression},
		{"compacted past the end", true, 150, EtcdState{ClusterID: 0xa, Revision: 100150, Compacted: true}, RuleCompacted},
		{"interrupted reset", true, 80, EtcdState{ClusterID: 0xa, Revision: 160}, RuleInterrupted},
		{"unrecorded: no cluster to compare", false, 150, EtcdState{ClusterID: 0xb, Revision: 160}, ""},
		{"unrecorded: regression still seen", false, 150, EtcdState{ClusterID: 0xb, Revision: 10}, RuleRevisionRegression},
	} {
		mm := CheckGeneration(gen, tc.recorded, tc.last, tc.etcd)
		switch {
		case tc.want == "" && mm != nil:
			t.Errorf("%s: %s (%s), want etcd's history", tc.name, mm.Rule, mm.Reason)
		case tc.want != "" && (mm == nil || mm.Rule != tc.want):
			t.Errorf("%s: %v, want rule %s", tc.name, mm, tc.want)
		}
	}
}

// TestGenerationMetadata: a generation survives its metadata, and a stream
// configuration being updated keeps it.
func TestGenerationMetadata(t *testing.T) {
	g := Generation{Number: 2, ClusterID: 0xdeadbeefcafe, FirstRevision: 7, Floor: 25}
	meta := g.SetMetadata(map[string]string{"other": "x"})
	if got, ok := GenerationOf(meta); !ok || got != g {
		t.Fatalf("GenerationOf = %+v, %v; want %+v", got, ok, g)
	}
	if _, ok := GenerationOf(map[string]string{"other": "x"}); ok {
		t.Fatal("a stream without a generation reads as recording one")
	}
	kept := KeepGeneration(nil, meta)
	if got, _ := GenerationOf(kept); got != g || kept["other"] != "" {
		t.Fatalf("KeepGeneration = %v", kept)
	}
}

// TestGenerationMsgID: ids of the first generation are MsgID's; later
// generations' differ from every id of the ones before.
func TestGenerationMsgID(t *testing.T) {
	rec := &heraldv1.Record{Revision: 4712, Parts: 1}
	if got := GenerationMsgID(1, rec); got != MsgID(rec) {
		t.Errorf("generation 1: %q, want %q", got, MsgID(rec))
	}
	if got := GenerationMsgID(0, rec); got != MsgID(rec) {
		t.Errorf("no generation: %q, want %q", got, MsgID(rec))
	}
	if a, b := GenerationMsgID(2, rec), GenerationMsgID(3, rec); a == MsgID(rec) || a == b || a != "g2.4712.0" {
		t.Errorf("generations 2 and 3: %q, %q", a, b)
	}
}
