package frontdoor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// Bound service-account tokens (cluster mode). A token the cluster issued
// for a Pod (TokenRequest with a boundObjectRef, what every projected
// service-account volume holds) must stop working once that Pod is gone,
// as kube-apiserver's own service-account authenticator ensures. The
// cluster's answer to TokenReview is cached here for a TTL, so frontdoor
// checks the binding itself on every request, against its cache, which
// holds the Pods:
//
//   - the user's extra names the pod (pod-name, pod-uid; the namespace is
//     the service account's): the pod must exist with that uid, else 401;
//   - the cache is first asked as it is (resourceVersion "0", no etcd
//     round trip); only an answer of "missing" or "another uid" is checked
//     again with a consistent read, so that a pod created a moment ago is
//     not refused because the cache had not applied it yet;
//   - an error of the cache refuses the token (fail closed), as
//     kube-apiserver does when it cannot look the pod up.
//
// Tokens bound to a Secret carry no name of it in their extra and are left
// to TokenReview (whose TTL bounds how long a revoked one keeps working).

// errBoundObjectGone: the token's pod no longer exists (or is another one).
var errBoundObjectGone = errors.New("service account token: the pod it is bound to no longer exists")

// checkBoundPod returns an error when u's token is bound to a pod that the
// cache does not hold (with the same uid); nil when it does or when the
// token is not bound to a pod.
func (s *Server) checkBoundPod(ctx context.Context, u *User) error {
	name, uid := one(u.Extra[serviceaccount.PodNameKey]), one(u.Extra[serviceaccount.PodUIDKey])
	if name == "" && uid == "" {
		return nil
	}
	ns, _, err := serviceaccount.SplitUsername(u.Name)
	if err != nil || name == "" || uid == "" {
		return fmt.Errorf("service account token: malformed pod binding for %q", u.Name)
	}
	res, ok := s.reg.Lookup("", "v1", "pods")
	if !ok {
		return nil // the cache holds no pods: TokenReview alone decides
	}
	for _, rv := range []string{"0", ""} {
		resp, err := s.cache.List(ctx, &heraldv1.ListRequest{Resource: res.ID(), Namespace: ns, Name: name, ResourceVersion: rv})
		switch {
		case err != nil && apierrors.IsNotFound(kube.FromGRPC(err)):
		case err != nil:
			return fmt.Errorf("service account token: looking up its pod %s/%s: %w", ns, name, err)
		case len(resp.Items) == 1 && objectUID(resp.Items[0]) == uid:
			return nil
		}
	}
	return errBoundObjectGone
}

func one(vs []string) string {
	if len(vs) != 1 {
		return ""
	}
	return vs[0]
}

// objectUID is metadata.uid of a cached object's JSON.
func objectUID(b []byte) string {
	var o struct {
		Metadata struct {
			UID string `json:"uid"`
		} `json:"metadata"`
	}
	if json.Unmarshal(b, &o) != nil {
		return ""
	}
	return o.Metadata.UID
}
