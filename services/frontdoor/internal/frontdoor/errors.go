package frontdoor

import (
	"errors"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The frontdoor's own errors are apierr's; this one is of a denial.

// errForbidden is the 403 of a denied request, worded as kube-apiserver's:
// the authorizer's reason, when it gave one, follows the denial.
func errForbidden(a attributes, why string) error {
	gr := schema.GroupResource{Group: a.APIGroup, Resource: a.Resource}
	msg := forbiddenReason(a)
	if why != "" {
		msg += ": " + why
	}
	return apierrors.NewForbidden(gr, a.Name, errors.New(msg))
}
