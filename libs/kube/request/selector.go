package request

import (
	"fmt"
	"sort"
	"strings"

	"herald.dev/libs/kube"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
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

// Requirement is one term of a parsed selector: k8s.io/apimachinery's
// labels.Requirement or fields.Requirement as plain values (Operator is a
// selection.Operator; a field's has one value), the form a parsed selector
// crosses a hop in (libs/proto's Selector).
type Requirement struct {
	Key      string
	Operator string
	Values   []string
}

// Requirements returns the terms of s's label and field selectors, as
// parsed: NewSelector makes the same selector of them.
func (s *Selector) Requirements() (lbls, flds []Requirement) {
	if lr, ok := s.Labels.Requirements(); ok {
		for _, r := range lr {
			lbls = append(lbls, Requirement{Key: r.Key(), Operator: string(r.Operator()), Values: r.ValuesUnsorted()})
		}
	}
	for _, r := range s.Fields.Requirements() {
		flds = append(flds, Requirement{Key: r.Field, Operator: string(r.Operator), Values: []string{r.Value}})
	}
	return lbls, flds
}

// NewSelector is ParseSelector for selectors parsed already (Requirements,
// on the other side of a hop): it checks every term as the parsers and
// ParseSelector do (the same 400s), but parses no string.
func NewSelector(r *kube.Resource, namespace string, lbls, flds []Requirement) (*Selector, error) {
	ls := labels.NewSelector()
	for _, q := range lbls {
		req, err := labels.NewRequirement(q.Key, selection.Operator(q.Operator), q.Values)
		if err != nil {
			return nil, apierrors.NewBadRequest(err.Error())
		}
		ls = ls.Add(*req)
	}
	terms := make([]fields.Selector, 0, len(flds))
	for _, q := range flds {
		if len(q.Values) != 1 {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("field selector %q: %d values, want 1", q.Key, len(q.Values)))
		}
		switch selection.Operator(q.Operator) {
		case selection.Equals, selection.DoubleEquals:
			terms = append(terms, fields.OneTermEqualSelector(q.Key, q.Values[0]))
		case selection.NotEquals:
			terms = append(terms, fields.OneTermNotEqualSelector(q.Key, q.Values[0]))
		default:
			return nil, apierrors.NewBadRequest(fmt.Sprintf("field selector %q: invalid operator %q", q.Key, q.Operator))
		}
		if !r.Selectable(q.Key) {
			return nil, apierrors.NewBadRequest(r.UnknownFieldLabel(q.Key))
		}
	}
	fs := fields.Everything()
	if len(terms) > 0 {
		fs = fields.AndSelectors(terms...)
	}
	return &Selector{Namespace: namespace, Labels: ls, Fields: fs, Empty: ls.Empty() && fs.Empty()}, nil
}

// Everything selects every object of the namespace (or of all namespaces).
func Everything(namespace string) *Selector {
	return &Selector{Namespace: namespace, Labels: labels.Everything(), Fields: fields.Everything(), Empty: true}
}

// Matches reports whether an object with these namespace, labels and fields
// passes: labels.Set and fields.Set for an object's maps, or any other
// lookup (an event's pairs as decoded), so that no set is built per object
// per watcher. It does not allocate (pass pointer-shaped lbls and flds:
// maps, pointers).
func (s *Selector) Matches(namespace string, lbls labels.Labels, flds fields.Fields) bool {
	if s.Namespace != "" && namespace != s.Namespace {
		return false
	}
	if s.Empty {
		return true
	}
	return s.Labels.Matches(lbls) && s.Fields.Matches(flds)
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
