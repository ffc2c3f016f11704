package frontdoor

import (
	"errors"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The frontdoor's own errors, as the Kubernetes API errors a client gets.
// Errors of the cache come through kube.FromGRPC; option errors found here
// are mapped the same way (request.OptionError), so a client sees the same
// Status whichever hop rejected its request.

// badRequest is a 400 with msg.
func badRequest(msg string) error { return apierrors.NewBadRequest(msg) }

// errUnauthorized is kube-apiserver's 401: the reason stays in the audit
// log, never in the response.
func errUnauthorized() error { return apierrors.NewUnauthorized("Unauthorized") }

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

// errTooMany is a 429 with Retry-After.
func errTooMany(msg string) error { return apierrors.NewTooManyRequests(msg, 1) }

// errUnavailable is a 503 with Retry-After.
func errUnavailable(msg string) error {
	return &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure, Code: http.StatusServiceUnavailable, Reason: metav1.StatusReasonServiceUnavailable,
		Message: msg, Details: &metav1.StatusDetails{RetryAfterSeconds: 1},
	}}
}

// errBodyTooLarge is kube-apiserver's 413.
func errBodyTooLarge(limit int64) error {
	return apierrors.NewRequestEntityTooLargeError("limit is " + itoa(limit))
}
