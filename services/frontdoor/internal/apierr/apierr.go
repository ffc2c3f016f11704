// Package apierr holds the frontdoor's own errors, as the Kubernetes API
// errors a client gets. Errors of the cache come through kube.FromGRPC;
// option errors found in frontdoor are mapped the same way
// (request.OptionError), so a client sees the same Status whichever hop
// rejected its request.
package apierr

import (
	"net/http"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BadRequest is a 400 with msg.
func BadRequest(msg string) error { return apierrors.NewBadRequest(msg) }

// Unauthorized is kube-apiserver's 401: the reason stays in the audit log,
// never in the response.
func Unauthorized() error { return apierrors.NewUnauthorized("Unauthorized") }

// TooMany is a 429 with Retry-After.
func TooMany(msg string) error { return apierrors.NewTooManyRequests(msg, 1) }

// Unavailable is a 503 with Retry-After.
func Unavailable(msg string) error {
	return &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure, Code: http.StatusServiceUnavailable, Reason: metav1.StatusReasonServiceUnavailable,
		Message: msg, Details: &metav1.StatusDetails{RetryAfterSeconds: 1},
	}}
}

// BodyTooLarge is kube-apiserver's 413.
func BodyTooLarge(limit int64) error {
	return apierrors.NewRequestEntityTooLargeError("limit is " + strconv.FormatInt(limit, 10))
}
