package checker

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"herald.dev/integration/stack"
)

// TestReadStream reads a stream back from an embedded NATS server, started
// as the stack starts it: every message in sequence order, decoded; an empty
// stream is no records; a message that is not a record, or a stream that
// does not exist, is an error.
func TestReadStream(t *testing.T) {
	ns, err := stack.StartNATS(t.TempDir(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, name := range []string{"T", "BAD"} {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name) + ".>"}}); err != nil {
			t.Fatal(err)
		}
	}

	if recs, err := ReadStream(ctx, js, "T"); err != nil || recs != nil {
		t.Fatalf("empty stream: %v, %v; want no records", recs, err)
	}
	want := []Record{rec(1, 5, 0, 1, put(0, "/p/a", "a")), progress(2, 5), rec(3, 6, 0, 2, del(0, "/p/a")), rec(4, 6, 1, 2, put(0, "/p/b", "b"))}
	for _, r := range want {
		b, err := proto.Marshal(r.Record)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, "t.x", b); err != nil {
			t.Fatal(err)
		}
	}
	got, err := ReadStream(ctx, js, "T")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("read %d records, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i].Seq != want[i].Seq || !proto.Equal(got[i].Record, want[i].Record) {
			t.Errorf("record %d: %d %v, want %d %v", i, got[i].Seq, got[i].Record, want[i].Seq, want[i].Record)
		}
	}
	changes, errs := StreamChanges(got)
	if wantChanges := []Change{put(5, "/p/a", "a"), del(6, "/p/a"), put(6, "/p/b", "b")}; len(errs) != 0 || !reflect.DeepEqual(changes, wantChanges) {
		t.Errorf("StreamChanges = %v, %v; want %v", changes, errs, wantChanges)
	}

	if _, err := js.Publish(ctx, "bad.x", []byte{0xff, 0xff}); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadStream(ctx, js, "BAD"); err == nil || !strings.HasPrefix(err.Error(), "stream message 1: ") {
		t.Errorf("a message that is not a record: %v, want an error naming message 1", err)
	}
	if _, err := ReadStream(ctx, js, "NONE"); err == nil {
		t.Error("a stream that does not exist: no error")
	}
}
