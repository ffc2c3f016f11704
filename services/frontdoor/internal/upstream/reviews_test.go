package upstream

import (
	"context"
	"errors"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"

	"herald.dev/services/frontdoor/internal/limits"
)

// blockingRT answers every request once release is closed, counting them.
type blockingRT struct {
	sent    atomic.Int64
	started chan struct{}
	release chan struct{}
}

func (b *blockingRT) RoundTrip(r *http.Request) (*http.Response, error) {
	b.sent.Add(1)
	body, _ := io.ReadAll(r.Body)
	b.started <- struct{}{}
	<-b.release
	return &http.Response{StatusCode: 201, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(string(body)))}, nil
}

func testReviewTransport(next http.RoundTripper, max, perUser int, qps float64, burst int) *reviewTransport {
	return &reviewTransport{next: next, review: "subjectaccessreview", key: SARKey, slots: limits.New(max, perUser),
		rate: rate.NewLimiter(rate.Limit(qps), burst), timeout: 5 * time.Second, flights: &singleflight.Group{},
		m: NewReviewMetrics(prometheus.NewRegistry())}
}

func sarRequest(ctx context.Context, user, name string) *http.Request {
	r, _ := http.NewRequestWithContext(ctx, http.MethodPost, "https://kube/apis/authorization.k8s.io/v1/subjectaccessreviews",
		strings.NewReader(`{"spec":{"user":"`+user+`","resourceAttributes":{"name":"`+name+`"}}}`))
	return r
}

// Identical SubjectAccessReviews in flight are sent once; each caller gets
// the answer; one user beyond its share is refused at once (never queued),
// while another user's review goes through.
func TestReviewTransportFairAndShared(t *testing.T) {
	rt := &blockingRT{started: make(chan struct{}, 16), release: make(chan struct{})}
	tr := testReviewTransport(rt, 8, 2, 1000, 1000)
	ctx := t.Context()
	var wg sync.WaitGroup
	answers := make(chan string, 8)
	do := func(user, name string) {
		defer wg.Done()
		resp, err := tr.RoundTrip(sarRequest(ctx, user, name))
		if err != nil {
			answers <- "error: " + err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answers <- string(b)
	}
	wg.Add(3)
	go do("bob", "a")
	<-rt.started
	go do("bob", "a") // joins the first
	waitInFlight(t, 2)
	go do("bob", "b")
	<-rt.started
	// bob holds his two slots: a third distinct review of his is refused.
	if _, err := tr.RoundTrip(sarRequest(ctx, "bob", "c")); !errors.Is(err, ErrReviewThrottled) {
		t.Fatalf("bob's third review: %v, want ErrReviewThrottled", err)
	}
	wg.Add(1)
	go do("carol", "a")
	<-rt.started
	close(rt.release)
	wg.Wait()
	close(answers)
	n := 0
	for a := range answers {
		if !strings.Contains(a, `"spec"`) {
			t.Errorf("answer %q", a)
		}
		n++
	}
	if n != 4 || rt.sent.Load() != 3 {
		t.Errorf("%d answers from %d reviews sent, want 4 from 3 (bob's identical reviews sent once)", n, rt.sent.Load())
	}
}

// A review whose turn of the rate would come after its deadline is not
// waited for.
func TestReviewTransportRateDeadline(t *testing.T) {
	rt := &blockingRT{started: make(chan struct{}, 4), release: make(chan struct{})}
	close(rt.release)
	tr := testReviewTransport(rt, 8, 8, 0.1, 1)
	tr.key = TokenReviewKey
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	if resp, err := tr.RoundTrip(sarRequest(ctx, "a", "x")); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	start := time.Now()
	if _, err := tr.RoundTrip(sarRequest(ctx, "a", "y")); !errors.Is(err, ErrReviewThrottled) || time.Since(start) > 100*time.Millisecond {
		t.Errorf("second review, next turn in 10s, deadline in 1s: %v after %s, want ErrReviewThrottled at once", err, time.Since(start))
	}
	if n := tr.slots.InUse(); n != 0 {
		t.Errorf("%d slots still held", n)
	}
}

// waitInFlight waits until n callers of reviewTransport.RoundTrip wait for
// a review's answer (blocked in its select, registered with the flight).
func waitInFlight(t *testing.T, n int) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		got := 0
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, "[select") && strings.Contains(g, "(*reviewTransport).RoundTrip") {
				got++
			}
		}
		if got == n {
			return
		}
		runtime.Gosched()
	}
	t.Fatalf("not %d callers waiting for a review", n)
}
