package frontdoor

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// statusInvalid is an option combination kube-apiserver rejects as 422.
func statusInvalid(msg string) error { return status.Error(codes.FailedPrecondition, msg) }
