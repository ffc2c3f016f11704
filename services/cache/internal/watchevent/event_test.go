package watchevent

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

func TestFromChange(t *testing.T) {
	reg := testRegistry(t)
	pods := resource(t, reg, "pods")
	const key = "/registry/pods/default/a"
	v1 := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","namespace":"default","labels":{"app":"x"}},"spec":{"nodeName":"n1"}}`)
	v2 := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","namespace":"default","labels":{"app":"y"}},"spec":{"nodeName":"n2"}}`)
	dec, err := kube.NewDecoder(nil)
	if err != nil {
		t.Fatal(err)
	}
	old, err := dec.Decode(context.Background(), pods, key, "default", "a", v1, 5)
	if err != nil {
		t.Fatal(err)
	}
	errPrev := errors.New("etcd is down")
	known := func() (*kube.Object, error) { return old, nil }
	unknown := func() (*kube.Object, error) { return nil, nil }
	failing := func() (*kube.Object, error) { return nil, errPrev }

	for _, tc := range []struct {
		name     string
		c        *heraldv1.Change
		prev     func() (*kube.Object, error)
		wantType heraldv1.EventType // EVENT_TYPE_UNSPECIFIED: no event
		wantObj  bool               // a new object is stored
		wantPrev bool               // the event carries the previous object
		wantErr  error
	}{
		{"create", &heraldv1.Change{Kind: heraldv1.Change_PUT, Key: key, Value: v2, CreateRevision: 10}, unknown,
			heraldv1.EventType_ADDED, true, false, nil},
		{"update", &heraldv1.Change{Kind: heraldv1.Change_PUT, Key: key, Value: v2, CreateRevision: 5}, known,
			heraldv1.EventType_MODIFIED, true, true, nil},
		{"invalid value", &heraldv1.Change{Kind: heraldv1.Change_PUT, Key: key, Value: []byte("not json")}, failing,
			0, false, false, kube.ErrInvalidObject},
		{"value stripped for its size", &heraldv1.Change{Kind: heraldv1.Change_PUT, Key: key}, failing,
			0, false, false, kube.ErrInvalidObject},
		{"update, previous unreadable", &heraldv1.Change{Kind: heraldv1.Change_PUT, Key: key, Value: v2}, failing,
			0, false, false, errPrev},
		{"delete of a known object", &heraldv1.Change{Kind: heraldv1.Change_DELETE, Key: key}, known,
			heraldv1.EventType_DELETED, false, false, nil},
		{"delete known from its previous value", &heraldv1.Change{Kind: heraldv1.Change_DELETE, Key: key, PrevValue: v1}, unknown,
			heraldv1.EventType_DELETED, false, false, nil},
		{"delete of an object never served", &heraldv1.Change{Kind: heraldv1.Change_DELETE, Key: key}, unknown,
			0, false, false, nil},
		{"delete with an invalid previous value", &heraldv1.Change{Kind: heraldv1.Change_DELETE, Key: key, PrevValue: []byte("{")}, unknown,
			0, false, false, nil},
		{"delete, previous unreadable", &heraldv1.Change{Kind: heraldv1.Change_DELETE, Key: key}, failing,
			0, false, false, errPrev},
		{"unknown kind", &heraldv1.Change{Key: key, Value: v2}, failing,
			0, false, false, nil},
	} {
		ev, obj, err := FromChange(context.Background(), dec, pods, "default", "a", 10, tc.c, tc.prev)
		if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.wantErr)
		}
		if (obj != nil) != tc.wantObj {
			t.Errorf("%s: stored object = %v, want one: %v", tc.name, obj, tc.wantObj)
		}
		if tc.wantType == 0 {
			if ev != nil {
				t.Errorf("%s: event %v, want none", tc.name, ev)
			}
			continue
		}
		if ev == nil {
			t.Errorf("%s: no event, want %v", tc.name, tc.wantType)
			continue
		}
		if ev.Type != tc.wantType || ev.Revision != 10 || ev.Namespace != "default" || ev.Name != "a" {
			t.Errorf("%s: event %v %d %s/%s", tc.name, ev.Type, ev.Revision, ev.Namespace, ev.Name)
		}
		if (len(ev.PrevObject) > 0) != tc.wantPrev {
			t.Errorf("%s: previous object %q, want one: %v", tc.name, ev.PrevObject, tc.wantPrev)
		}
		switch ev.Type {
		case heraldv1.EventType_ADDED, heraldv1.EventType_MODIFIED:
			if string(ev.Object) != string(obj.JSON) || value(ev.Labels, "app") != "y" {
				t.Errorf("%s: event object %s labels %v", tc.name, ev.Object, ev.Labels)
			}
			if tc.wantPrev && value(ev.PrevLabels, "app") != "x" {
				t.Errorf("%s: previous labels %v", tc.name, ev.PrevLabels)
			}
			// The new object's protobuf travels with it (kube.Decoder
			// makes it); its exact bytes are libs/kube's test.
			if !bytes.HasPrefix(ev.ObjectProtobuf, []byte("k8s\x00")) {
				t.Errorf("%s: no protobuf of the object: %q", tc.name, ev.ObjectProtobuf)
			}
		case heraldv1.EventType_DELETED:
			// Never the protobuf of another object than the event's.
			if ev.ObjectProtobuf != nil {
				t.Errorf("%s: DELETED event with protobuf %q", tc.name, ev.ObjectProtobuf)
			}
			// The deleted object as it last was, at the delete's revision.
			want := old.WithRev(10)
			if string(ev.Object) != string(want) || value(ev.Labels, "app") != "x" {
				t.Errorf("%s: deleted object %s, want %s", tc.name, ev.Object, want)
			}
		}
	}
}

