package fanout

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"herald.dev/libs/kube"
	"herald.dev/libs/kube/request"
	"herald.dev/libs/storage"
)

// Watch encodings. A watch is negotiated as kube-apiserver negotiates it
// (libs/storage: the first step, then the stream's); its format says how
// each event is written. Every encoding of an event is made at most once per
// event and shared by every watcher that wants it (item.encoded): the JSON
// of a built-in object is decoded into its Go type once per event, and its
// protobuf, PartialObjectMetadata and Table forms once per event and
// transition, whatever the number of watchers.

// format is how one watch stream writes its events.
type format struct {
	// mt is the stream's media type: storage.MediaJSON or MediaProtobuf.
	mt string
	// as is the transformation of every object: "", KindTable,
	// KindPartialObjectMetadata or KindPartialObjectMetadataList (in
	// meta.k8s.io version gv). The last one cannot be encoded: see
	// errWatchAsList.
	as string
	gv schema.GroupVersion
}

// jsonLines is the default: every event the cache's JSON as is, the line
// shared through item.line.
var jsonLines = format{mt: storage.MediaJSON}

// contentType is the stream's Content-Type, kube-apiserver's: a JSON
// stream is application/json whatever it carries (Tables included), as
// k8s.io/apiserver's serveWatchHandler names the serializer's media type
// only.
func (f format) contentType() string {
	if f.mt == storage.MediaProtobuf {
		return storage.MediaProtobufWatch
	}
	return storage.MediaJSON
}

// cacheProtobuf reports whether the stream writes objects as the cache's
// protobuf (object_protobuf) when an event has it.
func (f format) cacheProtobuf() bool { return f.mt == storage.MediaProtobuf && f.as == "" }

// negotiate chooses the watch's format from its Accept header, or answers
// the 406 kube-apiserver would.
func (s *Server) negotiate(accept string, res *kube.Resource) (format, error) {
	custom := !s.codec.Typed(res.GroupVersionKind())
	// The negotiation reads the Accept header (and the URL, for pretty
	// printing, which a stream does not do).
	r := &http.Request{Header: http.Header{"Accept": {accept}}, URL: &url.URL{}}
	if _, err := s.neg.NegotiateOutput(r, custom); err != nil {
		return format{}, err
	}
	n, err := s.neg.NegotiateWatch(r, custom)
	if err != nil {
		return format{}, err
	}
	f := format{mt: n.MediaType}
	if n.Target != nil {
		f.as, f.gv = n.As(), n.Target.GroupVersion()
	}
	return f, nil
}

// errWatchAsList ends a watch that asked for PartialObjectMetadataList at
// its first event, bookmarks included, as kube-apiserver's does: it fails to
// turn an event's object into a list, falls back to the object, and then
// cannot encode that object with the meta.k8s.io encoder it chose for the
// list, so the stream ends (answered 200, empty).
var errWatchAsList = errors.New("a watch event's object cannot be encoded as a PartialObjectMetadataList")

// encKey names one encoding of an item: the embedded object alone (typ "")
// or a whole framed event.
type encKey struct {
	f    format
	prev bool   // the previous object (a selector's DELETED)
	typ  string // the event type of a frame; "" for the object alone
	cols bool   // a Table's first event, with column definitions
}

// encoder makes the encodings of items for one resource.
type encoder struct {
	codec  *storage.Codec
	res    *kube.Resource
	gvk    schema.GroupVersionKind
	custom bool
	now    func() time.Time
	log    *slog.Logger
}

func (s *Server) encoder(res *kube.Resource) *encoder {
	gvk := res.GroupVersionKind()
	return &encoder{codec: s.codec, res: res, gvk: gvk, custom: !s.codec.Typed(gvk), now: s.clock.Now, log: s.log}
}

// encoded returns the event of it a watcher with format f sees for
// transition t; cols asks a Table with its column definitions. It is made
// once per item and shared: the item's lock makes concurrent watchers wait
// for the first one's encoding rather than encode again.
func (e *encoder) encoded(it *item, f format, t request.Transition, cols bool) ([]byte, error) {
	switch {
	case f == jsonLines:
		return it.line(t), nil
	case f.as == storage.KindPartialObjectMetadataList:
		return nil, errWatchAsList
	}
	if f.as != storage.KindTable {
		cols = false
	}
	k := encKey{f: f, prev: t == request.AsDeletedPrev, typ: typeNames[t], cols: cols}
	it.mu.Lock()
	defer it.mu.Unlock()
	if b, ok := it.encs[k]; ok {
		return b, nil
	}
	if it.encErr != nil {
		return nil, it.encErr
	}
	var b []byte
	if f.as == storage.KindTable {
		b = tableLine(e.res, k.typ, it.object(t), cols, e.now())
	} else {
		obj, err := e.objectLocked(it, f, k.prev)
		if err == nil {
			b, err = storage.WatchEvent(f.mt, k.typ, obj)
		}
		if err != nil {
			// Once per event, however many watchers want it.
			it.encErr = err
			e.log.Error("encoding a watch event failed; ending the streams that need it", "resource", e.res.ID(),
				"namespace", it.ev.Namespace, "name", it.ev.Name, "revision", it.ev.Revision, "mediaType", f.mt, "err", err)
			return nil, err
		}
	}
	if it.encs == nil {
		it.encs = map[encKey][]byte{}
	}
	it.encs[k] = b
	return b, nil
}

