package frontdoor

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	discoveryclient "k8s.io/client-go/discovery"
	authenticationclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"

	"herald.dev/libs/kube/request"
	"herald.dev/services/frontdoor/internal/audit"
	"herald.dev/services/frontdoor/internal/authn"
	"herald.dev/services/frontdoor/internal/authz"
	"herald.dev/services/frontdoor/internal/upstream"
)

// Cluster mode's authentication and authorization come from the cluster,
// with k8s.io/apiserver's own delegating pieces (what aggregated API servers
// and kube-rbac-proxy use):
//
//   - bearer tokens frontdoor does not know itself are checked with
//     TokenReview, cached by the token's hash (a positive and a negative
//     TTL); client certificates are verified against client-ca-file, which
//     in cluster mode is the cluster's client CA;
//   - every read frontdoor serves is authorized with SubjectAccessReview,
//     of the attributes kube-apiserver's own request info gives
//     (internal/authz), so RBAC, the Node authorizer and webhooks decide
//     exactly as in the cluster; decisions are cached by a hash of the
//     review within a byte budget (internal/authz); local RBAC manifests
//     are not consulted;
//   - Impersonate-* headers (kubectl --as) are authorized as kube-apiserver
//     v1.36+ does, with its own constrained impersonation filter (KEP-5284:
//     the impersonate:<mode> verb on the wanted user and impersonate-on:
//     <mode>:<verb> on what the request does, then the legacy impersonate
//     verb on users, groups, serviceaccounts, uids and userextras, each
//     asked of the cluster as the caller), and the request then runs as the
//     impersonated user, for reads served here and for requests forwarded
//     upstream alike. kube-apiserver cannot chain impersonation, so Herald
//     carries the outcome, never the caller's headers.
type cluster struct {
	log    *slog.Logger
	tokens *authn.TokenReviews
	authz  authorizer.Authorizer
	up     *upstream.Proxy
	// version is the cluster's kube-apiserver's, read at start (what its
	// deprecation warnings are judged by).
	version version.Info
	// impersonation is the filter, built once (it caches which mode
	// allowed what).
	impersonation *authz.Impersonation
}

// reviewBackoff is k8s.io/apiserver's DefaultAuthWebhookRetryBackoff,
// shortened: a review that cannot reach the cluster fails within seconds.
var reviewBackoff = wait.Backoff{Duration: 200 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 3}

func newCluster(c upstream.Config, log *slog.Logger, reg prometheus.Registerer) (*cluster, error) {
	cfg, err := c.RestConfig()
	if err != nil {
		return nil, err
	}
	up, err := upstream.New(c, cfg, log)
	if err != nil {
		return nil, err
	}
	rc := rest.CopyConfig(cfg)
	rc.Timeout = c.ReviewTimeout
	rm := upstream.NewReviewMetrics(reg)
	authnClient, err := authenticationclient.NewForConfig(upstream.NewReviewClient(cfg, c, "tokenreview", upstream.TokenReviewKey, rm))
	if err != nil {
		return nil, fmt.Errorf("upstream TokenReview client: %w", err)
	}
	authzClient, err := authorizationclient.NewForConfig(upstream.NewReviewClient(cfg, c, "subjectaccessreview", upstream.SARKey, rm))
	if err != nil {
		return nil, fmt.Errorf("upstream SubjectAccessReview client: %w", err)
	}
	tokens, err := authn.NewTokenReviews(authnClient, c, reviewBackoff, rm)
	if err != nil {
		return nil, err
	}
	az := authz.NewReviewAuthorizer(authzClient, c, reviewBackoff)
	// The version the cluster's deprecation warnings are judged by; if it
	// cannot be read now, the API Herald serves (k8s.io/api v0.37).
	v := version.Info{Major: "1", Minor: "37"}
	if dc, err := discoveryclient.NewDiscoveryClientForConfig(rc); err == nil {
		if sv, err := dc.ServerVersion(); err == nil {
			v = *sv
		} else {
			log.Warn("reading the upstream's version (deprecation warnings are judged as of v1.37)", "err", err)
		}
	}
	return &cluster{
		log:           log,
		tokens:        tokens,
		authz:         az,
		up:            up,
		version:       v,
		impersonation: authz.NewImpersonation(az, log),
	}, nil
}