// An event's labels and fields are its object's, as pairs sorted by key
// (so that one object's event encodes alike every time), and so are the
// previous state's.
func TestFromChangeSortsPairs(t *testing.T) {
	pods := resource(t, testRegistry(t), "pods")
	const key = "/registry/pods/default/a"
	pod := func(labels, phase string) []byte {
		return []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","namespace":"default","labels":` + labels +
			`},"spec":{"nodeName":"n1"},"status":{"phase":"` + phase + `"}}`)
	}
	dec, err := kube.NewDecoder(nil)
	if err != nil {
		t.Fatal(err)
	}
	old, err := dec.Decode(context.Background(), pods, key, "default", "a", pod(`{"z":"1","a":"2","m":"3"}`, "Pending"), 5)
	if err != nil {
		t.Fatal(err)
	}
	ev, obj, err := FromChange(context.Background(), dec, pods, "default", "a", 10,
		&heraldv1.Change{Kind: heraldv1.Change_PUT, Key: key, Value: pod(`{"y":"1","b":"2","k":"3","c":""}`, "Running")},
		func() (*kube.Object, error) { return old, nil })
	if err != nil || ev.Type != heraldv1.EventType_MODIFIED || ev.PrevUnchanged {
		t.Fatalf("%v, prev_unchanged %v, err %v; want MODIFIED with its previous state", ev.GetType(), ev.GetPrevUnchanged(), err)
	}
	for _, c := range []struct {
		name string
		ps   []*heraldv1.Pair
		want map[string]string
	}{{"labels", ev.Labels, obj.Labels}, {"fields", ev.Fields, obj.Fields},
		{"prev_labels", ev.PrevLabels, old.Labels}, {"prev_fields", ev.PrevFields, old.Fields}} {
		got := map[string]string{}
		for i, kv := range c.ps {
			if i > 0 && c.ps[i-1].Key >= kv.Key {
				t.Errorf("%s: %q before %q", c.name, c.ps[i-1].Key, kv.Key)
			}
			got[kv.Key] = kv.Value
		}
		if !maps.Equal(got, c.want) || len(c.want) < 3 {
			t.Errorf("%s: %v, want %v", c.name, c.ps, c.want)
		}
	}
}

