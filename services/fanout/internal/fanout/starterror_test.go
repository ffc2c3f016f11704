package fanout

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"herald.dev/libs/kube"
	"herald.dev/libs/rv"
)

// A resume that fails for a passing reason is a 429 (client-go retries the
// watch from its resourceVersion; on anything else it relists); what is
// final keeps the cache's status, and a watch that is not a resume is told
// as it always was.
func TestStartError(t *testing.T) {
	resume, fromState := rv.WatchPlan{Mode: rv.WatchAfter, Rev: 10}, rv.WatchPlan{Mode: rv.WatchFromState}
	for _, tc := range []struct {
		err  error
		plan rv.WatchPlan
		code int32
	}{
		{status.Error(codes.Unavailable, "the cache is not ready"), resume, 429},
		{status.Error(codes.Aborted, "watch stream fell behind the shard"), resume, 429},
		{status.Error(codes.DeadlineExceeded, context.DeadlineExceeded.Error()), resume, 429},
		{errors.New("connection reset"), resume, 429},
		{status.Error(codes.OutOfRange, "too old resource version: 1 (5)"), resume, 410},
		{status.Error(codes.DeadlineExceeded, kube.TooLargeMessage+": 12, current: 10"), resume, 504},
		{status.Error(codes.InvalidArgument, "bad selector"), resume, 400},
		{status.Error(codes.Unavailable, "the cache is not ready"), fromState, 503},
	} {
		err := startError(tc.err, tc.plan)
		var se apierrors.APIStatus
		if !errors.As(err, &se) || se.Status().Code != tc.code {
			t.Errorf("startError(%v, mode %v) = %v; want code %d", tc.err, tc.plan.Mode, err, tc.code)
		}
	}
}
