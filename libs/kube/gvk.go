package kube

import "k8s.io/apimachinery/pkg/runtime/schema"

// GroupVersionKind is the kind of the resource's objects as served.
func (r *Resource) GroupVersionKind() schema.GroupVersionKind {
	return schema.GroupVersionKind{Group: r.Group, Version: r.Version, Kind: r.Kind}
}
