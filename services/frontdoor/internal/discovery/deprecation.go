package discovery

import (
	"sync"

	"k8s.io/apimachinery/pkg/runtime/schema"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/apiserver/pkg/endpoints/deprecation"
	clientscheme "k8s.io/client-go/kubernetes/scheme"

	"herald.dev/libs/kube"
)

// Deprecations is the Warning header kube-apiserver adds to every request
// its handlers serve for a deprecated API version ("v1 Endpoints is
// deprecated in v1.33+; use discovery.k8s.io/v1 EndpointSlice"), judged,
// as there, by k8s.io/apiserver's deprecation package at the server's
// version: the cluster's kube-apiserver's in cluster mode, the one
// frontdoor's /version reports standalone. A custom resource's comes from
// its CRD (kube.Resource.Warning), as apiextensions-apiserver's does.
type Deprecations struct {
	major, minor int // 0, 0: a version that does not parse (every deprecation applies, as in kube-apiserver)
	headers      sync.Map
}

// NewDeprecations judges deprecations at version v.
func NewDeprecations(v version.Info) *Deprecations {
	major, minor, _ := deprecation.MajorMinor(v)
	return &Deprecations{major: major, minor: minor}
}

// Header returns the Warning header value for requests of r, "" if none.
func (d *Deprecations) Header(r *kube.Resource) string {
	if r.Custom() {
		return r.Warning()
	}
	gvk := r.GroupVersionKind()
	if h, ok := d.headers.Load(gvk); ok {
		return h.(string)
	}
	h := d.compute(gvk)
	d.headers.Store(gvk, h)
	return h
}

func (d *Deprecations) compute(gvk schema.GroupVersionKind) string {
	obj, err := clientscheme.Scheme.New(gvk)
	if err != nil || !deprecation.IsDeprecated(obj, d.major, d.minor) {
		return ""
	}
	obj.GetObjectKind().SetGroupVersionKind(gvk)
	h, err := utilnet.NewWarningHeader(299, "-", deprecation.WarningMessage(obj))
	if err != nil {
		return ""
	}
	return h
}