// TestEventCallsPrevOnlyWhenNeeded: an invalid PUT never asks for the
// previous state (which may cost an etcd read).
func TestEventCallsPrevOnlyWhenNeeded(t *testing.T) {
	pods := resource(t, testRegistry(t), "pods")
	dec, err := kube.NewDecoder(nil)
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	prev := func() (*kube.Object, error) { calls++; return nil, nil }
	FromChange(context.Background(), dec, pods, "default", "a", 3, &heraldv1.Change{Kind: heraldv1.Change_PUT, Value: []byte("[]")}, prev)
	FromChange(context.Background(), dec, pods, "default", "a", 3, &heraldv1.Change{}, prev)
	if calls != 0 {
		t.Errorf("prev called %d times", calls)
	}
}

// TestEventPrevUnchanged: an update is marked prev_unchanged exactly when
// no selector can tell the two states apart (same labels, same selectable
// fields), whatever else changed.
func TestEventPrevUnchanged(t *testing.T) {
	reg := testRegistry(t)
	pods := resource(t, reg, "pods")
	const key = "/registry/pods/default/a"
	pod := func(labels, node, image string) []byte {
		return []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","namespace":"default","labels":` + labels +
			`},"spec":{"nodeName":"` + node + `","containers":[{"name":"c","image":"` + image + `"}]}}`)
	}
	dec, err := kube.NewDecoder(nil)
	if err != nil {
		t.Fatal(err)
	}
	old, err := dec.Decode(context.Background(), pods, key, "default", "a", pod(`{"app":"x"}`, "n1", "i1"), 5)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		value []byte
		want  bool
	}{
		{"image changed", pod(`{"app":"x"}`, "n1", "i2"), true},
		{"nothing changed", pod(`{"app":"x"}`, "n1", "i1"), true},
		{"label value changed", pod(`{"app":"y"}`, "n1", "i1"), false},
		{"label added", pod(`{"app":"x","tier":"web"}`, "n1", "i1"), false},
		{"labels removed", pod(`{}`, "n1", "i1"), false},
		{"selectable field changed", pod(`{"app":"x"}`, "n2", "i1"), false},
	} {
		c := &heraldv1.Change{Kind: heraldv1.Change_PUT, Key: key, Value: tc.value, CreateRevision: 5}
		ev, _, err := FromChange(context.Background(), dec, pods, "default", "a", 10, c, func() (*kube.Object, error) { return old, nil })
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if ev.Type != heraldv1.EventType_MODIFIED || ev.PrevUnchanged != tc.want {
			t.Errorf("%s: %v, prev_unchanged %v, want MODIFIED, %v", tc.name, ev.Type, ev.PrevUnchanged, tc.want)
		}
		// The previous state travels only when a selector can tell it
		// apart; otherwise it is not copied at all, and PrevState makes
		// it for a stream that wants it anyway.
		full := ev
		if tc.want {
			if ev.PrevObject != nil || ev.PrevLabels != nil || ev.PrevFields != nil {
				t.Errorf("%s: previous state %s %v %v made, want none", tc.name, ev.PrevObject, ev.PrevLabels, ev.PrevFields)
			}
			full = PrevState(ev, old)
			if ev.PrevObject != nil || full.Object == nil || string(full.Object) != string(ev.Object) || !full.PrevUnchanged {
				t.Errorf("%s: PrevState changed its event or lost its object", tc.name)
			}
		}
		if string(full.PrevObject) != string(old.WithRev(10)) || value(full.PrevFields, "spec.nodeName") != "n1" || value(full.PrevLabels, "app") != "x" {
			t.Errorf("%s: previous object %s, labels %v, fields %v", tc.name, full.PrevObject, full.PrevLabels, full.PrevFields)
		}
	}
	created, _, err := FromChange(context.Background(), dec, pods, "default", "a", 10,
		&heraldv1.Change{Kind: heraldv1.Change_PUT, Key: key, Value: pod(`{"app":"x"}`, "n1", "i1"), CreateRevision: 10},
		func() (*kube.Object, error) { return nil, nil })
	if err != nil || created.Type != heraldv1.EventType_ADDED || created.PrevUnchanged {
		t.Errorf("create: %v, prev_unchanged %v, err %v; want ADDED, false", created.GetType(), created.GetPrevUnchanged(), err)
	}
}

