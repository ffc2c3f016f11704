package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"

	"herald.dev/services/frontdoor/internal/limits"
)

// Cluster mode's reviews (TokenReview, SubjectAccessReview) are sized for a
// cluster and cannot be starved by abuse:
//
//   - each kind has its own client (NewReviewClient) whose requests go
//     through a reviewTransport: a bounded number in flight, fair per key
//     (the SubjectAccessReview's user; one pool for TokenReviews), then a
//     rate (upstream.review-qps/-burst) whose wait is bounded by the
//     slots in flight (a request reserves its turn only once it holds a
//     slot), then a deadline (upstream.review-timeout). No queue of
//     unbounded length forms anywhere: a review that gets no slot, or whose
//     turn would come after its deadline, fails at once with
//     ErrReviewThrottled, which the client gets as 429 with Retry-After,
//     never as a refused credential;
//   - identical SubjectAccessReviews in flight are sent once
//     (singleflight; k8s.io/apiserver's token cache does the same for
//     tokens), and a caller that gives up does not cancel the others;
//   - the token cache caches the cluster's "not a valid token" for the
//     negative TTL (tokenAnswers), never a review that failed;
//   - a token the cluster has not accepted recently (a new token, or a bad
//     one: every token of a random-token flood) may be reviewed only
//     within a pool of its own, fair per source address
//     (upstream.max-new-token-reviews-inflight(-per-source)); tokens the
//     cluster accepted within knownTokenRetention are reviewed again
//     outside it. A flood of bad tokens thus spends its own share of
//     reviews and of kube-apiserver's time, never that of the users the
//     cluster knows, and a flood from one address not that of new users
//     from others.

// ErrReviewThrottled: a review was not sent, to stay within the review
// limits. The client gets 429 with Retry-After.
var ErrReviewThrottled = errors.New("review throttled by frontdoor's review limits")

// ReviewMetrics are the reviews' counters, by review (tokenreview,
// subjectaccessreview).
type ReviewMetrics struct {
	sent      *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	Throttled *prometheus.CounterVec
	shared    *prometheus.CounterVec
	Inflight  *prometheus.GaugeVec
}

func NewReviewMetrics(reg prometheus.Registerer) *ReviewMetrics {
	f := promauto.With(reg)
	return &ReviewMetrics{
		sent: f.NewCounterVec(prometheus.CounterOpts{Name: "herald_frontdoor_upstream_reviews_total",
			Help: "Reviews sent to kube-apiserver by review (tokenreview, subjectaccessreview) and HTTP code (error: no answer)."}, []string{"review", "code"}),
		duration: f.NewHistogramVec(prometheus.HistogramOpts{Name: "herald_frontdoor_upstream_review_duration_seconds",
			Help: "Time kube-apiserver took to answer a review, by review.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"review"}),
		Throttled: f.NewCounterVec(prometheus.CounterOpts{Name: "herald_frontdoor_upstream_reviews_throttled_total",
			Help: "Reviews not sent (the request got 429) by review and limit: total, per-user, fair-share (reviews in flight), rate (upstream.review-qps), new-token-total, new-token-per-source, new-token-fair-share (tokens not accepted recently)."}, []string{"review", "limit"}),
		shared: f.NewCounterVec(prometheus.CounterOpts{Name: "herald_frontdoor_upstream_reviews_shared_total",
			Help: "Reviews answered by an identical review already in flight, by review."}, []string{"review"}),
		Inflight: f.NewGaugeVec(prometheus.GaugeOpts{Name: "herald_frontdoor_upstream_reviews_inflight",
			Help: "Reviews in flight to kube-apiserver, by review (new-token: TokenReviews of tokens not accepted recently, cache hits included)."}, []string{"review"}),
	}
}

// NewReviewClient is a copy of cfg for one kind of review: client-go's own
// rate limiter off (it queues without fairness and fails a wait that would
// pass the deadline with an error indistinguishable from a refusal), the
// reviewTransport's limits instead.
func NewReviewClient(cfg *rest.Config, c Config, review string, key func([]byte) (fair, flight string), m *ReviewMetrics) *rest.Config {
	rc := rest.CopyConfig(cfg)
	rc.Timeout = c.ReviewTimeout
	rc.QPS, rc.Burst, rc.RateLimiter = -1, 0, nil
	// JSON, whatever the kubeconfig prefers: the transport reads the
	// SubjectAccessReview's user from the body.
	rc.ContentType = "application/json"
	perUser := c.MaxReviewsInflightPerUser
	if review == "tokenreview" {
		perUser = 0 // one pool: the new-token pool is where fairness is kept
	}
	t := &reviewTransport{
		review: review, key: key, m: m, timeout: c.ReviewTimeout, flights: &singleflight.Group{},
		slots: limits.New(c.MaxReviewsInflight, perUser),
		rate:  rate.NewLimiter(rate.Limit(c.ReviewQPS), c.ReviewBurst),
	}
	t.slots.InUseGauge = m.Inflight.WithLabelValues(review)
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		w := *t // the limits are shared by every transport of the client
		w.next = rt
		return &w
	})
	return rc
}

// reviewTransport sends one kind of review within its limits.
type reviewTransport struct {
	next    http.RoundTripper
	review  string
	key     func(body []byte) (fair, flight string)
	slots   *limits.Limiter
	rate    *rate.Limiter
	timeout time.Duration
	flights *singleflight.Group
	m       *ReviewMetrics
}

