package loadgen

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes/scheme"
)

// Protobuf watch streams, read as client-go reads them with
// ContentType application/vnd.kubernetes.protobuf: each event is a frame of
// a 4-byte big-endian length and a metav1.WatchEvent in raw protobuf (no
// envelope), whose object is the pod in the "k8s\x00" envelope. Unlike JSON
// lines, the frames are decoded with apimachinery's generated code and
// serializer (a kubelet decodes every pod it receives too; this client's CPU
// is reported apart from the servers').

const protobufMediaType = "application/vnd.kubernetes.protobuf"

// maxFrame bounds one frame (kube-apiserver's own limit for a request body
// is 3 MiB; a pod here is under 1 KB).
const maxFrame = 16 << 20

var podCodec = protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)

// readFrames consumes a protobuf watch stream; true means the server ended
// it between frames without an error event (resumable).
func (w *watcher) readFrames(ctx context.Context, br *bufio.Reader) (closedByServer bool) {
	var head [4]byte
	var frame []byte
	for {
		if _, err := io.ReadFull(br, head[:]); err != nil {
			return ctx.Err() == nil // as for JSON lines: resumed
		}
		n := binary.BigEndian.Uint32(head[:])
		if n > maxFrame {
			w.err = fmt.Errorf("protobuf watch frame of %d bytes", n)
			return false
		}
		if cap(frame) < int(n) {
			frame = make([]byte, n)
		}
		frame = frame[:n]
		if _, err := io.ReadFull(br, frame); err != nil {
			return ctx.Err() == nil // the connection ended mid-frame: resumed from the last event
		}
		if e := w.protobufEvent(frame, time.Now()); e != nil {
			w.err = e
			return false
		}
	}
}

// protobufEvent decodes one frame and records its pod's resourceVersion
// and write time.
func (w *watcher) protobufEvent(frame []byte, now time.Time) error {
	var ev metav1.WatchEvent
	if err := ev.Unmarshal(frame); err != nil {
		return fmt.Errorf("not a protobuf watch event: %w", err)
	}
	switch ev.Type {
	case "BOOKMARK":
		return nil
	case "ERROR":
		obj, _, err := podCodec.Decode(ev.Object.Raw, nil, nil)
		if err != nil {
			return fmt.Errorf("ERROR event (undecodable: %v)", err)
		}
		return fmt.Errorf("ERROR event: %.300v", obj)
	case "ADDED", "MODIFIED", "DELETED":
	default:
		return fmt.Errorf("watch event of type %q", ev.Type)
	}
	var pod corev1.Pod
	if _, _, err := podCodec.Decode(ev.Object.Raw, nil, &pod); err != nil {
		return fmt.Errorf("%s event: pod: %w", ev.Type, err)
	}
	rv, _ := strconv.ParseInt(pod.ResourceVersion, 10, 64)
	at, _ := strconv.ParseInt(pod.Annotations[WrittenAtAnnotation], 10, 64)
	if rv <= 0 || at <= 0 {
		return fmt.Errorf("%s event of %s/%s without resourceVersion or %s", ev.Type, pod.Namespace, pod.Name, WrittenAtAnnotation)
	}
	w.record(rv, at, 4+len(frame), now) // the length prefix included
	return nil
}
