package frontdoor

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	k8sauthn "k8s.io/apiserver/pkg/authentication/authenticator"

	"herald.dev/services/frontdoor/internal/limits"
	"herald.dev/services/frontdoor/internal/upstream"
)

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
func (c *cluster) reviewToken(r *http.Request, tok string) (*k8sauthn.Response, bool, error) {
	if !c.known.has(tok) {
		release, refused := c.newTokens.Acquire(sourceOf(r))
		if refused != "" {
			if refused == limits.PerUser {
				refused = "per-source"
			}
			c.reviewMetrics.Throttled.WithLabelValues("tokenreview", "new-token-"+refused).Inc()
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
