package authn

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	k8sauthn "k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/token/cache"
	webhooktoken "k8s.io/apiserver/plugin/pkg/authenticator/token/webhook"
	authenticationclient "k8s.io/client-go/kubernetes/typed/authentication/v1"

	"herald.dev/services/frontdoor/internal/limits"
	"herald.dev/services/frontdoor/internal/upstream"
)

// TokenReviews authenticates the bearer tokens nothing local accepts with
// the cluster's TokenReview, through k8s.io/apiserver's webhook token
// authenticator and token cache, within the review limits (upstream's
// review transport, and a pool of its own for tokens the cluster has not
// accepted recently).
type TokenReviews struct {
	tokens k8sauthn.Token
	// The tokens the cluster accepted recently, and the pool of reviews
	// of the others.
	known     *knownTokens
	newTokens *limits.Limiter
	metrics   *upstream.ReviewMetrics
}

// NewTokenReviews reviews tokens with client (a review client of
// upstream.NewReviewClient), retrying a failed review with backoff, and
// caches the answers as c says.
func NewTokenReviews(client authenticationclient.AuthenticationV1Interface, c upstream.Config, backoff wait.Backoff, m *upstream.ReviewMetrics) (*TokenReviews, error) {
	tr, err := webhooktoken.NewFromInterface(client, nil, backoff, c.ReviewTimeout, webhooktoken.AuthenticatorMetrics{
		RecordRequestTotal:   func(context.Context, string) {},
		RecordRequestLatency: func(context.Context, string, float64) {},
	})
	if err != nil {
		return nil, fmt.Errorf("TokenReview authenticator: %w", err)
	}
	known := newKnownTokens()
	newTokens := limits.New(c.MaxNewTokenReviews, c.MaxNewTokenReviewsPerSource)
	newTokens.InUseGauge = m.Inflight.WithLabelValues("new-token")
	return &TokenReviews{
		tokens:    cache.New(tokenAnswers{next: tr, known: known}, false, c.AuthnCacheTTL, c.AuthnNegativeCacheTTL),
		known:     known,
		newTokens: newTokens,
		metrics:   m,
	}, nil
}

// Authenticate is local authentication (client certificates against the
// cluster's CA, static tokens and service-account keys if configured), then
// TokenReview for a bearer token nothing local accepted.
func (c *TokenReviews) Authenticate(r *http.Request, local *Authenticator) (*User, error) {
	u, err := local.Authenticate(r)
	if err == nil {
		return u, nil
	}
	tok, ok := bearerToken(r.Header.Get("Authorization"))
	if !ok {
		return u, err
	}
	resp, ok, rerr := c.reviewToken(r, tok)
	if errors.Is(rerr, upstream.ErrReviewThrottled) {
		return nil, rerr
	}
	if rerr != nil && upstream.ReviewUnavailable(rerr) {
		return nil, fmt.Errorf("%w: %w", ErrReviewFailed, rerr)
	}
	if rerr != nil {
		// The cluster's reason for refusing the token (TokenReview's
		// status.error): for the audit line, never the client.
		return nil, fmt.Errorf("token review: %w", rerr)
	}
	if !ok || resp.User == nil {
		return nil, errors.New("token review: token not accepted by the cluster")
	}
	info := resp.User
	return &User{Name: info.GetName(), UID: info.GetUID(), Groups: info.GetGroups(), Extra: info.GetExtra(), Method: "tokenreview"}, nil
}

// ErrReviewFailed: the cluster could not be asked about a token (it is
// unreachable or failing). The client gets 503, as for any request the
// upstream cannot answer, not a 401 that would say its credentials are bad.
var ErrReviewFailed = errors.New("token review failed")

func bearerToken(h string) (string, bool) {
	scheme, tok, found := strings.Cut(h, " ")
	tok = strings.TrimSpace(tok)
	return tok, found && strings.EqualFold(scheme, "bearer") && tok != ""
}

// knownTokenRetention is how long a token the cluster accepted counts as
// known (reviewed again outside the new-token pool); knownTokensMax bounds
// how many are remembered (an HMAC of each: 32 bytes and an expiry).
const (
	knownTokenRetention = 15 * time.Minute
	knownTokensMax      = 1 << 17
)

// tokenAnswers sits between the TokenReview authenticator and the token
// cache. kube-apiserver reports a token it does not accept with
// status.error, which the webhook authenticator returns as an error, and the
// cache caches no error: this turns that answer into a refusal the cache
// keeps for the negative TTL, and leaves the errors of reviews that failed
// (not sent, transport, timeout, an error Status) errors, which are never
// cached. It also keeps the set of tokens the cluster accepted.
type tokenAnswers struct {
	next  k8sauthn.Token
	known *knownTokens
}

func (a tokenAnswers) AuthenticateToken(ctx context.Context, tok string) (*k8sauthn.Response, bool, error) {
	resp, ok, err := a.next.AuthenticateToken(ctx, tok)
	switch {
	case err != nil && (errors.Is(err, upstream.ErrReviewThrottled) || upstream.ReviewUnavailable(err)):
		return nil, false, err
	case err != nil || !ok || resp == nil || resp.User == nil:
		a.known.forget(tok)
		return nil, false, nil
	}
	a.known.add(tok)
	return resp, true, nil
}

// knownTokens remembers (by HMAC) the tokens the cluster accepted within
// knownTokenRetention, at most knownTokensMax of them. Only an accepted
// token enters it, so a flood of bad tokens cannot fill it.
type knownTokens struct {
	key []byte
	mu  sync.Mutex
	m   map[[sha256.Size]byte]time.Time
	now func() time.Time
}

func newKnownTokens() *knownTokens {
	k := &knownTokens{key: make([]byte, 32), m: map[[sha256.Size]byte]time.Time{}, now: time.Now}
	rand.Read(k.key)
	return k
}

func (k *knownTokens) sum(tok string) (s [sha256.Size]byte) {
	h := hmac.New(sha256.New, k.key)
	h.Write([]byte(tok))
	copy(s[:], h.Sum(nil))
	return s
}

func (k *knownTokens) has(tok string) bool {
	s := k.sum(tok)
	k.mu.Lock()
	defer k.mu.Unlock()
	exp, ok := k.m[s]
	return ok && k.now().Before(exp)
}

func (k *knownTokens) add(tok string) {
	s := k.sum(tok)
	now := k.now()
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.m[s]; !ok && len(k.m) >= knownTokensMax {
		for t, exp := range k.m {
			if !now.Before(exp) {
				delete(k.m, t)
			}
		}
		if len(k.m) >= knownTokensMax {
			return // full of live tokens: this one is reviewed as new
		}
	}
	k.m[s] = now.Add(knownTokenRetention)
}

func (k *knownTokens) forget(tok string) {
	s := k.sum(tok)
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.m, s)
}

// reviewToken authenticates tok through the token cache; a token the
// cluster has not accepted recently first takes a slot of the new-token
// pool for the request's source address (429 when there is none), held
// until its review is answered.
func (c *TokenReviews) reviewToken(r *http.Request, tok string) (*k8sauthn.Response, bool, error) {
	if !c.known.has(tok) {
		release, refused := c.newTokens.Acquire(sourceOf(r))
		if refused != "" {
			if refused == limits.PerUser {
				refused = "per-source"
			}
			c.metrics.Throttled.WithLabelValues("tokenreview", "new-token-"+refused).Inc()
			return nil, false, upstream.ErrReviewThrottled
		}
		defer release()
	}
	return c.tokens.AuthenticateToken(r.Context(), tok)
}

// sourceOf is the address a request came from (its connection's peer).
func sourceOf(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
