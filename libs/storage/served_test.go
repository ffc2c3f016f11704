package storage

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1beta1 "k8s.io/apimachinery/pkg/apis/meta/v1beta1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	clientscheme "k8s.io/client-go/kubernetes/scheme"
	restwatch "k8s.io/client-go/rest/watch"
)

var podGVK = schema.GroupVersionKind{Version: "v1", Kind: "Pod"}

func testPod(name string) *corev1.Pod {
	grace := int64(30)
	p := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: "u-" + "1", ResourceVersion: "42",
			Labels: map[string]string{"app": "web"}, Annotations: map[string]string{"a": "b"},
			CreationTimestamp:          metav1.Unix(1700000000, 0),
			DeletionGracePeriodSeconds: &grace, Finalizers: []string{"f"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: "u2"}}},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "i"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, StartTime: &metav1.Time{Time: metav1.Unix(1700000001, 0).Time},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	return p
}

// The protobuf made from the served JSON is kube's protobuf of the object.
func TestDecodeServedProtobuf(t *testing.T) {
	c := newTestCodec(t, nil)
	pod := testPod("web-0")
	js, err := c.EncodeJSON(pod)
	if err != nil {
		t.Fatal(err)
	}
	obj, err := c.DecodeServed(podGVK, js)
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.EncodeProtobuf(obj)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := c.EncodeProtobuf(pod)
	if !bytes.Equal(got, want) || !bytes.HasPrefix(got, []byte("k8s\x00")) {
		t.Fatalf("protobuf from JSON differs from the object's")
	}
	for _, bad := range []string{"", "[]", "{", `{"kind":"Node","apiVersion":"v1"}`} {
		if _, err := c.DecodeServed(podGVK, []byte(bad)); err == nil {
			t.Errorf("DecodeServed(%q) succeeded", bad)
		}
	}
	if _, err := c.DecodeServed(schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Widget"}, js); err != ErrNoProtobuf {
		t.Errorf("custom kind: %v", err)
	}
}

// Metadata is meta.AsPartialObjectMetadata of the object, typed or not.
func TestMetadata(t *testing.T) {
	c := newTestCodec(t, nil)
	pod := testPod("web-0")
	js, _ := c.EncodeJSON(pod)
	want := meta.AsPartialObjectMetadata(&pod.ObjectMeta)
	want.SetGroupVersionKind(metav1.SchemeGroupVersion.WithKind(KindPartialObjectMetadata))
	for _, custom := range []bool{false, true} {
		got, err := Metadata(js, custom, metav1.SchemeGroupVersion)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("custom=%v:\n got %+v\nwant %+v", custom, got, want)
		}
	}
	b, err := c.Encode(MediaJSON, false, want)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte(`{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"web-0",`)) {
		t.Errorf("JSON: %s", b)
	}
	if _, err := Metadata([]byte(`{"metadata":[]}`), false, metav1.SchemeGroupVersion); err == nil {
		t.Error("bad metadata accepted")
	}
}

