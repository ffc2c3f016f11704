package authz

import (
	"errors"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"herald.dev/services/frontdoor/internal/apierr"
	"herald.dev/services/frontdoor/internal/upstream"
)

// Forbidden is the 403 of a denied request, worded as kube-apiserver's:
// the authorizer's reason, when it gave one, follows the denial.
func Forbidden(a Attributes, why string) error {
	gr := schema.GroupResource{Group: a.APIGroup, Resource: a.Resource}
	msg := ForbiddenReason(a)
	if why != "" {
		msg += ": " + why
	}
	return apierrors.NewForbidden(gr, a.Name, errors.New(msg))
}

// ReviewError is the answer to a request whose SubjectAccessReview could
// not be asked (err from the authorizer): 429 when the review limits held it
// back, 503 when the cluster could not answer; nil for any other error,
// which stays a denial.
func ReviewError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, upstream.ErrReviewThrottled):
		return apierr.TooMany("Too many requests, please try again later.")
	case upstream.ReviewUnavailable(err):
		return apierr.Unavailable("the cluster could not authorize the request: its SubjectAccessReview failed")
	}
	return nil
}
