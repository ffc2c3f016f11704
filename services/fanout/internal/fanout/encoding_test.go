package fanout

import (
	"bytes"
	"encoding/binary"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"herald.dev/libs/kube"
	"herald.dev/libs/kube/negotiate"
	"herald.dev/libs/kube/request"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/storage"
)

func testEncoder(t *testing.T, r *kube.Resource) *encoder {
	t.Helper()
	codec, err := storage.NewCodec(nil)
	if err != nil {
		t.Fatal(err)
	}
	gvk := r.GroupVersionKind()
	return &encoder{codec: codec, res: r, gvk: gvk, custom: !codec.Typed(gvk), now: time.Now, log: slog.New(slog.DiscardHandler)}
}

const podJSON = `{"apiVersion":"v1","kind":"Pod","metadata":{"labels":{"app":"web"},"name":"web-0","namespace":"default","resourceVersion":"12"},"spec":{"containers":[{"image":"i","name":"c"}],"nodeName":"n1"},"status":{"phase":"Running"}}`

// frame reads one protobuf watch frame.
func frame(t *testing.T, b []byte) metav1.WatchEvent {
	t.Helper()
	if len(b) < 4 || int(binary.BigEndian.Uint32(b)) != len(b)-4 {
		t.Fatalf("not one length-delimited frame: %q", b)
	}
	var ev metav1.WatchEvent
	if err := ev.Unmarshal(b[4:]); err != nil {
		t.Fatal(err)
	}
	return ev
}

// Each encoding of an event is made once and the same bytes go to every
// watcher that wants it, whichever goroutine asks first.
func TestEncodedOncePerEvent(t *testing.T) {
	pods := &kube.Resource{Version: "v1", Kind: "Pod", Plural: "pods", Namespaced: true}
	e := testEncoder(t, pods)
	it := newItem(&heraldv1.Event{Type: heraldv1.EventType_MODIFIED, Revision: 12, Namespace: "default", Name: "web-0",
		Object: []byte(podJSON), PrevObject: []byte(strings.Replace(podJSON, `"12"`, `"11"`, 1))})
	formats := []format{
		jsonLines,
		{mt: storage.MediaProtobuf},
		{mt: storage.MediaJSON, as: storage.KindPartialObjectMetadata, gv: metav1.SchemeGroupVersion},
		{mt: storage.MediaProtobuf, as: storage.KindPartialObjectMetadata, gv: schema.GroupVersion{Group: "meta.k8s.io", Version: "v1beta1"}},
		{mt: storage.MediaJSON, as: storage.KindTable},
	}
	for _, f := range formats {
		for _, tr := range []request.Transition{request.AsModified, request.AsDeletedPrev} {
			var wg sync.WaitGroup
			got := make([][]byte, 8)
			for i := range got {
				wg.Go(func() {
					b, err := e.encoded(it, f, tr, true)
					if err != nil {
						t.Error(err)
					}
					got[i] = b
				})
			}
			wg.Wait()
			for _, b := range got[1:] {
				if len(b) == 0 || &b[0] != &got[0][0] {
					t.Fatalf("%+v %v: watchers got different encodings", f, tr)
				}
			}
		}
	}

	ev := frame(t, must(e.encoded(it, format{mt: storage.MediaProtobuf}, request.AsDeletedPrev, false)))
	obj, err := e.codec.DecodeServed(e.gvk, []byte(podJSON))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := e.codec.EncodeProtobuf(obj)
	if ev.Type != "DELETED" || !bytes.HasPrefix(ev.Object.Raw, []byte("k8s\x00")) || len(ev.Object.Raw) != len(want) {
		t.Fatalf("protobuf DELETED: %q %d bytes, want %d", ev.Type, len(ev.Object.Raw), len(want))
	}
	line := string(must(e.encoded(it, formats[2], request.AsModified, false)))
	if !strings.HasPrefix(line, `{"type":"MODIFIED","object":{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"web-0","namespace":"default","resourceVersion":"12"`) ||
		!strings.HasSuffix(line, "}}\n") || strings.Count(line, "\n") != 1 {
		t.Fatalf("metadata line: %q", line)
	}
	ev = frame(t, must(e.encoded(it, formats[3], request.AsModified, false)))
	if !bytes.Contains(ev.Object.Raw, []byte("meta.k8s.io/v1beta1")) || !bytes.Contains(ev.Object.Raw, []byte("web-0")) {
		t.Fatalf("protobuf metadata: %q", ev.Object.Raw)
	}

	// kube-apiserver ends a watch asking for PartialObjectMetadataList at
	// its first event.
	poml := format{mt: storage.MediaJSON, as: storage.KindPartialObjectMetadataList, gv: metav1.SchemeGroupVersion}
	if _, err := e.encoded(it, poml, request.AsModified, false); err != errWatchAsList {
		t.Errorf("metadata list event: %v", err)
	}
	if _, err := e.bookmark(poml, 12, true); err != errWatchAsList {
		t.Errorf("metadata list bookmark: %v", err)
	}

	// A value that is not a pod ends the stream with an error, never a
	// wrong object.
	bad := newItem(&heraldv1.Event{Type: heraldv1.EventType_ADDED, Revision: 13, Object: []byte(`{"metadata":[]}`)})
	if _, err := e.encoded(bad, format{mt: storage.MediaProtobuf}, request.AsAdded, false); err == nil {
		t.Error("undecodable object encoded")
	}
}