func TestLists(t *testing.T) {
	c := newTestCodec(t, nil)
	var items [][]byte
	for _, n := range []string{"a", "b"} {
		js, _ := c.EncodeJSON(testPod(n))
		items = append(items, js)
	}
	rem := int64(7)
	lm := metav1.ListMeta{ResourceVersion: "99", Continue: "tok", RemainingItemCount: &rem}
	list, err := c.TypedList(podGVK, items, lm)
	if err != nil {
		t.Fatal(err)
	}
	pb, err := c.Encode(MediaProtobuf, false, list)
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := protobuf.NewSerializer(clientscheme.Scheme, clientscheme.Scheme).Decode(pb, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	pl := got.(*corev1.PodList)
	if len(pl.Items) != 2 || pl.Items[1].Name != "b" || pl.ListMeta.ResourceVersion != "99" || pl.Continue != "tok" || *pl.RemainingItemCount != 7 {
		t.Fatalf("PodList: %+v", pl.ListMeta)
	}
	empty, err := c.TypedList(podGVK, nil, lm)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := c.EncodeJSON(empty); !bytes.Contains(b, []byte(`"items":[]`)) {
		t.Errorf("empty typed list: %s", b)
	}

	ml, err := MetadataList(items, false, metav1beta1.SchemeGroupVersion, lm)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := c.Encode(MediaJSON, false, ml)
	var decoded metav1beta1.PartialObjectMetadataList
	if err := json.Unmarshal(b, &decoded); err != nil || decoded.Kind != KindPartialObjectMetadataList || decoded.APIVersion != "meta.k8s.io/v1beta1" ||
		len(decoded.Items) != 2 || decoded.Items[0].APIVersion != "meta.k8s.io/v1beta1" || decoded.Continue != "tok" {
		t.Fatalf("metadata list: %v %s", err, b)
	}
	// kube-apiserver's transformation leaves an empty list's items nil.
	ml, _ = MetadataList(nil, false, metav1.SchemeGroupVersion, metav1.ListMeta{ResourceVersion: "5"})
	if b, _ := c.Encode(MediaJSON, false, ml); string(b) != `{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"5"},"items":null}`+"\n" {
		t.Errorf("empty metadata list: %s", b)
	}
}

// Pretty JSON and YAML are what kube's serializers write for the object.
func TestFromJSON(t *testing.T) {
	c := newTestCodec(t, nil)
	pod := testPod("web-0")
	js, _ := c.EncodeJSON(pod)
	info, _ := runtime.SerializerInfoForMediaType(serializer.NewCodecFactory(clientscheme.Scheme).SupportedMediaTypes(), MediaYAML)
	var want bytes.Buffer
	if err := info.Serializer.Encode(pod, &want); err != nil {
		t.Fatal(err)
	}
	if got, err := FromJSON(MediaYAML, false, js); err != nil || !bytes.Equal(got, want.Bytes()) {
		t.Errorf("YAML: %v\n%s\nwant\n%s", err, got, want.Bytes())
	}
	jinfo, _ := runtime.SerializerInfoForMediaType(serializer.NewCodecFactory(clientscheme.Scheme).SupportedMediaTypes(), MediaJSON)
	want.Reset()
	if err := jinfo.PrettySerializer.Encode(pod, &want); err != nil {
		t.Fatal(err)
	}
	if got, err := FromJSON(MediaJSON, true, js); err != nil || !bytes.Equal(got, want.Bytes()) {
		t.Errorf("pretty: %v\n%s\nwant\n%s", err, got, want.Bytes())
	}
	if got, _ := FromJSON(MediaJSON, false, js); !bytes.Equal(got, js) {
		t.Error("JSON changed")
	}
}

// A protobuf watch frame is read back by client-go's own watch decoder.
func TestProtobufWatchEvent(t *testing.T) {
	c := newTestCodec(t, nil)
	pod := testPod("web-0")
	pb, _ := c.EncodeProtobuf(pod)
	status := &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonExpired}
	spb, err := c.Encode(MediaProtobuf, false, status)
	if err != nil {
		t.Fatal(err)
	}
	bm, err := c.BookmarkObject(podGVK, "50", map[string]string{metav1.InitialEventsAnnotationKey: "true"})
	if err != nil {
		t.Fatal(err)
	}
	bpb, _ := c.EncodeProtobuf(bm)
	var stream []byte
	for _, ev := range []struct {
		typ string
		obj []byte
	}{{"ADDED", pb}, {"BOOKMARK", bpb}, {"ERROR", spb}} {
		f, err := WatchEvent(MediaProtobuf, ev.typ, ev.obj)
		if err != nil {
			t.Fatal(err)
		}
		if int(binary.BigEndian.Uint32(f)) != len(f)-4 {
			t.Fatalf("frame length %d of %d bytes", binary.BigEndian.Uint32(f), len(f))
		}
		stream = append(stream, f...)
	}

	info, ok := runtime.SerializerInfoForMediaType(serializer.NewCodecFactory(clientscheme.Scheme).SupportedMediaTypes(), MediaProtobuf)
	if !ok {
		t.Fatal("no protobuf")
	}
	frames := info.StreamSerializer.Framer.NewFrameReader(readCloser{bytes.NewReader(stream)})
	dec := restwatch.NewDecoder(streaming.NewDecoder(frames, info.StreamSerializer.Serializer), info.Serializer)
	typ, obj, err := dec.Decode()
	if err != nil || typ != watch.Added || !reflect.DeepEqual(obj.(*corev1.Pod).Spec, pod.Spec) || obj.(*corev1.Pod).Name != "web-0" {
		t.Fatalf("ADDED: %v %v %v", typ, obj, err)
	}
	typ, obj, err = dec.Decode()
	if err != nil || typ != watch.Bookmark || obj.(*corev1.Pod).ResourceVersion != "50" ||
		obj.(*corev1.Pod).Annotations[metav1.InitialEventsAnnotationKey] != "true" {
		t.Fatalf("BOOKMARK: %v %v %v", typ, obj, err)
	}
	typ, obj, err = dec.Decode()
	if err != nil || typ != watch.Error || obj.(*metav1.Status).Code != 410 {
		t.Fatalf("ERROR: %v %v %v", typ, obj, err)
	}

	if got := string(JSONWatchEvent("ADDED", []byte("{\"a\":1}\n"))); got != "{\"type\":\"ADDED\",\"object\":{\"a\":1}}\n" {
		t.Errorf("JSON event: %q", got)
	}
}

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }

// Golden bytes: what kube-apiserver v1.37.2 answered for the same requests
// (an empty namespace at resourceVersion 60; GET of a missing
// ServiceAccount), read from a running one.
func TestKubeAPIServerBytes(t *testing.T) {
	c := newTestCodec(t, nil)
	lm := metav1.ListMeta{ResourceVersion: "60"}
	ann := map[string]string{metav1.InitialEventsAnnotationKey: "true"}
	list, err := c.TypedList(podGVK, nil, lm)
	if err != nil {
		t.Fatal(err)
	}
	meta, _ := MetadataList(nil, false, metav1.SchemeGroupVersion, lm)
	bm, _ := c.BookmarkObject(podGVK, "60", ann)
	pom := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "60", Annotations: ann}}
	pom.SetGroupVersionKind(metav1.SchemeGroupVersion.WithKind(KindPartialObjectMetadata))
	notFound := apierrors.NewNotFound(schema.GroupResource{Resource: "serviceaccounts"}, "nope").Status()
	notFound.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
	frame := func(typ string, obj runtime.Object) []byte {
		b, err := c.Encode(MediaProtobuf, false, obj)
		if err != nil {
			t.Fatal(err)
		}
		f, err := WatchEvent(MediaProtobuf, typ, b)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	for _, tc := range []struct {
		name string
		got  []byte
		want string
	}{
		{"PodList", must(c.Encode(MediaProtobuf, false, list)), "k8s\x00\n\r\n\x02v1\x12\aPodList\x12\n\n\b\n\x00\x12\x0260\x1a\x00\x1a\x00\"\x00"},
		{"PartialObjectMetadataList", must(c.Encode(MediaProtobuf, false, meta)), "k8s\x00\n+\n\x0emeta.k8s.io/v1\x12\x19PartialObjectMetadataList\x12\n\n\b\n\x00\x12\x0260\x1a\x00\x1a\x00\"\x00"},
		{"Pod bookmark", frame("BOOKMARK", bm), "\x00\x00\x00\x8e\n\bBOOKMARK\x12\x81\x01\n\x7fk8s\x00\n\t\n\x02v1\x12\x03Pod\x12j\n5\n\x00\x12\x00\x1a\x00\"\x00*\x002\x02608\x00B\x00b!\n\x19k8s.io/initial-events-end\x12\x04true\x12\x1c\x1a\x002\x00B\x00J\x00R\x00X\x00`\x00h\x00\x82\x01\x00\x8a\x01\x00\x9a\x01\x00\xc2\x01\x00\x1a\x13\n\x00\x1a\x00\"\x00*\x002\x00J\x00Z\x00r\x00\x88\x01\x00\x1a\x00\"\x00"},
		{"metadata bookmark", frame("BOOKMARK", pom), "\x00\x00\x00x\n\bBOOKMARK\x12l\njk8s\x00\n'\n\x0emeta.k8s.io/v1\x12\x15PartialObjectMetadata\x127\n5\n\x00\x12\x00\x1a\x00\"\x00*\x002\x02608\x00B\x00b!\n\x19k8s.io/initial-events-end\x12\x04true\x1a\x00\"\x00"},
		{"Status", must(c.Encode(MediaProtobuf, false, &notFound)), "k8s\x00\n\f\n\x02v1\x12\x06Status\x12_\n\x06\n\x00\x12\x00\x1a\x00\x12\aFailure\x1a serviceaccounts \"nope\" not found\"\bNotFound*\x1d\n\x04nope\x12\x00\x1a\x0fserviceaccounts(\x002\x000\x94\x03\x1a\x00\"\x00"},
		{"JSON Pod bookmark", must(c.Encode(MediaJSON, false, bm)), `{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"60","annotations":{"k8s.io/initial-events-end":"true"}},"spec":{"containers":null},"status":{}}` + "\n"},
		{"JSON empty metadata list", must(c.Encode(MediaJSON, false, meta)), `{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"60"},"items":null}` + "\n"},
	} {
		if string(tc.got) != tc.want {
			t.Errorf("%s:\n got %q\nwant %q", tc.name, tc.got, tc.want)
		}
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// FuzzServed: whatever bytes the cache hands out, the encoders answer an
// error or an encoding, never a panic.
func FuzzServed(f *testing.F) {
	c := newTestCodec(f, nil)
	f.Add(must(c.EncodeJSON(testPod("a"))), false)
	f.Add([]byte(`{"metadata":{"creationTimestamp":"x"}}`), true)
	f.Add([]byte(`{"kind":"Pod","apiVersion":"v1","spec":{"containers":[{"resources":{"limits":{"cpu":"1e1000"}}}]}}`), false)
	f.Fuzz(func(t *testing.T, data []byte, custom bool) {
		if o, err := c.DecodeServed(podGVK, data); err == nil {
			if _, err := c.Encode(MediaProtobuf, false, o); err != nil {
				t.Fatalf("decoded but does not encode: %v", err)
			}
		}
		if p, err := Metadata(data, custom, metav1.SchemeGroupVersion); err == nil {
			if _, err := c.Encode(MediaProtobuf, false, p); err != nil {
				t.Fatalf("metadata does not encode: %v", err)
			}
		}
		_, _ = FromJSON(MediaYAML, false, data)
		_, _ = FromJSON(MediaJSON, true, data)
	})
}