func testRegistry(t testing.TB) *kube.Registry {
	t.Helper()
	reg, err := kube.NewRegistry(kube.DefaultPrefix, kube.DefaultResources())
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

func resource(t testing.TB, reg *kube.Registry, id string) *kube.Resource {
	t.Helper()
	r, ok := reg.ByID(id)
	if !ok {
		t.Fatalf("no resource %s", id)
	}
	return r
}

// WithoutProtobuf and PrevState copy every field of an event but the ones
// they change, including fields added to Event later, and leave the event
// itself alone.
func TestEventCopiesKeepEveryOtherField(t *testing.T) {
	full := &heraldv1.Event{}
	m := full.ProtoReflect()
	fds := m.Descriptor().Fields()
	for i := range fds.Len() {
		fd := fds.Get(i)
		switch {
		case fd.IsList() && fd.Message() != nil:
			m.Mutable(fd).List().Append(protoreflect.ValueOfMessage((&heraldv1.Pair{Key: "k", Value: string(fd.Name())}).ProtoReflect()))
		case fd.Kind() == protoreflect.EnumKind:
			m.Set(fd, protoreflect.ValueOfEnum(1))
		case fd.Kind() == protoreflect.Int64Kind:
			m.Set(fd, protoreflect.ValueOfInt64(int64(fd.Number())))
		case fd.Kind() == protoreflect.StringKind:
			m.Set(fd, protoreflect.ValueOfString(string(fd.Name())))
		case fd.Kind() == protoreflect.BytesKind:
			m.Set(fd, protoreflect.ValueOfBytes([]byte(fd.Name())))
		case fd.Kind() == protoreflect.BoolKind:
			m.Set(fd, protoreflect.ValueOfBool(true))
		default:
			t.Fatalf("field %s of kind %v: teach this test to set it", fd.Name(), fd.Kind())
		}
	}
	orig := proto.CloneOf(full)
	pods := resource(t, testRegistry(t), "pods")
	dec, err := kube.NewDecoder(nil)
	if err != nil {
		t.Fatal(err)
	}
	prev, err := dec.Decode(context.Background(), pods, "/registry/pods/default/a", "default", "a",
		[]byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","namespace":"default","labels":{"app":"x"}}}`), 5)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		out     *heraldv1.Event
		changed map[protoreflect.Name]protoreflect.Value
	}{
		{"WithoutProtobuf", WithoutProtobuf(full), map[protoreflect.Name]protoreflect.Value{"object_protobuf": protoreflect.ValueOfBytes(nil)}},
		{"PrevState", PrevState(full, prev), map[protoreflect.Name]protoreflect.Value{
			"prev_object": protoreflect.ValueOfBytes(prev.WithRev(full.Revision))}},
	} {
		out := tc.out.ProtoReflect()
		for i := range fds.Len() {
			fd := fds.Get(i)
			want, changed := tc.changed[fd.Name()]
			if !changed {
				want = m.Get(fd)
			}
			if fd.IsList() && strings.HasPrefix(string(fd.Name()), "prev_") && tc.name == "PrevState" {
				continue // prev's own, checked below
			}
			if !out.Get(fd).Equal(want) {
				t.Errorf("%s: %s = %v, want %v", tc.name, fd.Name(), out.Get(fd), want)
			}
		}
	}
	if ps := PrevState(full, prev); value(ps.PrevLabels, "app") != "x" || value(ps.PrevFields, "metadata.name") != "a" {
		t.Errorf("PrevState: labels %v, fields %v, want the previous object's", ps.PrevLabels, ps.PrevFields)
	}
	if !proto.Equal(full, orig) {
		t.Errorf("the event changed: %v, want %v", full, orig)
	}
}

// value is the value of key among an event's pairs, "" when they do not
// hold it.
func value(ps []*heraldv1.Pair, key string) string { return (*heraldv1.Pairs)(&ps).Get(key) }
