package fanout

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/service/watchmux"
)

// segmentRecorder is a session stream's ResponseWriter that records each
// WriteSegments.
type segmentRecorder struct {
	h      http.Header
	writes [][]watchmux.Segment
}

func (w *segmentRecorder) Header() http.Header { return w.h }
func (w *segmentRecorder) WriteHeader(int)     {}
func (w *segmentRecorder) Flush()              {}
func (w *segmentRecorder) Write(b []byte) (int, error) {
	w.writes = append(w.writes, []watchmux.Segment{{B: bytes.Clone(b)}})
	return len(b), nil
}

func (w *segmentRecorder) Session() uint64 { return 1 }

func (w *segmentRecorder) TryWriteSegments(segs []watchmux.Segment) (bool, error) {
	_, err := w.WriteSegments(segs)
	return true, err
}

func (w *segmentRecorder) WriteSegments(segs []watchmux.Segment) (int, error) {
	n := 0
	rec := make([]watchmux.Segment, len(segs))
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
// writes; the encodings of the hub's events go by reference (the very
// bytes every watch of the item writes), a catch-up's events and the
// stream's own lines (bookmarks) as its own bytes; a batch over batchBytes
// is written in pieces no larger.
func TestSessionStreamSharesEncodings(t *testing.T) {
	res := podsResource(t)
	m := newMetrics(prometheus.NewRegistry())
	enc := testEncoder(t, res)
	newStream := func(w http.ResponseWriter) *stream {
		return &stream{w: w, rc: http.NewResponseController(w), res: res, f: jsonLines, enc: enc, m: m, clock: clock.RealClock{}, batches: &sync.Pool{}}
	}
	mkItem := func(rev int64, shared bool, pad int) *item {
		obj := fmt.Sprintf(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"ns","resourceVersion":"%d","labels":{"pad":%q}}}`, rev, strings.Repeat("x", pad))
		it := newItem(&heraldv1.Event{Type: heraldv1.EventType_MODIFIED, Revision: rev, Object: []byte(obj)})
		it.shared = shared
		return it
	}
	for _, tc := range []struct {
		name  string
		items []*item
	}{
		{"hub and catch-up", []*item{mkItem(1, true, 200), mkItem(2, false, 200), mkItem(3, true, 200)}},
		{"over batchBytes", func() (its []*item) {
			for rev := range int64(60) {
				its = append(its, mkItem(rev+1, rev%3 != 0, 1000))
			}
			return its
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
					s.event(it, kube.AsModified)
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
				if line := it.line(kube.AsModified); shared[unsafe.SliceData(line)] != it.shared {
					t.Errorf("revision %d (hub's: %v) went by reference: %v", it.ev.Revision, it.shared, !it.shared)
				}
			}
		})
	}
}
