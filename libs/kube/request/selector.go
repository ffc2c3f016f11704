package request

import (
	"sort"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"

	"herald.dev/libs/kube"
)

// Selector decides which objects of one resource a request sees: a
// namespace (or all), a label selector and a field selector.
type Selector struct {
	Namespace string
	Labels    labels.Selector
	Fields    fields.Selector
	// Empty: everything in the namespace passes; no per-object checks.
	Empty bool
}

// ParseSelector parses and validates labelSelector and fieldSelector for r.
// A field the resource cannot select on is a 400, as in kube-apiserver.
func ParseSelector(r *kube.Resource, namespace, labelSelector, fieldSelector string) (*Selector, error) {
	// kube-apiserver's messages are the parsers' own errors (its
	// parameter codec's) and its scheme's field label conversion's.
	ls, err := labels.Parse(labelSelector)
	if err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	fs, err := fields.ParseSelector(fieldSelector)
	if err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	for _, req := range fs.Requirements() {
		if !r.Selectable(req.Field) {
			return nil, apierrors.NewBadRequest(r.UnknownFieldLabel(req.Field))
		}
	}
	return &Selector{
		Namespace: namespace,
		Labels:    ls,
		Fields:    fs,
		Empty:     ls.Empty() && fs.Empty(),
	}, nil
}

// Everything selects every object of the namespace (or of all namespaces).
func Everything(namespace string) *Selector {
	return &Selector{Namespace: namespace, Labels: labels.Everything(), Fields: fields.Everything(), Empty: true}
}

// Matches reports whether an object with these namespace, labels and fields
// passes. It does not allocate.
func (s *Selector) Matches(namespace string, lbls, flds map[string]string) bool {
	if s.Namespace != "" && namespace != s.Namespace {
		return false
	}
	if s.Empty {
		return true
	}
	return s.Labels.Matches(labels.Set(lbls)) && s.Fields.Matches(fields.Set(flds))
}

// HasSelectors reports whether label or field selectors were given.
func (s *Selector) HasSelectors() bool { return !s.Empty }

// String is a stable description, e.g. for logs.
func (s *Selector) String() string {
	parts := []string{"ns=" + s.Namespace}
	if !s.Labels.Empty() {
		parts = append(parts, "labels="+s.Labels.String())
	}
	if !s.Fields.Empty() {
		parts = append(parts, "fields="+s.Fields.String())
	}
	sort.Strings(parts[1:])
	return strings.Join(parts, ",")
}

// Transition is what a watcher with a selector sees of one change: the
// Kubernetes rule is that an object entering the selection is ADDED, one
// leaving it is DELETED (with its previous state), one staying is MODIFIED.
type Transition uint8

const (
	Skip Transition = iota
	AsAdded
	AsModified
	AsDeleted
	// AsDeletedPrev: DELETED carrying the previous state of the object.
	AsDeletedPrev
)

// Decide applies the rule to one event. kind is "ADDED", "MODIFIED" or
// "DELETED"; prevPasses is only meaningful for MODIFIED.
func Decide(kind string, curPasses, prevPasses bool) Transition {
	switch kind {
	case "ADDED":
		if curPasses {
			return AsAdded
		}
	case "DELETED":
		if curPasses {
			return AsDeleted
		}
	case "MODIFIED":
		switch {
		case curPasses && prevPasses:
			return AsModified
		case curPasses:
			return AsAdded
		case prevPasses:
			return AsDeletedPrev
		}
	}
	return Skip
}
