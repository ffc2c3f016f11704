package upstream

import (
	"net/http"
	"slices"

	"k8s.io/apimachinery/pkg/types"

	"herald.dev/services/frontdoor/internal/reqinfo"
)

// connectSubresources are the subresources kube-apiserver's metrics count
// as CONNECT (its validConnectRequests).
var connectSubresources = []string{"attach", "exec", "portforward", "proxy"}

// upstreamVerbs are the verbs a forwarded request is counted under; any
// other method is "other" (a client chooses it).
var upstreamVerbs = []string{"get", "list", "watch", "create", "update", "patch", "apply", "delete",
	"deletecollection", "connect", "proxy", "post", "put", "head", "options"}

// RequestName names a forwarded request as kube-apiserver's request
// info and metrics do: its verb (connect for exec, attach, portforward and
// proxy; apply for a server-side apply), resource (as frontdoor names those
// it serves: plural.group), subresource and namespace.
func RequestName(r *http.Request) (verb, resource, subresource, namespace string) {
	info, err := reqinfo.Infos.NewRequestInfo(r)
	if err != nil {
		return "other", "", "", ""
	}
	verb = info.Verb
	switch {
	case info.IsResourceRequest && slices.Contains(connectSubresources, info.Subresource):
		verb = "connect"
	case verb == "patch" && r.Header.Get("Content-Type") == string(types.ApplyPatchType):
		verb = "apply"
	case !slices.Contains(upstreamVerbs, verb):
		verb = "other"
	}
	if !info.IsResourceRequest {
		return verb, "", "", ""
	}
	resource = info.Resource
	if info.APIGroup != "" {
		resource += "." + info.APIGroup
	}
	return verb, resource, info.Subresource, info.Namespace
}
