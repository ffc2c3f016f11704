package loadgen

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// The protobuf pods are what kube-apiserver stores: apimachinery decodes
// the envelope into the same pod as the JSON one, write time included.
func TestProtobufPods(t *testing.T) {
	js, pb := NewPods(3, 3), NewProtobufPods(3, 3)
	at := time.Unix(0, 1_790_000_000_123_456_789)
	v := pb.value(2, at)
	if !strings.HasPrefix(v, "k8s\x00") || len(v) >= len(js.value(2, at)) {
		t.Fatalf("protobuf value of %d bytes (JSON %d), prefix %q", len(v), len(js.value(2, at)), v[:min(len(v), 4)])
	}
	var pod corev1.Pod
	if _, _, err := podCodec.Decode([]byte(v), nil, &pod); err != nil {
		t.Fatal(err)
	}
	if pod.Name != "pod-00002" || pod.Namespace != "ns-2" || pod.Spec.NodeName != "node-2" || pod.Status.PodIP != "10.1.0.2" ||
		pod.Annotations[WrittenAtAnnotation] != "1790000000123456789" || pod.Spec.Containers[0].Resources.Requests.Cpu().String() != "100m" {
		t.Fatalf("decoded pod %+v", pod)
	}
	// Every write time has the template's length, so the envelope stays
	// well-formed (an early time is zero-padded).
	if _, _, err := podCodec.Decode([]byte(pb.value(1, time.Unix(0, 42))), nil, &pod); err != nil || pod.Annotations[WrittenAtAnnotation] != "0000000000000000042" {
		t.Fatalf("early write time: %v, %q", err, pod.Annotations[WrittenAtAnnotation])
	}
}

// The watcher reads kube-apiserver's protobuf watch framing: a 4-byte
// length, then a raw WatchEvent whose object is in the envelope; bookmarks
// are skipped, an ERROR event ends the stream, and a stream that ends
// between frames is resumable.
func TestWatcherProtobufFrames(t *testing.T) {
	p := NewProtobufPods(3, 3)
	at := time.Now().Add(-5 * time.Millisecond)
	frame := func(typ string, obj runtime.Object) []byte {
		var raw bytes.Buffer
		if err := podCodec.Encode(obj, &raw); err != nil {
			t.Fatal(err)
		}
		b, err := (&metav1.WatchEvent{Type: typ, Object: runtime.RawExtension{Raw: raw.Bytes()}}).Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...)
	}
	pod := func(i int, rv int64) *corev1.Pod {
		var pod corev1.Pod
		if _, _, err := podCodec.Decode([]byte(p.value(i, at)), nil, &pod); err != nil {
			t.Fatal(err)
		}
		pod.ResourceVersion = strconv.FormatInt(rv, 10)
		return &pod
	}
	bookmark := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: metav1.ObjectMeta{ResourceVersion: "45"}}
	var stream []byte
	stream = append(stream, frame("ADDED", pod(0, 42))...)
	stream = append(stream, frame("BOOKMARK", bookmark)...)
	stream = append(stream, frame("MODIFIED", pod(1, 44))...)
	stream = append(stream, frame("DELETED", pod(2, 43))...)
	w := &watcher{node: -1, protobuf: true}
	if !w.read(context.Background(), io.NopCloser(bytes.NewReader(stream))) || w.err != nil {
		t.Fatalf("a stream ending between frames is not resumable: %v", w.err)
	}
	if got := w.revs; len(got) != 3 || got[0] != 42 || got[1] != 44 || got[2] != 43 || reordered(got) != 1 {
		t.Fatalf("revs %v (reordered %d), want [42 44 43] with one reordered", got, reordered(got))
	}
	for i, l := range w.lat {
		if l < 5000 || l > 60_000_000 {
			t.Fatalf("latency %d µs of event %d, want about 5 ms", l, i)
		}
	}
	if w.size[0] != int32(len(frame("ADDED", pod(0, 42)))) {
		t.Fatalf("size %d, want the frame's %d bytes", w.size[0], len(frame("ADDED", pod(0, 42))))
	}

	gone := &metav1.Status{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"}, Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonExpired, Message: "too old resource version"}
	w = &watcher{node: -1, protobuf: true}
	if w.read(context.Background(), io.NopCloser(bytes.NewReader(frame("ERROR", gone)))) || w.err == nil || !strings.Contains(w.err.Error(), "410") {
		t.Fatalf("ERROR event: resumable or %v", w.err)
	}
	w = &watcher{node: -1, protobuf: true}
	if w.read(context.Background(), io.NopCloser(bytes.NewReader([]byte{0, 0, 0, 3, 1, 2, 3}))) || w.err == nil {
		t.Fatalf("garbage frame: resumable or %v", w.err)
	}
}
