package fanout

import (
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"herald.dev/libs/kube"
	"herald.dev/libs/kube/printers"
	"herald.dev/libs/kube/request"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/storage"
)

// item is one event as the fanout holds it: the cache's prepared event and
// its wire encodings, each made at most once and shared by every watcher
// (encode once, write many).
type item struct {
	ev    *heraldv1.Event
	lines [4]atomic.Pointer[[]byte] // by request.Transition-1
	// encs: the item's other encodings (encoding.go), made under mu;
	// encErr: why one of them could not be made (the object does not
	// decode), so that it is tried and logged once.
	mu     sync.Mutex
	encs   map[encKey][]byte
	encErr error

	// tp: the fanout.dispatch span's traceparent when the event is sampled
	// (set before dispatch); traced: a stream has written its trace context.
	tp     string
	traced atomic.Bool

	// seq numbers a hub's items in the order it dispatched them (from 1):
	// the ring holds consecutive ones.
	seq int64

	// shared: a hub's item, which every watcher of the resource may write
	// (a catch-up's is its stream's alone): a session sends its encodings
	// once (stream.event), if more than one watcher was handed it (wanted,
	// counted up to 2, see sharedByMany).
	shared bool
	wanted atomic.Int32
}

// handed counts a watcher the item was queued to (watcher.push: dispatch
// and the catch-up of one that is behind) or written to from the ring when
// it joined (hub.join).
func (it *item) handed() {
	if it.wanted.Load() < 2 {
		it.wanted.Add(1)
	}
}

// sharedByMany reports whether a session sends the item's encodings as
// shared bytes, which every watch of the session that gets them refers to.
// Only a hub's item queued to more than one watcher: one that a single
// watcher gets (a kubelet's pod, watched by its node only) goes as that
// watch's own bytes, which cost the session less than a shared frame and
// its reference and would only take room in the session's window of
// shared bytes from events that many of its watches get; a second watcher
// handed it later (joining from the ring, or catching up) makes it shared
// from then on. A writer that takes an event while dispatch is still
// handing it to the other watchers may send it as its own: both are
// correct, the bytes are the same.
func (it *item) sharedByMany() bool { return it.shared && it.wanted.Load() > 1 }

func newItem(ev *heraldv1.Event) *item { return &item{ev: ev} }

// cost estimates the memory an item holds in the ring: its objects as
// received, about as much again once encoded for watchers, and the labels,
// fields and bookkeeping.
func (it *item) cost() int {
	return 2*(len(it.ev.Object)+len(it.ev.PrevObject)) + len(it.ev.ObjectProtobuf) + 512
}

var typeNames = [...]string{request.AsAdded: "ADDED", request.AsModified: "MODIFIED", request.AsDeleted: "DELETED", request.AsDeletedPrev: "DELETED"}

func kindOf(t heraldv1.EventType) string {
	switch t {
	case heraldv1.EventType_ADDED:
		return "ADDED"
	case heraldv1.EventType_MODIFIED:
		return "MODIFIED"
	case heraldv1.EventType_DELETED:
		return "DELETED"
	}
	return "BOOKMARK"
}

// object returns the object a watcher sees for transition t.
func (it *item) object(t request.Transition) []byte {
	if t == request.AsDeletedPrev {
		return it.ev.PrevObject
	}
	return it.ev.Object
}

// line returns the JSON watch line for transition t.
func (it *item) line(t request.Transition) []byte {
	slot := &it.lines[t-1]
	if p := slot.Load(); p != nil {
		return *p
	}
	b := encodeLine(typeNames[t], it.object(t))
	if !slot.CompareAndSwap(nil, &b) {
		// Another watcher encoded it meanwhile: share its bytes.
		return *slot.Load()
	}
	return b
}

func encodeLine(typ string, obj []byte) []byte { return storage.JSONWatchEvent(typ, obj) }

// transition decides what a watcher with selector sel sees of it.
func (it *item) transition(sel *request.Selector) request.Transition {
	ev := it.ev
	if sel.Namespace != "" && ev.Namespace != sel.Namespace {
		return request.Skip
	}
	kind := kindOf(ev.Type)
	if sel.Empty {
		return request.Decide(kind, true, true)
	}
	cur := sel.Matches(ev.Namespace, ev.LabelPairs(), ev.FieldPairs())
	prev := false
	switch {
	case ev.Type != heraldv1.EventType_MODIFIED:
	case ev.PrevUnchanged: // no previous state on the wire: it selects alike
		prev = cur
	default:
		prev = sel.Matches(ev.Namespace, ev.PrevLabelPairs(), ev.PrevFieldPairs())
	}
	return request.Decide(kind, cur, prev)
}

// bookmarkLine encodes a BOOKMARK: an object of the resource's kind with
// only resourceVersion set (and the initial-events-end annotation when
// initialEnd).
func bookmarkLine(r *kube.Resource, rev int64, initialEnd bool) []byte {
	meta := map[string]any{"resourceVersion": formatRev(rev)}
	if initialEnd {
		meta["annotations"] = map[string]string{metav1.InitialEventsAnnotationKey: "true"}
	}
	obj, _ := json.Marshal(map[string]any{"kind": r.Kind, "apiVersion": r.GroupVersion(), "metadata": meta})
	return encodeLine("BOOKMARK", obj)
}

// tableBookmarkLine encodes a BOOKMARK of a Table watch as kube-apiserver
// does: it turns a bookmark's object into a Table as any event's (one row,
// its cells the printer's for an empty object, its PartialObjectMetadata
// carrying resourceVersion and the initial-events-end annotation, which a
// WatchList client looks for there), with the column definitions when it
// is the stream's first event.
func tableBookmarkLine(r *kube.Resource, rev int64, initialEnd, withColumns bool, now time.Time) []byte {
	// The row's metadata in ObjectMeta's field order (resourceVersion,
	// then annotations), as kube-apiserver's PartialObjectMetadata has it.
	var meta struct {
		ResourceVersion string            `json:"resourceVersion"`
		Annotations     map[string]string `json:"annotations,omitempty"`
	}
	meta.ResourceVersion = formatRev(rev)
	if initialEnd {
		meta.Annotations = map[string]string{metav1.InitialEventsAnnotationKey: "true"}
	}
	obj, _ := json.Marshal(map[string]any{"kind": r.Kind, "apiVersion": r.GroupVersion(), "metadata": meta})
	return tableLine(r, "BOOKMARK", obj, withColumns, now)
}

// tableLine encodes an event for a watcher that asked for Tables (now: for
// the age column).
func tableLine(r *kube.Resource, typ string, obj []byte, withColumns bool, now time.Time) []byte {
	// kube-apiserver's table of one object carries that object's
	// resourceVersion (its table convertors read it with CommonAccessor).
	var o struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	_ = json.Unmarshal(obj, &o)
	return encodeLine(typ, printers.Table(r, [][]byte{obj}, metav1.ListMeta{ResourceVersion: o.Metadata.ResourceVersion}, withColumns, now))
}
