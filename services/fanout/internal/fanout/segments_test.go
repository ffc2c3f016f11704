package fanout

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"herald.dev/libs/kube/request"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/watchsession"
)

// segmentRecorder is a session stream's ResponseWriter that records each
// WriteSegments.
type segmentRecorder struct {
	h      http.Header
	writes [][]watchsession.Segment
}

func (w *segmentRecorder) Header() http.Header { return w.h }
func (w *segmentRecorder) WriteHeader(int)     {}
func (w *segmentRecorder) Flush()              {}
func (w *segmentRecorder) Write(b []byte) (int, error) {
	w.writes = append(w.writes, []watchsession.Segment{{B: bytes.Clone(b)}})
	return len(b), nil
}

func (w *segmentRecorder) Session() uint64 { return 1 }

func (w *segmentRecorder) TryWriteSegments(segs []watchsession.Segment) (bool, error) {
	_, err := w.WriteSegments(segs)
	return true, err
}

func (w *segmentRecorder) WriteSegments(segs []watchsession.Segment) (int, error) {
	n := 0
	rec := make([]watchsession.Segment, len(segs))
	for i, sg := range segs {
		rec[i] = sg
		if !sg.Shared {
			rec[i].B = bytes.Clone(sg.B) // the stream reuses its own bytes
		}
		n += len(sg.B)
	}
	w.writes = append(w.writes, rec)
	return n, nil
}

// TestSessionStreamSharesEncodings: a watch on a session stream writes
// each batch as one WriteSegments whose bytes are what a plain stream
// writes; the encodings of the hub's events that more than one watcher was
// handed go by reference (the very bytes every watch of the item writes),
// those of one handed to a single watcher, a catch-up's events and the
// stream's own lines (bookmarks) as its own bytes; a batch over batchBytes
// is written in pieces no larger.
func TestSessionStreamSharesEncodings(t *testing.T) {
	res := podsResource(t)
	m := newMetrics(prometheus.NewRegistry())
	enc := testEncoder(t, res)
	newStream := func(w http.ResponseWriter) *stream {
		return &stream{w: w, rc: http.NewResponseController(w), res: res, f: jsonLines, enc: enc, m: m, clock: clock.RealClock{}, batches: &sync.Pool{}}
	}
	// mkItem: a hub's item (shared) handed to that many watchers, or a
	// catch-up's.
	mkItem := func(rev int64, shared bool, watchers, pad int) *item {
		obj := fmt.Sprintf(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"ns","resourceVersion":"%d","labels":{"pad":%q}}}`, rev, strings.Repeat("x", pad))
		it := newItem(&heraldv1.Event{Type: heraldv1.EventType_MODIFIED, Revision: rev, Object: []byte(obj)})
		it.shared = shared
		for range watchers {
			w := &watcher{max: 10, maxBytes: 1 << 20}
			w.push(it, request.AsModified, int64(len(obj)))
		}
		return it
	}
	for _, tc := range []struct {
		name      string
		items     []*item
		byRefRevs map[int64]bool // the revisions that go by reference
	}{
		{"hub and catch-up", []*item{mkItem(1, true, 3, 200), mkItem(2, false, 0, 200), mkItem(3, true, 2, 200)}, map[int64]bool{1: true, 3: true}},
		{"hub's, handed to one watcher", []*item{mkItem(1, true, 1, 200), mkItem(2, true, 1000, 200), mkItem(3, true, 1, 200)}, map[int64]bool{2: true}},
		{"over batchBytes", func() (its []*item) {
			for rev := range int64(60) {
				its = append(its, mkItem(rev+1, rev%3 != 0, 2, 1000))
			}
			return its
		}(), func() map[int64]bool {
			m := map[int64]bool{}
			for rev := range int64(60) {
				m[rev+1] = rev%3 != 0
			}
			return m
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &segmentRecorder{h: http.Header{}}
			st := newStream(rec)
			st.sw = rec
			plain := httptest.NewRecorder()
			ps := newStream(plain)
			for _, s := range []*stream{st, ps} {
				for _, it := range tc.items {
					s.event(it, request.AsModified)
				}
				s.bookmark(99, false)
				s.flush()
				if s.err != nil {
					t.Fatal(s.err)
				}
			}
			var got []byte
			shared := map[*byte]bool{}
			for _, segs := range rec.writes {
				n := 0
				for _, sg := range segs {
					got = append(got, sg.B...)
					n += len(sg.B)
					if sg.Shared {
						shared[unsafe.SliceData(sg.B)] = true
					}
				}
				if n > batchBytes {
					t.Errorf("a write of %d bytes, over %d", n, batchBytes)
				}
			}
			if !bytes.Equal(got, plain.Body.Bytes()) {
				t.Fatalf("the segments' bytes differ from the plain stream's:\n%s\nwant\n%s", got, plain.Body.Bytes())
			}
			if want := (len(got) + batchBytes - 1) / batchBytes; len(rec.writes) > want+1 {
				t.Errorf("%d writes for %d bytes", len(rec.writes), len(got))
			}
			for _, it := range tc.items {
				rev := it.ev.Revision
				if got := shared[unsafe.SliceData(it.line(request.AsModified))]; got != tc.byRefRevs[rev] {
					t.Errorf("revision %d went by reference: %v, want %v", rev, got, tc.byRefRevs[rev])
				}
			}
		})
	}
}

// TestSessionStreamTracesEvents: on a session stream whose frontdoor
// traces events, a sampled event's trace context goes as a Trace segment
// right before its bytes, on the first stream that writes it only (one
// frontdoor span per event and replica); the bytes are the event's alone.
func TestSessionStreamTracesEvents(t *testing.T) {
	res := podsResource(t)
	m := newMetrics(prometheus.NewRegistry())
	enc := testEncoder(t, res)
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	obj := `{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"ns","resourceVersion":"7"}}`
	traced := newItem(&heraldv1.Event{Type: heraldv1.EventType_MODIFIED, Revision: 7, Object: []byte(obj)})
	traced.tp = tp
	plain := newItem(&heraldv1.Event{Type: heraldv1.EventType_MODIFIED, Revision: 6, Object: []byte(obj)})
	var recs []*segmentRecorder
	for range 2 {
		rec := &segmentRecorder{h: http.Header{}}
		st := &stream{w: rec, rc: http.NewResponseController(rec), res: res, f: jsonLines, enc: enc, m: m, clock: clock.RealClock{}, batches: &sync.Pool{},
			sw: rec, traceEvents: true}
		st.event(plain, request.AsModified)
		st.event(traced, request.AsModified)
		st.flush()
		if st.err != nil {
			t.Fatal(st.err)
		}
		recs = append(recs, rec)
	}
	for i, rec := range recs {
		var traces []string
		var body []byte
		for _, segs := range rec.writes {
			for _, sg := range segs {
				if sg.Trace != "" {
					traces = append(traces, fmt.Sprintf("%s before byte %d", sg.Trace, len(body)))
				}
				body = append(body, sg.B...)
			}
		}
		want := append(append([]byte(nil), plain.line(request.AsModified)...), traced.line(request.AsModified)...)
		if !bytes.Equal(body, want) {
			t.Fatalf("stream %d: body %q, want %q", i, body, want)
		}
		var wantTraces []string
		if i == 0 {
			wantTraces = []string{fmt.Sprintf("%s before byte %d", tp, len(plain.line(request.AsModified)))}
		}
		if !slices.Equal(traces, wantTraces) {
			t.Fatalf("stream %d: traces %q, want %q", i, traces, wantTraces)
		}
	}
}
