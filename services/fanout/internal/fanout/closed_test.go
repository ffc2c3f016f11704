package fanout

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	"herald.dev/libs/kube"
	"herald.dev/libs/storage"
)

// TestClosedWatchEndsWithBookmark: a watcher closed by the hub (an upstream
// reset closes every one, including those that joined a moment ago) ends
// its stream with a bookmark at what it delivered, in the stream's format,
// so that client-go resumes the watch instead of relisting after a "very
// short watch" (a JSON line in a kubelet's protobuf stream would end it
// with a decoding error instead).
func TestClosedWatchEndsWithBookmark(t *testing.T) {
	reg, err := kube.NewRegistry(kube.DefaultPrefix, kube.DefaultResources())
	if err != nil {
		t.Fatal(err)
	}
	var res *kube.Resource
	for _, r := range reg.Resources() {
		if r.ID() == "pods" {
			res = r
		}
	}
	if res == nil {
		t.Fatal("no pods resource")
	}
	m := newMetrics(prometheus.NewRegistry())
	s := &Server{cfg: Config{BookmarkInterval: time.Hour}, clock: clock.RealClock{}, m: m}
	h := newHub(res, nil, ringLimits{}, slog.New(slog.DiscardHandler), m, clock.RealClock{})
	enc := testEncoder(t, res)
	// Each checks that the stream is exactly one BOOKMARK at 42 of kind.
	jsonBookmark := func(kind string) func(*testing.T, []byte) bool {
		return func(t *testing.T, b []byte) bool {
			var ev metav1.WatchEvent
			var obj metav1.PartialObjectMetadata
			return bytes.Count(b, []byte("\n")) == 1 && json.Unmarshal(b, &ev) == nil && ev.Type == "BOOKMARK" &&
				json.Unmarshal(ev.Object.Raw, &obj) == nil && obj.Kind == kind && obj.ResourceVersion == "42"
		}
	}
	protobufBookmark := func(t *testing.T, b []byte) bool {
		ev := frame(t, b) // exactly one frame
		return ev.Type == "BOOKMARK" && bytes.HasPrefix(ev.Object.Raw, []byte("k8s\x00")) &&
			bytes.Contains(ev.Object.Raw, []byte("\x32\x0242")) // ObjectMeta.resourceVersion (field 6) "42"
	}
	for _, tc := range []struct {
		name       string
		f          format
		bookmarkAt func(*testing.T, []byte) bool
	}{
		{"json", jsonLines, jsonBookmark("Pod")},
		{"protobuf", format{mt: storage.MediaProtobuf}, protobufBookmark},
		{"partial-object-metadata", format{mt: storage.MediaJSON, as: storage.KindPartialObjectMetadata, gv: metav1.SchemeGroupVersion},
			jsonBookmark("PartialObjectMetadata")},
	} {
		for _, bookmarks := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/bookmarks=%v", tc.name, bookmarks), func(t *testing.T) {
				rec := httptest.NewRecorder()
				st := &stream{w: rec, rc: http.NewResponseController(rec), res: res, f: tc.f, enc: enc, m: m, clock: clock.RealClock{}, batches: &sync.Pool{}}
				wt := newWatcher(nil, 10, 1<<20)
				wt.close(reasonUpstreamReset)
				s.serve(context.Background(), st, h, wt, 42, bookmarks)
				body := rec.Body.Bytes()
				if !bookmarks {
					if len(body) != 0 {
						t.Fatalf("without bookmarks: stream %q, want empty", body)
					}
					return
				}
				if !tc.bookmarkAt(t, body) {
					t.Fatalf("stream %q, want one BOOKMARK at 42", body)
				}
			})
		}
	}
}
