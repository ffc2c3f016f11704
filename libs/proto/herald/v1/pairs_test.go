package heraldv1

import (
	"fmt"
	"maps"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

func TestPairs(t *testing.T) {
	m := map[string]string{"tier": "1", "app": "web", "empty": "", "b": "x"}
	ps := SortedPairs(m)
	var keys []string
	for _, kv := range ps {
		keys = append(keys, kv.Key)
	}
	if fmt.Sprint(keys) != "[app b empty tier]" {
		t.Fatalf("keys %v, want them sorted", keys)
	}
	p := Pairs(ps)
	for k, v := range m {
		if got, ok := p.Lookup(k); !ok || got != v || !p.Has(k) || p.Get(k) != v {
			t.Errorf("%s: Lookup %q %v, Has %v, Get %q; want %q", k, got, ok, p.Has(k), p.Get(k), v)
		}
	}
	if got, ok := p.Lookup("missing"); ok || got != "" || p.Has("missing") || p.Get("missing") != "" {
		t.Errorf("missing key: Lookup %q %v", got, ok)
	}
	var none Pairs
	if none.Has("app") || none.Get("app") != "" || SortedPairs(nil) != nil || SortedPairs(map[string]string{}) != nil {
		t.Error("no pairs hold something")
	}
}

// An Event's labels and fields were map<string, string>: bytes a peer
// wrote with the maps decode into the pairs, and bytes written with the
// pairs decode into the maps (a pair leaves an empty value out, which a
// map entry always writes: the map reads it as empty all the same).
func TestPairsWireCompatibleWithMaps(t *testing.T) {
	old := mapsEvent(t)
	sets := map[string]map[string]string{
		"labels":      {"app": "web", "tier": "1"},
		"fields":      {"metadata.name": "p", "spec.nodeName": "n1", "status.phase": ""},
		"prev_labels": {"app": "db"},
		"prev_fields": {"metadata.name": "p", "spec.nodeName": "n2"},
	}

	// Maps -> pairs.
	fds := old.Fields()
	m := dynamicpb.NewMessage(old)
	m.Set(fds.ByName("name"), protoreflect.ValueOfString("p"))
	for name, set := range sets {
		mm := m.Mutable(fds.ByName(protoreflect.Name(name))).Map()
		for k, v := range set {
			mm.Set(protoreflect.ValueOfString(k).MapKey(), protoreflect.ValueOfString(v))
		}
	}
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var ev Event
	if err := proto.Unmarshal(b, &ev); err != nil {
		t.Fatal(err)
	}
	got := map[string][]*Pair{"labels": ev.Labels, "fields": ev.Fields, "prev_labels": ev.PrevLabels, "prev_fields": ev.PrevFields}
	for name, set := range sets {
		if m := asMap(got[name]); !maps.Equal(m, set) || len(got[name]) != len(set) {
			t.Errorf("%s written as a map read as pairs %v, want %v", name, got[name], set)
		}
	}
	if ev.Name != "p" {
		t.Errorf("name %q, want p", ev.Name)
	}

	// Pairs -> maps.
	ev = Event{Name: "p", Labels: SortedPairs(sets["labels"]), Fields: SortedPairs(sets["fields"]),
		PrevLabels: SortedPairs(sets["prev_labels"]), PrevFields: SortedPairs(sets["prev_fields"])}
	if b, err = proto.Marshal(&ev); err != nil {
		t.Fatal(err)
	}
	m = dynamicpb.NewMessage(old)
	if err := proto.Unmarshal(b, m); err != nil {
		t.Fatal(err)
	}
	for name, set := range sets {
		read := map[string]string{}
		m.Get(fds.ByName(protoreflect.Name(name))).Map().Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
			read[k.String()] = v.String()
			return true
		})
		if !maps.Equal(read, set) {
			t.Errorf("%s written as pairs read as a map %v, want %v", name, read, set)
		}
	}
	if n := m.Get(fds.ByName("name")).String(); n != "p" || len(m.GetUnknown()) != 0 {
		t.Errorf("name %q, unknown bytes %q", n, m.GetUnknown())
	}
}

// mapsEvent is Event as it was before Pair: herald.proto's own descriptor
// with labels, fields, prev_labels and prev_fields as map<string, string>.
func mapsEvent(t *testing.T) protoreflect.MessageDescriptor {
	t.Helper()
	fdp := protodesc.ToFileDescriptorProto(File_herald_v1_herald_proto)
	fdp.Name = proto.String("herald/v1/herald_maps.proto")
	var event *descriptorpb.DescriptorProto
	for _, m := range fdp.MessageType {
		if m.GetName() == "Event" {
			event = m
		}
	}
	entries := map[string]string{"labels": "LabelsEntry", "fields": "FieldsEntry", "prev_labels": "PrevLabelsEntry", "prev_fields": "PrevFieldsEntry"}
	for _, f := range event.Field {
		entry, ok := entries[f.GetName()]
		if !ok {
			continue
		}
		event.NestedType = append(event.NestedType, &descriptorpb.DescriptorProto{
			Name: proto.String(entry),
			Field: []*descriptorpb.FieldDescriptorProto{
				stringField("key", 1), stringField("value", 2),
			},
			Options: &descriptorpb.MessageOptions{MapEntry: proto.Bool(true)},
		})
		f.TypeName = proto.String(".herald.v1.Event." + entry)
	}
	fd, err := protodesc.NewFile(fdp, new(protoregistry.Files))
	if err != nil {
		t.Fatal(err)
	}
	md := fd.Messages().ByName("Event")
	for _, name := range []protoreflect.Name{"labels", "fields", "prev_labels", "prev_fields"} {
		if !md.Fields().ByName(name).IsMap() {
			t.Fatalf("%s is no map", name)
		}
	}
	return md
}

func stringField(name string, num int32) *descriptorpb.FieldDescriptorProto {
	return &descriptorpb.FieldDescriptorProto{
		Name: proto.String(name), Number: proto.Int32(num), JsonName: proto.String(name),
		Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(), Type: descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum(),
	}
}

func asMap(ps []*Pair) map[string]string {
	m := map[string]string{}
	for _, kv := range ps {
		m[kv.Key] = kv.Value
	}
	return m
}
