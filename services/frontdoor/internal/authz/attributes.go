// Package authz authorizes the frontdoor's requests: with local RBAC
// manifests (Policy) standalone, with the cluster's SubjectAccessReview
// (ReviewAuthorizer, its decisions cached in a byte budget) in cluster mode,
// of the attributes kube-apiserver would authorize.
package authz

import (
	"fmt"
	"net/http"
	"net/url"

	kuberequest "herald.dev/libs/kube/request"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/endpoints/filters"
	"k8s.io/apiserver/pkg/endpoints/request"

	"herald.dev/services/frontdoor/internal/apierr"
	"herald.dev/services/frontdoor/internal/reqinfo"
)

// Attributes describe one request to authorize: exactly what
// kube-apiserver's authorization filter hands its authorizers (Node, RBAC,
// webhooks), built by the same code — k8s.io/apiserver's request-info
// resolver (reqinfo.Infos) and filters.GetAuthorizerAttributes:
//
//   - the verb: get, list or watch for a read (watch for ?watch=true and
//     /watch/ paths), the HTTP method in lower case for a non-resource path;
//   - the API group and the version asked for (never "*");
//   - the namespace: of a namespaced path, and a Namespace's own name for
//     /api/v1/namespaces/X (a RoleBinding in X grants on Namespace X);
//   - the name: of the object's path, or of a list or watch narrowed to one
//     object by fieldSelector=metadata.name=X (what the Node authorizer
//     lets a kubelet list and watch, and RBAC's resourceNames match);
//   - the field and label selectors of a list or watch, parsed.
//
// AttributesRecord.User is the caller (or whom it impersonates).
type Attributes struct {
	authorizer.AttributesRecord
}

// RequestAttributes builds r's Attributes for u, as kube-apiserver's
// handler chain does (WithRequestInfo, then WithAuthorization's
// GetAuthorizerAttributes).
func RequestAttributes(r *http.Request, u user.Info) (Attributes, error) {
	info, err := reqinfo.Infos.NewRequestInfo(r)
	if err != nil {
		return Attributes{}, fmt.Errorf("failed to create RequestInfo: %w", err)
	}
	ctx := request.WithRequestInfo(request.WithUser(r.Context(), u), info)
	a, err := filters.GetAuthorizerAttributes(ctx)
	if err != nil {
		return Attributes{}, err
	}
	rec, ok := a.(*authorizer.AttributesRecord)
	if !ok {
		return Attributes{}, fmt.Errorf("authorization Attributes of type %T", a)
	}
	return Attributes{AttributesRecord: *rec}, nil
}

// CheckSelectors validates a list's or watch's selectors before they reach
// an authorizer: a review carries them (and a SubjectAccessReview's cache
// would be keyed by them), so a selector that does not parse is refused
// first, with the 400 kube-apiserver's handler gives it (the parsers' own
// messages, field labels the resource does not have), and so are selectors
// larger together than max bytes. kube-apiserver itself bounds them only by
// its 1 MiB of request headers.
func CheckSelectors(info kuberequest.Info, q url.Values, max int) error {
	if info.Verb != kuberequest.VerbList && info.Verb != kuberequest.VerbWatch {
		return nil // a GET's options have no selectors
	}
	n := 0
	for _, k := range []string{"fieldSelector", "labelSelector"} {
		for _, v := range q[k] {
			n += len(v)
		}
	}
	if n > max {
		return apierr.BadRequest(fmt.Sprintf("fieldSelector and labelSelector together are %d bytes, more than the %d this server accepts (max-selector-bytes)", n, max))
	}
	if _, err := kuberequest.ParseSelector(info.Resource, info.Namespace, q.Get("labelSelector"), q.Get("fieldSelector")); err != nil {
		return kuberequest.OptionError(err)
	}
	return nil
}

// ServedAttributes are the Attributes of a read frontdoor serves itself
// (info, as the registry resolved the path): kube-apiserver's, which must
// name the verb, group, resource and object that frontdoor serves, or the
// decision would be about another request (a 500, as for a request info
// kube-apiserver cannot build).
func ServedAttributes(r *http.Request, u user.Info, info kuberequest.Info) (Attributes, error) {
	a, err := RequestAttributes(r, u)
	if err != nil {
		return Attributes{}, apierrors.NewInternalError(err)
	}
	if !a.ResourceRequest || a.Verb != string(info.Verb) || a.APIGroup != info.Resource.Group || a.Resource != info.Resource.Plural ||
		(info.Name != "" && a.Name != info.Name) {
		return Attributes{}, apierrors.NewInternalError(fmt.Errorf("request info %s %s/%s %q differs from the request served, %s %s %q",
			a.Verb, a.APIGroup, a.Resource, a.Name, info.Verb, info.Resource.ID(), info.Name))
	}
	return a, nil
}
