package kube

import (
	"net/http"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestCompactedErrorAsKubeAPIServer: the cache's answer to a list at a
// revision etcd compacted, after crossing gRPC, is kube-apiserver's 410:
// for a continued list with the inconsistent continue token in the
// Status's metadata, for an exact list without; other 410s of the cache
// (a window that no longer holds a revision) are not it.
func TestCompactedErrorAsKubeAPIServer(t *testing.T) {
	overTheWire := func(err error) error {
		st, _ := status.FromError(err)
		return status.FromProto(st.Proto()).Err()
	}
	for _, tc := range []struct {
		name, token, msg string
	}{
		{"continue", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6LTEsInN0YXJ0IjoiL3gifQ", InconsistentContinueMessage},
		{"exact", "", ExpiredListMessage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := overTheWire(CompactedError(tc.token))
			if !Compacted(err) {
				t.Fatalf("Compacted(%v) = false", err)
			}
			got := StatusOf(FromGRPC(err))
			want := metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, ListMeta: metav1.ListMeta{Continue: tc.token},
				Status: metav1.StatusFailure, Message: tc.msg, Reason: metav1.StatusReasonExpired, Code: http.StatusGone}
			if got != want {
				t.Errorf("Status %+v\nwant %+v", got, want)
			}
			if !apierrors.IsResourceExpired(FromGRPC(err)) {
				t.Error("not ResourceExpired")
			}
		})
	}
	window := overTheWire(status.Error(codes.OutOfRange, "too old resource version: 5"))
	if Compacted(window) || StatusOf(FromGRPC(window)).ListMeta.Continue != "" {
		t.Errorf("a window's 410 reads as compacted: %v", window)
	}
}
