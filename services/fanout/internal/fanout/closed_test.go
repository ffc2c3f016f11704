package fanout

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"herald.dev/libs/kube"
)

// TestClosedWatchEndsWithBookmark: a watcher closed by the hub (an upstream
// reset closes every one, including those that joined a moment ago) ends
// its stream with a bookmark at what it delivered, so that client-go
// resumes the watch instead of relisting after a "very short watch".
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
	for _, bookmarks := range []bool{true, false} {
		rec := httptest.NewRecorder()
		st := &stream{w: rec, rc: http.NewResponseController(rec), res: res, m: m, clock: clock.RealClock{}}
		wt := newWatcher(nil, 10, 1<<20)
		wt.close(reasonUpstreamReset)
		s.serve(context.Background(), st, h, wt, 42, bookmarks)
		body := rec.Body.String()
		if got := strings.Contains(body, `"type":"BOOKMARK"`) && strings.Contains(body, `"resourceVersion":"42"`); got != bookmarks {
			t.Fatalf("bookmarks %v: stream %q", bookmarks, body)
		}
	}
}
