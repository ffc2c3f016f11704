package authz

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/endpoints/filters/impersonation"
	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
	"k8s.io/apiserver/pkg/endpoints/request"

	"herald.dev/services/frontdoor/internal/authn"
	"herald.dev/services/frontdoor/internal/reqinfo"
)

// Impersonation authorizes Impersonate-* headers (kubectl --as) as
// kube-apiserver v1.36+ does, with its own constrained impersonation
// filter (KEP-5284), on the cluster's SubjectAccessReview, each asked as
// the caller; the request then runs as the impersonated user.
// kube-apiserver cannot chain impersonation, so Herald carries the
// outcome, never the caller's headers.
type Impersonation struct {
	log *slog.Logger
	// filter is kube-apiserver's, built once (it caches which mode allowed
	// what); its handler hands the impersonated user back through the
	// request's context (impersonatedKey).
	filter http.Handler
}

// NewImpersonation authorizes impersonations with az.
func NewImpersonation(az authorizer.Authorizer, log *slog.Logger) *Impersonation {
	scheme := runtime.NewScheme()
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	impersonated := http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		if out, ok := r.Context().Value(impersonatedKey{}).(*user.Info); ok {
			*out, _ = request.UserFrom(r.Context())
		}
	})
	return &Impersonation{log: log, filter: impersonation.WithConstrainedImpersonation(impersonated, az, serializer.NewCodecFactory(scheme))}
}

// impersonatedKey's value in a request's context is where the impersonation
// filter's handler stores the user the request runs as (a *user.Info).
type impersonatedKey struct{}

// Apply applies the request's Impersonate-* headers, if any: each is
// authorized by the cluster for u (kube-apiserver's own filter, on the
// cluster's SubjectAccessReview), and the result is the user the request
// runs as. When not allowed, the 403 (or 400) is written and ok is false.
func (c *Impersonation) Apply(w http.ResponseWriter, r *http.Request, u *authn.User) (_ *authn.User, ok bool) {
	if !hasImpersonation(r.Header) {
		return u, true
	}
	info, err := reqinfo.Infos.NewRequestInfo(r)
	if err != nil {
		// kube-apiserver's handler chain fails such a request before it
		// reads any header: 500.
		responsewriters.InternalError(w, r, fmt.Errorf("failed to create RequestInfo: %v", err))
		return nil, false
	}
	var as user.Info
	ctx := request.WithRequestInfo(request.WithUser(r.Context(), u.Info()), info)
	c.filter.ServeHTTP(w, r.Clone(context.WithValue(ctx, impersonatedKey{}, &as)))
	if as == nil {
		return nil, false
	}
	c.log.Debug("impersonation", "user", u.Name, "as", as.GetName())
	return &authn.User{Name: as.GetName(), UID: as.GetUID(), Groups: as.GetGroups(), Extra: as.GetExtra(), Method: u.Method + "+impersonation"}, true
}

func hasImpersonation(h http.Header) bool {
	for k := range h {
		if strings.HasPrefix(strings.ToLower(k), "impersonate-") {
			return true
		}
	}
	return false
}
