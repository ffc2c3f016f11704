package frontdoor

import (
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
)

// heapAfterGC is the live heap once garbage is collected.
func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestAuthorizationCacheStuffing (issue 53, point 2): denied requests with
// large selectors, each different, leave frontdoor's memory where it was:
// selectors past max-selector-bytes never reach a review, and the reviews'
// cache is bounded in bytes whatever the selectors.
func TestAuthorizationCacheStuffing(t *testing.T) {
	k := newSARKube(t, func(*authorizationv1.SubjectAccessReviewSpec) bool { return false })
	s := clusterServer(t, k.srv.URL, k.caPEM(), nil)
	k.reviews()
	before := heapAfterGC()
	for i := range 64 {
		sel := fmt.Sprintf("metadata.name=%d-%s", i, strings.Repeat("x", 512<<10))
		rec := send(s, http.MethodGet, "/api/v1/namespaces/demo/secrets?fieldSelector="+sel, tokDan, nil, nil)
		if rec.Code == http.StatusOK {
			t.Fatalf("request %d allowed", i)
		}
	}
	reviews := len(k.reviews()) // and the fake forgets them
	grown := int64(heapAfterGC()) - int64(before)
	t.Logf("64 denied requests with 512 KiB selectors: heap %+d KiB after GC, %d reviews", grown>>10, reviews)
	if grown > 8<<20 {
		t.Errorf("64 denied requests with 512 KiB selectors kept %d MiB", grown>>20)
	}
	runtime.KeepAlive(s)
}