// A protobuf watcher's event is framed around the cache's protobuf of the
// object when the event carries one (the object itself, never its previous
// state), and the JSON is decoded only when it does not.
func TestProtobufFromCache(t *testing.T) {
	pods := &kube.Resource{Version: "v1", Kind: "Pod", Plural: "pods", Namespaced: true}
	e := testEncoder(t, pods)
	obj, err := e.codec.DecodeServed(e.gvk, []byte(podJSON))
	if err != nil {
		t.Fatal(err)
	}
	want := must(e.codec.EncodeProtobuf(obj))
	// A marker the JSON could never encode to: the frame must carry the
	// cache's bytes, not a new encoding.
	fromCache := append([]byte("k8s\x00"), "cache's own encoding"...)
	it := newItem(&heraldv1.Event{Type: heraldv1.EventType_MODIFIED, Revision: 12, Namespace: "default", Name: "web-0",
		Object: []byte(podJSON), PrevObject: []byte(podJSON), ObjectProtobuf: fromCache})
	pb := format{mt: storage.MediaProtobuf}
	if ev := frame(t, must(e.encoded(it, pb, request.AsModified, false))); ev.Type != "MODIFIED" || !bytes.Equal(ev.Object.Raw, fromCache) {
		t.Fatalf("MODIFIED: %s %q, want the cache's %q", ev.Type, ev.Object.Raw, fromCache)
	}
	if ev := frame(t, must(e.encoded(it, pb, request.AsDeletedPrev, false))); ev.Type != "DELETED" || !bytes.Equal(ev.Object.Raw, want) {
		t.Fatalf("DELETED of the previous object: %s %q, want %q", ev.Type, ev.Object.Raw, want)
	}
	// Other formats of the object never take the protobuf bytes.
	line := string(must(e.encoded(it, jsonLines, request.AsModified, false)))
	if line != `{"type":"MODIFIED","object":`+podJSON+"}\n" {
		t.Fatalf("JSON line %q", line)
	}
	meta := frame(t, must(e.encoded(it, format{mt: storage.MediaProtobuf, as: storage.KindPartialObjectMetadata, gv: metav1.SchemeGroupVersion}, request.AsModified, false)))
	if bytes.Contains(meta.Object.Raw, []byte("cache's own")) || !bytes.Contains(meta.Object.Raw, []byte("PartialObjectMetadata")) {
		t.Fatalf("metadata: %q", meta.Object.Raw)
	}
	// Without it, the object is made from the JSON (initial state,
	// replays, DELETED events).
	plain := newItem(&heraldv1.Event{Type: heraldv1.EventType_ADDED, Revision: 12, Namespace: "default", Name: "web-0", Object: []byte(podJSON)})
	if ev := frame(t, must(e.encoded(plain, pb, request.AsAdded, false))); !bytes.Equal(ev.Object.Raw, want) {
		t.Fatalf("ADDED from JSON: %q, want %q", ev.Object.Raw, want)
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// Bookmarks and errors follow the stream's format.
func TestBookmarkAndErrorEvents(t *testing.T) {
	pods := &kube.Resource{Version: "v1", Kind: "Pod", Plural: "pods", Namespaced: true}
	e := testEncoder(t, pods)
	pb := format{mt: storage.MediaProtobuf}
	ev := frame(t, must(e.bookmark(pb, 40, true)))
	if ev.Type != "BOOKMARK" || !bytes.Contains(ev.Object.Raw, []byte(metav1.InitialEventsAnnotationKey)) || !bytes.Contains(ev.Object.Raw, []byte("40")) {
		t.Fatalf("protobuf bookmark: %q %q", ev.Type, ev.Object.Raw)
	}
	// kube-apiserver v1.37's bytes for the same bookmark.
	if got := string(must(e.bookmark(jsonLines, 60, true))); got != `{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"60","annotations":{"k8s.io/initial-events-end":"true"}},"spec":{"containers":null},"status":{}}}`+"\n" {
		t.Fatalf("JSON bookmark: %s", got)
	}
	widgets := testEncoder(t, &kube.Resource{Group: "example.com", Version: "v1", Kind: "Widget", Plural: "widgets", Namespaced: true})
	if got := string(must(widgets.bookmark(jsonLines, 60, false))); got != `{"type":"BOOKMARK","object":{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"resourceVersion":"60"}}}`+"\n" {
		t.Fatalf("custom resource bookmark: %s", got)
	}
	// A Table watch's bookmark is a Table, as kube-apiserver v1.37 sends it
	// (bytes of its WatchList of secrets as Tables): a WatchList client
	// reads the annotation from the row's object (Kubernetes' e2e test "API
	// Streaming ... server supports sending resources in Table format").
	secrets := testEncoder(t, &kube.Resource{Version: "v1", Kind: "Secret", Plural: "secrets", Namespaced: true})
	table := format{mt: storage.MediaJSON, as: storage.KindTable, gv: metav1.SchemeGroupVersion}
	if got := string(must(secrets.bookmark(table, 249, true))); got != `{"type":"BOOKMARK","object":{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"249"},"columnDefinitions":null,"rows":[{"cells":["","",0,"\u003cunknown\u003e"],"object":{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"249","annotations":{"k8s.io/initial-events-end":"true"}}}}]}}`+"\n" {
		t.Fatalf("Table bookmark: %s", got)
	}
	// The first event of the stream carries the column definitions, a
	// bookmark as any other.
	if got := string(tableBookmarkLine(secrets.res, 249, false, true, time.Now())); !strings.Contains(got, `"columnDefinitions":[{"name":"Name"`) {
		t.Fatalf("first Table bookmark: %s", got)
	}
	pom := format{mt: storage.MediaJSON, as: storage.KindPartialObjectMetadata, gv: metav1.SchemeGroupVersion}
	if got := string(must(e.bookmark(pom, 40, false))); got != `{"type":"BOOKMARK","object":{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"40"}}}`+"\n" {
		t.Fatalf("metadata bookmark: %s", got)
	}
	ev = frame(t, e.errorEvent(pb, kube.TooOld(3, 9)))
	if ev.Type != "ERROR" || !bytes.Contains(ev.Object.Raw, []byte("too old resource version: 3 (9)")) {
		t.Fatalf("protobuf error: %q %q", ev.Type, ev.Object.Raw)
	}
	if got := string(e.errorEvent(jsonLines, kube.TooOld(3, 9))); !strings.Contains(got, `"code":410`) {
		t.Fatalf("JSON error: %s", got)
	}
}

// A watch's format is kube-apiserver's negotiation; what it refuses is a
// 406.
func TestNegotiateWatch(t *testing.T) {
	s := &Server{neg: negotiate.NewNegotiator()}
	var err error
	if s.codec, err = storage.NewCodec(nil); err != nil {
		t.Fatal(err)
	}
	pods := &kube.Resource{Version: "v1", Kind: "Pod", Plural: "pods", Namespaced: true}
	widgets := &kube.Resource{Group: "example.com", Version: "v1", Kind: "Widget", Plural: "widgets", Namespaced: true}
	for _, tc := range []struct {
		res    *kube.Resource
		accept string
		want   format
		ct     string
		code   int32
	}{
		{pods, "", jsonLines, "application/json", 0},
		{pods, "application/vnd.kubernetes.protobuf", format{mt: storage.MediaProtobuf}, "application/vnd.kubernetes.protobuf;stream=watch", 0},
		{pods, "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
			format{mt: storage.MediaJSON, as: storage.KindPartialObjectMetadataList, gv: metav1.SchemeGroupVersion}, "application/json", 0},
		{pods, "application/json;as=Table;g=meta.k8s.io;v=v1", format{mt: storage.MediaJSON, as: storage.KindTable, gv: metav1.SchemeGroupVersion},
			"application/json", 0},
		{pods, "application/yaml", format{}, "", 406},
		{widgets, "application/vnd.kubernetes.protobuf", format{}, "", 406},
		{widgets, "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
			format{mt: storage.MediaProtobuf, as: storage.KindPartialObjectMetadata, gv: metav1.SchemeGroupVersion},
			"application/vnd.kubernetes.protobuf;stream=watch", 0},
	} {
		f, err := s.negotiate(tc.accept, tc.res)
		if tc.code != 0 {
			if !apierrors.IsNotAcceptable(err) {
				t.Errorf("%s %q: %+v %v, want 406", tc.res.Plural, tc.accept, f, err)
			}
			continue
		}
		if err != nil || f != tc.want || f.contentType() != tc.ct {
			t.Errorf("%s %q: %+v %v, want %+v (%s)", tc.res.Plural, tc.accept, f, err, tc.want, tc.ct)
		}
	}
}

// BenchmarkProtobufEvent: the fanout's cost of one event's protobuf frame,
// made once per event and shared by its watchers: from the cache's
// JSON (decode into the typed object, encode it) or around the cache's own
// protobuf of the object (object_protobuf). Compare with benchstat.
func BenchmarkProtobufEvent(b *testing.B) {
	pods := &kube.Resource{Version: "v1", Kind: "Pod", Plural: "pods", Namespaced: true}
	codec, err := storage.NewCodec(nil)
	if err != nil {
		b.Fatal(err)
	}
	gvk := pods.GroupVersionKind()
	e := &encoder{codec: codec, res: pods, gvk: gvk, now: time.Now, log: slog.New(slog.DiscardHandler)}
	obj, err := codec.DecodeServed(gvk, []byte(podJSON))
	if err != nil {
		b.Fatal(err)
	}
	pb := must(codec.EncodeProtobuf(obj))
	for _, tc := range []struct {
		name string
		pb   []byte
	}{{"fromJSON", nil}, {"fromCache", pb}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				it := newItem(&heraldv1.Event{Type: heraldv1.EventType_MODIFIED, Revision: 12, Object: []byte(podJSON), ObjectProtobuf: tc.pb})
				if _, err := e.encoded(it, format{mt: storage.MediaProtobuf}, request.AsModified, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
