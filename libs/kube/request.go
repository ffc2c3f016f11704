package kube

import (
	"fmt"
	"net/url"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Verb is one of the read verbs Herald serves.
type Verb string

const (
	VerbGet   Verb = "get"
	VerbList  Verb = "list"
	VerbWatch Verb = "watch"
)

// RequestInfo is what a resource request path and its watch parameter say.
type RequestInfo struct {
	Resource  *Resource
	Namespace string // "" for all namespaces or cluster-scoped
	Name      string // "" for collections
	Verb      Verb
}

// ParseRequest resolves a resource path (/api/v1/..., /apis/g/v/...) against
// the registry. Errors are Kubernetes API errors (404 for unknown paths and
// resources, 400 for malformed names, 405 for sub-resources).
func (g *Registry) ParseRequest(path string, query url.Values) (RequestInfo, error) {
	var group, version string
	var rest []string
	parts := splitPath(path)
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		version, rest = parts[1], parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		group, version, rest = parts[1], parts[2], parts[3:]
	default:
		return RequestInfo{}, apierrors.NewNotFound(groupResource("", ""), "")
	}
	watchPath := false
	if len(rest) > 0 && rest[0] == "watch" { // deprecated /watch/ paths
		watchPath, rest = true, rest[1:]
	}
	var ns string
	if len(rest) >= 3 && rest[0] == "namespaces" {
		ns, rest = rest[1], rest[2:]
	}
	if len(rest) == 0 {
		return RequestInfo{}, apierrors.NewNotFound(groupResource(group, ""), "")
	}
	res, ok := g.Lookup(group, version, rest[0])
	if !ok {
		return RequestInfo{}, apierrors.NewNotFound(groupResource(group, rest[0]), "")
	}
	info := RequestInfo{Resource: res, Namespace: ns, Verb: VerbList}
	if len(rest) > 2 {
		return RequestInfo{}, apierrors.NewMethodNotSupported(groupResource(group, rest[0]), "get "+strings.Join(rest[2:], "/"))
	}
	if len(rest) == 2 {
		info.Name, info.Verb = rest[1], VerbGet
		if !validPathSegment(info.Name) {
			return RequestInfo{}, apierrors.NewBadRequest(fmt.Sprintf("invalid name %q", info.Name))
		}
	}
	if ns != "" && !res.Namespaced {
		return RequestInfo{}, apierrors.NewNotFound(groupResource(group, rest[0]), info.Name)
	}
	if ns != "" {
		if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
			return RequestInfo{}, apierrors.NewBadRequest(fmt.Sprintf("invalid namespace %q: %s", ns, strings.Join(msgs, "; ")))
		}
	}
	if w := query.Get("watch"); watchPath || w == "true" || w == "1" {
		info.Verb = VerbWatch
	}
	return info, nil
}

func splitPath(path string) []string {
	path = strings.Trim(path, "/")
	if path == "" {
		return nil
	}
	return strings.Split(path, "/")
}

func validPathSegment(s string) bool {
	return s != "" && s != "." && s != ".." && !strings.ContainsAny(s, "/%")
}

func groupResource(group, resource string) schema.GroupResource {
	return schema.GroupResource{Group: group, Resource: resource}
}