// objectLocked is the embedded object of it (or of its previous object) in
// format f, made once per item. Called with it.mu held.
func (e *encoder) objectLocked(it *item, f format, prev bool) ([]byte, error) {
	k := encKey{f: f, prev: prev}
	if b, ok := it.encs[k]; ok {
		return b, nil
	}
	data := it.ev.Object
	if prev {
		data = it.ev.PrevObject
	}
	var obj runtime.Object
	switch {
	case f.cacheProtobuf() && !prev && len(it.ev.ObjectProtobuf) > 0 && !e.custom:
		// The cache encoded it from the object it decoded: the same
		// bytes as decoding the JSON and encoding that, without the
		// JSON decode (most of a protobuf watch event's cost).
		return it.ev.ObjectProtobuf, nil
	case f.as == storage.KindPartialObjectMetadata:
		p, err := storage.Metadata(data, e.custom, f.gv)
		if err != nil {
			return nil, err
		}
		obj = p
	case f.mt == storage.MediaJSON:
		return data, nil
	default:
		o, err := e.codec.DecodeServed(e.gvk, data)
		if err != nil {
			return nil, err
		}
		obj = o
	}
	b, err := e.codec.Encode(f.mt, false, obj)
	if err != nil {
		return nil, fmt.Errorf("encoding %s %s/%s at %d: %w", e.res.ID(), it.ev.Namespace, it.ev.Name, it.ev.Revision, err)
	}
	if it.encs == nil {
		it.encs = map[encKey][]byte{}
	}
	it.encs[k] = b
	return b, nil
}

// bookmark encodes a BOOKMARK: an object of the resource's kind (or its
// PartialObjectMetadata) with only resourceVersion set, and the
// initial-events-end annotation when initialEnd, as kube-apiserver encodes
// it (a built-in kind's empty object has its non-optional fields:
// "spec":{"containers":null}). A custom resource's (an unstructured object,
// its keys sorted) is bookmarkLine's; a Table watch's is a Table
// (tableBookmarkLine), here without column definitions (the stream asks
// for them when the bookmark is its first event).
func (e *encoder) bookmark(f format, rev int64, initialEnd bool) ([]byte, error) {
	switch {
	case f.as == storage.KindPartialObjectMetadataList:
		return nil, errWatchAsList
	case f.as == storage.KindTable:
		return tableBookmarkLine(e.res, rev, initialEnd, false, e.now()), nil
	case f.as == "" && e.custom:
		return bookmarkLine(e.res, rev, initialEnd), nil
	}
	rv := strconv.FormatInt(rev, 10)
	var ann map[string]string
	if initialEnd {
		ann = map[string]string{metav1.InitialEventsAnnotationKey: "true"}
	}
	var obj runtime.Object
	if f.as == storage.KindPartialObjectMetadata {
		p := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{ResourceVersion: rv, Annotations: ann}}
		p.SetGroupVersionKind(f.gv.WithKind(storage.KindPartialObjectMetadata))
		obj = p
	} else {
		o, err := e.codec.BookmarkObject(e.gvk, rv, ann)
		if err != nil {
			return nil, err
		}
		obj = o
	}
	b, err := e.codec.Encode(f.mt, false, obj)
	if err != nil {
		return nil, err
	}
	return storage.WatchEvent(f.mt, "BOOKMARK", b)
}

// errorEvent encodes err as an ERROR event: its Status, never transformed.
func (e *encoder) errorEvent(f format, err error) []byte {
	if f.mt != storage.MediaProtobuf {
		return kube.ErrorEvent(err)
	}
	st := kube.StatusOf(err)
	b, encErr := e.codec.Encode(f.mt, false, &st)
	if encErr == nil {
		b, encErr = storage.WatchEvent(f.mt, "ERROR", b)
	}
	if encErr != nil {
		// A Status always encodes; should it not, the stream just ends.
		return nil
	}
	return b
}

// bookmark writes a BOOKMARK at rev in the stream's format.
func (st *stream) bookmark(rev int64, initialEnd bool) {
	if st.f.as == storage.KindTable {
		st.raw(tableBookmarkLine(st.enc.res, rev, initialEnd, !st.tableCols, st.enc.now()))
		st.tableCols = true
		return
	}
	b, err := st.enc.bookmark(st.f, rev, initialEnd)
	if err != nil {
		if st.err == nil {
			st.err = err
		}
		return
	}
	st.raw(b)
}
