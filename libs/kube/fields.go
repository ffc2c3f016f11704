package kube

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// UnknownFieldLabel is how kube-apiserver refuses a field label r does not
// have: the words of the kind's field label conversion function
// (pkg/apis/<group>/<version>/conversion.go), or of
// runtime.DefaultMetaV1FieldSelectorConversion for a built-in kind that
// registers none; custom resources' as apiextensions-apiserver words it.
func (r *Resource) UnknownFieldLabel(label string) string {
	switch {
	case !r.builtin:
	case r.Group == "batch" && r.Kind == "Job":
		return fmt.Sprintf("field label %q not supported for Job", label)
	case r.Group == "resource.k8s.io" && r.Kind == "ResourceSlice":
		return fmt.Sprintf("field label not supported for %s: %s", schema.GroupVersionKind{Group: r.Group, Version: r.Version, Kind: r.Kind}, label)
	case defaultFieldLabels(r.stored.FieldLabels):
		return fmt.Sprintf("%q is not a known field selector: only %q, %q", label, "metadata.name", "metadata.namespace")
	}
	return "field label not supported: " + label
}

// defaultFieldLabels reports whether labels are those of
// runtime.DefaultMetaV1FieldSelectorConversion (the kind registers no field
// label conversion of its own).
func defaultFieldLabels(labels map[string]string) bool {
	_, name := labels["metadata.name"]
	_, ns := labels["metadata.namespace"]
	return len(labels) == 2 && name && ns
}

// Selectable reports whether a fieldSelector may name field for r.
func (r *Resource) Selectable(field string) bool {
	if field == "metadata.name" || (field == "metadata.namespace" && r.Namespaced) {
		return true
	}
	for _, f := range r.Fields {
		if f.Name == field {
			return true
		}
	}
	return false
}
