package frontdoor

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// Bound service-account tokens (cluster mode). A token the cluster issued
// for a Pod (TokenRequest with a boundObjectRef, what every projected
// service-account volume holds) or for a Node must stop working once that
// object is gone, as kube-apiserver's own service-account authenticator
// ensures. The cluster's answer to TokenReview is cached here for a TTL, so
// frontdoor checks the binding itself on every request, against its cache,
// which holds the Pods and Nodes:
//
//   - the user's extra names the pod (pod-name, pod-uid; the namespace is
//     the service account's): the pod must exist with that uid, else 401.
//     Such a token also names its pod's node; like kube-apiserver, only the
//     pod is checked then;
//   - else the extra names a node (node-name, node-uid: a token bound to the
//     Node itself): the node must exist with that uid, else 401;
//   - the cache is first asked as it is (resourceVersion "0", no etcd
//     round trip); only an answer of "missing" or "another uid" is checked
//     again with a consistent read, so that an object created a moment ago
//     is not refused because the cache had not applied it yet;
//   - an error of the cache refuses the token (fail closed), as
//     kube-apiserver does when it cannot look the object up.
//
//   - else a token naming a Secret in its claims (a TokenRequest bound to a
//     Secret, or a legacy token stored in one): the Secret must exist (with
//     that uid, when the claims carry one), else 401. The extra does not name
//     the Secret, so its claims are read (not verified: the cluster verified
//     the token when it reviewed it).

// errBoundObjectGone: the object the token is bound to no longer exists
// (or is another one of the same name).
var errBoundObjectGone = errors.New("service account token: the object it is bound to no longer exists")

// checkBoundObject returns an error when u's token is bound to a pod, node
// or secret that the cache does not hold (with the same uid); nil when it
// does or when the token is bound to none.
func (s *Server) checkBoundObject(ctx context.Context, u *User, token string) error {
	pod, podUID := one(u.Extra[serviceaccount.PodNameKey]), one(u.Extra[serviceaccount.PodUIDKey])
	node, nodeUID := one(u.Extra[serviceaccount.NodeNameKey]), one(u.Extra[serviceaccount.NodeUIDKey])
	switch {
	case pod != "" || podUID != "":
		ns, _, err := serviceaccount.SplitUsername(u.Name)
		if err != nil || pod == "" || podUID == "" {
			return fmt.Errorf("service account token: malformed pod binding for %q", u.Name)
		}
		return s.checkCached(ctx, "pods", ns, pod, podUID)
	case node != "" && nodeUID != "":
		return s.checkCached(ctx, "nodes", "", node, nodeUID)
	}
	ns, _, err := serviceaccount.SplitUsername(u.Name)
	if err != nil {
		return nil // not a service account
	}
	if name, uid, ok := secretClaims(token, ns); ok {
		return s.checkCached(ctx, "secrets", ns, name, uid)
	}
	return nil
}

// secretClaims reads the Secret a service-account JWT names: "kubernetes.io"
// {"namespace", "secret": {"name", "uid"}} for a token bound to a Secret,
// "kubernetes.io/serviceaccount/secret.name" (no uid) for a legacy one. A
// Secret in another namespace than the account's is not a binding.
func secretClaims(token, namespace string) (name, uid string, ok bool) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return "", "", false
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return "", "", false
	}
	var c struct {
		Kubernetes *struct {
			Namespace string `json:"namespace"`
			Secret    *struct {
				Name string `json:"name"`
				UID  string `json:"uid"`
			} `json:"secret"`
		} `json:"kubernetes.io"`
		LegacyNamespace string `json:"kubernetes.io/serviceaccount/namespace"`
		LegacySecret    string `json:"kubernetes.io/serviceaccount/secret.name"`
	}
	if json.Unmarshal(payload, &c) != nil {
		return "", "", false
	}
	switch {
	case c.Kubernetes != nil && c.Kubernetes.Secret != nil && c.Kubernetes.Secret.Name != "" && c.Kubernetes.Namespace == namespace:
		return c.Kubernetes.Secret.Name, c.Kubernetes.Secret.UID, true
	case c.LegacySecret != "" && c.LegacyNamespace == namespace:
		return c.LegacySecret, "", true
	}
	return "", "", false
}

// checkCached reports errBoundObjectGone unless the cache holds the core/v1
// object namespace/name with uid (any uid when uid is "").
func (s *Server) checkCached(ctx context.Context, plural, namespace, name, uid string) error {
	res, ok := s.reg.Lookup("", "v1", plural)
	if !ok {
		return nil // the cache does not hold them: TokenReview alone decides
	}
	for _, rv := range []string{"0", ""} {
		resp, err := s.cache.List(ctx, &heraldv1.ListRequest{Resource: res.ID(), Namespace: namespace, Name: name, ResourceVersion: rv})
		switch {
		case err != nil && apierrors.IsNotFound(kube.FromGRPC(err)):
		case err != nil:
			return fmt.Errorf("service account token: looking up its %s %s/%s: %w", plural, namespace, name, err)
		case len(resp.Items) == 1 && (uid == "" || objectUID(resp.Items[0]) == uid):
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