// authorize asks the cluster (cached SubjectAccessReview) whether a is
// allowed. a is what kube-apiserver's authorization filter would hand its
// authorizers (authz.RequestAttributes): the Node authorizer and others see the
// name a field selector narrows a list or watch to, and its selectors.
//
// When the cluster could not be asked, fail is the answer to give instead
// of a denial (reviewError: 429 or 503).
func (c *cluster) authorize(ctx context.Context, a authz.Attributes) (ok bool, why string, fail error) {
	d, reason, err := c.authz.Authorize(ctx, &a.AttributesRecord)
	if err != nil {
		c.log.Warn("SubjectAccessReview failed", "user", a.User.GetName(), "verb", a.Verb, "resource", a.Resource, "err", err)
	} else if d != authorizer.DecisionAllow && reason != "" {
		c.log.Debug("SubjectAccessReview denied", "user", a.User.GetName(), "verb", a.Verb, "resource", a.Resource, "reason", reason)
	}
	if d == authorizer.DecisionAllow {
		return true, "", nil
	}
	return false, reason, authz.ReviewError(err)
}

// authenticate resolves the request's user: locally, and in cluster mode
// also by TokenReview; then, in both modes, a service-account token bound
// to a pod, node or secret is refused once that object is gone (authn.CheckBound).
// A bearer token may come as a WebSocket subprotocol (authn.WebSocketBearer).
func (s *Server) authenticate(r *http.Request) (*User, error) {
	if err := authn.WebSocketBearer(r); err != nil {
		return nil, err
	}
	authenticate := s.authn.Authenticate
	if s.cluster != nil {
		authenticate = func(r *http.Request) (*User, error) { return s.cluster.tokens.Authenticate(r, s.authn) }
	}
	u, err := authenticate(r)
	if err != nil {
		return nil, err
	}
	if err := authn.CheckBound(r, u, s.reg, s.cache); err != nil {
		return nil, err
	}
	return u, nil
}

// clusterRoute is cluster mode's routing decision for an authenticated
// request: impersonation first (*u becomes the impersonated user), then
// everything frontdoor does not serve from its cache goes upstream. It
// reports whether the request was answered.
func (s *Server) clusterRoute(w http.ResponseWriter, r *http.Request, u **User, ae *audit.Entry) bool {
	as, ok := s.cluster.impersonation.Apply(w, r, *u)
	if !ok {
		ae.Reason = "impersonation refused"
		return true
	}
	if as != *u {
		ae.Authn += ",as=" + as.Name
	}
	*u, ae.As = as, as
	if s.servedHere(r) {
		return false
	}
	var id, sub string
	ae.Verb, id, sub, ae.Namespace = upstream.RequestName(r)
	ae.Reason, ae.Forwarded, ae.UpstreamResource = "upstream", true, id
	if sub != "" {
		ae.UpstreamResource += "/" + sub
	}
	// A metric label only for a resource frontdoor knows: any client may
	// name any other in a path.
	if _, known := s.reg.ByID(id); known {
		ae.Resource = id
	}
	s.forward(w, r, as)
	return true
}

// servedHere reports whether frontdoor answers r itself in cluster mode:
// reads (get, list, watch) of the resources its cache holds, and its own
// /metrics and /debug/pprof. Everything else — writes, subresources,
// upgrades, resources and versions not cached, discovery, /version,
// /openapi — is the cluster's.
func (s *Server) servedHere(r *http.Request) bool {
	if (r.Method != http.MethodGet && r.Method != http.MethodHead) || httpstream.IsUpgradeRequest(r) {
		return false
	}
	if s.nonResource(r.URL.Path) != nil {
		return true
	}
	_, err := request.Parse(s.reg, r.URL.Path, r.URL.Query())
	return err == nil
}
