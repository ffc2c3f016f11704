package kube

import (
	"context"
	"net/http"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TooLargeMessage starts the message of the cache's DeadlineExceeded for a
// revision it has not reached in time (kube-apiserver's words).
const TooLargeMessage = "Too large resource version"

// FromGRPC converts an error of the cache's gRPC contract (see
// herald.proto) into the Kubernetes API error a client gets.
func FromGRPC(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	msg := st.Message()
	mk := func(code int32, reason metav1.StatusReason, d *metav1.StatusDetails) error {
		return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: code, Reason: reason, Message: msg, Details: d}}
	}
	switch st.Code() {
	case codes.OK:
		return nil
	case codes.InvalidArgument:
		return mk(http.StatusBadRequest, metav1.StatusReasonBadRequest, nil)
	case codes.FailedPrecondition:
		return mk(http.StatusUnprocessableEntity, metav1.StatusReasonInvalid, nil)
	case codes.NotFound:
		return mk(http.StatusNotFound, metav1.StatusReasonNotFound, nil)
	case codes.OutOfRange:
		e := mk(http.StatusGone, metav1.StatusReasonExpired, nil)
		if info, ok := compactedInfo(err); ok {
			// The continue token of an inconsistent list (compacted.go).
			e.(*apierrors.StatusError).ErrStatus.ListMeta.Continue = info.Metadata[continueKey]
		}
		return e
	case codes.DeadlineExceeded:
		d := &metav1.StatusDetails{RetryAfterSeconds: 1}
		if msg != context.DeadlineExceeded.Error() {
			// The cache's own "not reached in time" is a too-large
			// resourceVersion (client-go relists on it); a call that ran
			// out of its own time is a plain timeout.
			d.Causes = []metav1.StatusCause{{Type: metav1.CauseTypeResourceVersionTooLarge, Message: TooLargeMessage}}
		}
		msg = "Timeout: " + msg // as apierrors.NewTimeoutError words it
		return mk(http.StatusGatewayTimeout, metav1.StatusReasonTimeout, d)
	case codes.ResourceExhausted:
		return mk(http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests, &metav1.StatusDetails{RetryAfterSeconds: 1})
	case codes.Unavailable, codes.Canceled, codes.Aborted:
		msg = "the server is currently unable to handle the request: " + msg
		return mk(http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, &metav1.StatusDetails{RetryAfterSeconds: 1})
	}
	return err
}
