package cache

import (
	"bytes"
	"log/slog"
	"testing"

	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// The shard makes each event once for every stream: the objects' protobuf
// only while a following stream of the resource asks for it, and an
// update's previous state only when its labels or selectable fields
// changed (a stream that wants it anyway gets it made for it: wire).
func TestShardPreparesWhatIsAsked(t *testing.T) {
	rs := newWindow(t, 100)
	_, s := testServer(t, rs, snapRev, 8)
	dec, err := testDecoder()
	if err != nil {
		t.Fatal(err)
	}
	s.dec, s.log = dec, slog.New(slog.DiscardHandler)
	pod := func(app, image string) []byte {
		return []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p1","namespace":"a","labels":{"app":"` + app +
			`"}},"spec":{"containers":[{"name":"c","image":"` + image + `"}]}}`)
	}
	key := rs.res.ObjectKey("a", "p1")
	rev := int64(snapRev)
	write := func(value []byte) *event {
		t.Helper()
		rev++
		sub := newSubscriber(8)
		if _, err := rs.watchAfter(rev-1, rev-1, sub); err != nil {
			t.Fatal(err)
		}
		defer rs.unsubscribe(sub)
		s.apply(&heraldv1.Record{Revision: rev, Parts: 1,
			Changes: []*heraldv1.Change{{Kind: heraldv1.Change_PUT, Key: key, Value: value, CreateRevision: snapRev + 1}}})
		evs := drain(sub)
		if len(evs) != 1 || evs[0].Revision != rev {
			t.Fatalf("revision %d: queued %v", rev, revs(evs))
		}
		return evs[0]
	}

	if ev := write(pod("web", "i1")); ev.Type != heraldv1.EventType_ADDED || ev.ObjectProtobuf != nil {
		t.Errorf("no stream asked for protobuf: %v with %d bytes of protobuf", ev.Type, len(ev.ObjectProtobuf))
	}
	pb := newSubscriber(8)
	pb.protobuf = true
	if _, err := rs.watchAfter(rev, rev, pb); err != nil {
		t.Fatal(err)
	}
	if !rs.wantsProtobuf() {
		t.Fatal("a following stream asked for protobuf; the window does not know")
	}
	ev := write(pod("web", "i2"))
	if !bytes.HasPrefix(ev.ObjectProtobuf, []byte("k8s\x00")) {
		t.Errorf("a stream asked for protobuf: got %q", ev.ObjectProtobuf)
	}
	if !ev.PrevUnchanged || ev.PrevObject != nil || ev.PrevLabels != nil || ev.prev == nil || ev.prev.Rev != rev-1 {
		t.Errorf("image changed: prev_unchanged %v, previous object %q labels %v, kept %v; want only the previous object kept",
			ev.PrevUnchanged, ev.PrevObject, ev.PrevLabels, ev.prev)
	}
	if full := wire(ev, false, true); !bytes.Equal(full.PrevObject, ev.prev.WithRev(rev)) || full.PrevLabelPairs().Get("app") != "web" {
		t.Errorf("to a stream that did not ask to omit it: previous object %s labels %v", full.PrevObject, full.PrevLabels)
	}
	if got := wire(ev, true, true); got != ev.Event {
		t.Error("a fanout hub's stream (omit_unchanged_prev, with_protobuf) got a copy, want the prepared event")
	}
	ev = write(pod("db", "i2"))
	if ev.PrevUnchanged || ev.prev != nil || ev.PrevLabelPairs().Get("app") != "web" || len(ev.PrevObject) == 0 {
		t.Errorf("label changed: prev_unchanged %v, previous labels %v object %q", ev.PrevUnchanged, ev.PrevLabels, ev.PrevObject)
	}

	// The count follows the subscribers however they leave.
	rs.unsubscribe(pb)
	if rs.wantsProtobuf() {
		t.Error("the stream that asked for protobuf left; the window still wants it")
	}
	full := newSubscriber(1)
	full.protobuf = true
	if _, err := rs.watchAfter(rev, rev, full); err != nil {
		t.Fatal(err)
	}
	write(pod("db", "i3")) // fills full's queue
	write(pod("db", "i4")) // cuts it off
	if full.err() == nil || rs.wantsProtobuf() {
		t.Errorf("a stream cut off (%v) still counts as asking for protobuf", full.err())
	}
	again := newSubscriber(1)
	again.protobuf = true
	if _, err := rs.watchAfter(rev, rev, again); err != nil {
		t.Fatal(err)
	}
	rs.reset(rs.state, rev)
	if rs.wantsProtobuf() {
		t.Error("reset cut every stream; the window still wants protobuf")
	}
}
