package kube

import (
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Lists at a revision etcd has compacted. kube-apiserver reads such a list
// from etcd and gets ErrCompacted (k8s.io/apiserver's etcd3 storage,
// GetList): a continued list is answered 410 Expired with a continue token
// that goes on after the same key at the latest state (an "inconsistent"
// list), any other list at that exact revision 410 Expired. The cache
// answers both as soon as it knows etcd's compaction revision (it follows
// the key kube-apiserver's compactor records it in), however much of that
// history its own window still holds; the frontdoor writes the answer as
// it is, as kube-apiserver would have.

// kube-apiserver's messages (its etcd storage's).
const (
	ExpiredListMessage          = "The resourceVersion for the provided list is too old."
	InconsistentContinueMessage = "The provided continue parameter is too old " +
		"to display a consistent list result. You can start a new list without " +
		"the continue parameter, or use the continue token in this response to " +
		"retrieve the remainder of the results. Continuing with the provided " +
		"token results in an inconsistent list - objects that were created, " +
		"modified, or deleted between the time the first chunk was returned " +
		"and now may show up in the list."
)

// The ErrorInfo that marks the cache's answer in its gRPC status.
const (
	compactedDomain = "herald.dev"
	compactedReason = "Compacted"
	continueKey     = "continue"
)

// CompactedError is the cache's gRPC error for a list at a revision etcd
// has compacted: OutOfRange (410 Expired) in kube-apiserver's words, with
// inconsistent (an encoded continue token) for a continued list, "" for
// any other.
func CompactedError(inconsistent string) error {
	msg := ExpiredListMessage
	info := &errdetails.ErrorInfo{Domain: compactedDomain, Reason: compactedReason}
	if inconsistent != "" {
		msg = InconsistentContinueMessage
		info.Metadata = map[string]string{continueKey: inconsistent}
	}
	st := status.New(codes.OutOfRange, msg)
	if withInfo, err := st.WithDetails(info); err == nil {
		st = withInfo
	}
	return st.Err()
}

// Compacted reports whether err (from the cache) is a CompactedError.
func Compacted(err error) bool {
	_, ok := compactedInfo(err)
	return ok
}

// compactedInfo is the ErrorInfo of a CompactedError.
func compactedInfo(err error) (*errdetails.ErrorInfo, bool) {
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &se) {
		return nil, false
	}
	st := se.GRPCStatus()
	if st.Code() != codes.OutOfRange {
		return nil, false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Domain == compactedDomain && info.Reason == compactedReason {
			return info, true
		}
	}
	return nil, false
}