// SARKey: a SubjectAccessReview is fair per user, and identical ones (the
// same JSON: encoding/json sorts the extras' keys) are sent once.
func SARKey(body []byte) (fair, flight string) {
	var sar struct {
		Spec struct {
			User string `json:"user"`
		} `json:"spec"`
	}
	json.Unmarshal(body, &sar)
	return sar.Spec.User, string(body)
}

// TokenReviewKey: TokenReviews share one pool; the token cache already
// sends a token's review once.
func TokenReviewKey([]byte) (fair, flight string) { return "", "" }

// sharedAnswer is a review's answer, read whole, for every caller.
type sharedAnswer struct {
	code   int
	header http.Header
	body   []byte
}

func (t *reviewTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		var err error
		body, err = io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
	}
	fair, flight := t.key(body)
	if flight == "" {
		return t.send(req.Context(), req, body, fair)
	}
	// The review is sent once for every caller, and lasts its own deadline
	// whoever gives up first.
	ch := t.flights.DoChan(flight, func() (any, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(req.Context()), t.timeout)
		defer cancel()
		resp, err := t.send(ctx, req, body, fair)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return nil, err
		}
		return &sharedAnswer{code: resp.StatusCode, header: resp.Header, body: b}, nil
	})
	select {
	case <-req.Context().Done():
		return nil, req.Context().Err()
	case res := <-ch:
		if res.Shared {
			t.m.shared.WithLabelValues(t.review).Inc()
		}
		if res.Err != nil {
			return nil, res.Err
		}
		a := res.Val.(*sharedAnswer)
		return &http.Response{
			Status: strconv.Itoa(a.code) + " " + http.StatusText(a.code), StatusCode: a.code,
			Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: a.header.Clone(), Body: io.NopCloser(bytes.NewReader(a.body)), ContentLength: int64(len(a.body)), Request: req,
		}, nil
	}
}

// send takes a slot, waits for its turn of the rate, and sends.
func (t *reviewTransport) send(ctx context.Context, req *http.Request, body []byte, fair string) (*http.Response, error) {
	release, refused := t.slots.Acquire(fair)
	if refused != "" {
		t.m.Throttled.WithLabelValues(t.review, refused).Inc()
		return nil, ErrReviewThrottled
	}
	if err := t.wait(ctx); err != nil {
		release()
		return nil, err
	}
	out := req.Clone(ctx)
	if body != nil {
		out.Body = io.NopCloser(bytes.NewReader(body))
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		out.ContentLength = int64(len(body))
	}
	start := time.Now()
	resp, err := t.next.RoundTrip(out)
	code := "error"
	if err != nil {
		release()
	} else {
		code = strconv.Itoa(resp.StatusCode)
		// The slot is held until the answer is read (client-go reads the
		// small body at once and closes it).
		resp.Body = &releaseOnClose{ReadCloser: resp.Body, release: release}
	}
	t.m.sent.WithLabelValues(t.review, code).Inc()
	t.m.duration.WithLabelValues(t.review).Observe(time.Since(start).Seconds())
	return resp, err
}

// wait waits for the request's turn of the rate; a turn that would come
// after ctx's deadline is not waited for.
func (t *reviewTransport) wait(ctx context.Context) error {
	r := t.rate.Reserve()
	if !r.OK() {
		t.m.Throttled.WithLabelValues(t.review, "rate").Inc()
		return ErrReviewThrottled
	}
	d := r.Delay()
	if d == 0 {
		return nil
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
		r.Cancel()
		t.m.Throttled.WithLabelValues(t.review, "rate").Inc()
		return ErrReviewThrottled
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		r.Cancel()
		return ctx.Err()
	}
}

// releaseOnClose releases a slot when the answer's body is closed.
type releaseOnClose struct {
	io.ReadCloser
	release func() // the limiter's: idempotent
}

func (b *releaseOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.release()
	return err
}

// ReviewUnavailable tells an error of the TokenReview request (transport,
// timeout, an error Status from the API) from the cluster's answer that the
// token is not valid, which the webhook authenticator also returns as an
// error (a plain one, with TokenReview's status.error).
func ReviewUnavailable(err error) bool {
	var api apierrors.APIStatus
	var uerr *url.Error
	var nerr net.Error
	return errors.As(err, &api) || errors.As(err, &uerr) || errors.As(err, &nerr) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// validateReviews checks the review limits of c.
func (c *Config) validateReviews() error {
	var errs []error
	if c.ReviewQPS <= 0 || c.ReviewBurst <= 0 {
		errs = append(errs, errors.New("upstream.review-qps and upstream.review-burst must be positive"))
	}
	for name, n := range map[string]int{
		"upstream.max-reviews-inflight": c.MaxReviewsInflight, "upstream.max-reviews-inflight-per-user": c.MaxReviewsInflightPerUser,
		"upstream.max-new-token-reviews-inflight": c.MaxNewTokenReviews, "upstream.max-new-token-reviews-inflight-per-source": c.MaxNewTokenReviewsPerSource,
	} {
		if n <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive", name))
		}
	}
	if c.MaxNewTokenReviews > c.MaxReviewsInflight/2 {
		errs = append(errs, errors.New("upstream.max-new-token-reviews-inflight must be at most half of upstream.max-reviews-inflight (the rest is for tokens the cluster accepted)"))
	}
	return errors.Join(errs...)
}
