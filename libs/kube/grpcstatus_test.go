package kube

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The cache's contract mapped to what a client sees; a deadline is a
// too-large resourceVersion (which makes client-go relist) only when the
// cache says so, not when a call ran out of its own time.
func TestFromGRPC(t *testing.T) {
	tooLarge := func(err error) bool {
		var se apierrors.APIStatus
		if !errors.As(err, &se) || se.Status().Details == nil {
			return false
		}
		for _, c := range se.Status().Details.Causes {
			if c.Type == metav1.CauseTypeResourceVersionTooLarge {
				return true
			}
		}
		return false
	}
	for _, tc := range []struct {
		err      error
		code     int32
		tooLarge bool
	}{
		{status.Error(codes.OutOfRange, "too old resource version: 1 (5)"), 410, false},
		{status.Error(codes.DeadlineExceeded, TooLargeMessage+": 12, current: 10"), 504, true},
		{status.Error(codes.DeadlineExceeded, "the cache did not reach etcd's current revision in time"), 504, true},
		{status.Error(codes.DeadlineExceeded, context.DeadlineExceeded.Error()), 504, false},
		{status.Error(codes.Unavailable, "the cache is not ready"), 503, false},
		{status.Error(codes.ResourceExhausted, "slow down"), 429, false},
		{status.Error(codes.InvalidArgument, "bad selector"), 400, false},
	} {
		err := FromGRPC(tc.err)
		var se apierrors.APIStatus
		if !errors.As(err, &se) || se.Status().Code != tc.code || tooLarge(err) != tc.tooLarge {
			t.Errorf("FromGRPC(%v) = %v; want code %d, too large %v", tc.err, err, tc.code, tc.tooLarge)
		}
	}
}
