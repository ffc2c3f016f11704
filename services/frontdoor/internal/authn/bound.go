package authn

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// Bound service-account tokens, in both modes. A token the cluster issued
// for a Pod (TokenRequest with a boundObjectRef, what every projected
// service-account volume holds), a Node or a Secret must stop working once
// that object is gone, as kube-apiserver's own service-account token
// validator ensures. Frontdoor checks the binding itself on every request,
// against its cache, which holds the Pods, Nodes and Secrets:
//
//   - standalone, the token's verified claims name the objects
//     (authenticator.serviceAccount: User.bound); in cluster mode the
//     cluster's answer to TokenReview is cached for a TTL, and its user's
//     extra names the pod (pod-name, pod-uid; the namespace is the service
//     account's) or the node (node-name, node-uid), while a Secret is named
//     only by the token's claims, which are read then (not verified: the
//     cluster verified the token when it reviewed it);
//   - as kube-apiserver's validator does: a Secret named must exist with
//     that uid (a legacy token's claims carry no uid: any); a Pod named must
//     exist with that uid; a Node must, for a token bound to the Node
//     itself (a pod-bound token also names its pod's node, which is not
//     checked then); else 401;
//   - the cache is first asked as it is (resourceVersion "0", no etcd
//     round trip); only an answer of "missing" or "another uid" is checked
//     again with a consistent read, so that an object created a moment ago
//     is not refused because the cache had not applied it yet;
//   - an error of the cache refuses the token (fail closed), as
//     kube-apiserver does when it cannot look the object up. A resource the
//     cache does not hold at all (a registry without it) is not checked.

// errBoundObjectGone: the object the token is bound to no longer exists
// (or is another one of the same name).
var errBoundObjectGone = errors.New("service account token: the object it is bound to no longer exists")

// binding is what a service-account token is bound to (nil: not that).
type binding struct {
	namespace         string // the service account's
	secret, pod, node *objectRef
}

// objectRef is a bound object's name and uid.
type objectRef struct {
	name, uid string
	// anyUID: the claims carry no uid (a legacy token's secret).
	anyUID bool
}

// CheckBound refuses u, authenticated by r's credentials, when its token
// is bound to an object cache does not hold (with that uid); reg names
// the resources cache holds.
func CheckBound(r *http.Request, u *User, reg *kube.Registry, cache heraldv1.CacheClient) error {
	b := u.bound
	if b == nil && u.Method == "tokenreview" {
		token, _ := bearerToken(r.Header.Get("Authorization"))
		b = reviewedBinding(u, token)
	}
	if b == nil {
		return nil
	}
	return checkBinding(r.Context(), b, reg, cache)
}

// reviewedBinding is the binding of a token the cluster reviewed: from the
// user's extra (pod, else node) and the token's claims (secret).
func reviewedBinding(u *User, token string) *binding {
	ns, _, err := serviceaccount.SplitUsername(u.Name)
	if err != nil {
		return nil // not a service account
	}
	b := &binding{namespace: ns}
	pod, podUID := one(u.Extra[serviceaccount.PodNameKey]), one(u.Extra[serviceaccount.PodUIDKey])
	node, nodeUID := one(u.Extra[serviceaccount.NodeNameKey]), one(u.Extra[serviceaccount.NodeUIDKey])
	switch {
	case pod != "" || podUID != "":
		b.pod = &objectRef{name: pod, uid: podUID}
	case node != "" || nodeUID != "":
		b.node = &objectRef{name: node, uid: nodeUID}
	}
	b.secret = secretClaims(token, ns)
	return b
}

// checkBinding reports errBoundObjectGone unless the cache holds every
// object b names, with its uid.
func checkBinding(ctx context.Context, b *binding, reg *kube.Registry, cache heraldv1.CacheClient) error {
	for _, c := range []struct {
		plural, namespace string
		ref               *objectRef
	}{{"secrets", b.namespace, b.secret}, {"pods", b.namespace, b.pod}, {"nodes", "", b.node}} {
		if c.ref == nil {
			continue
		}
		if c.ref.name == "" || (c.ref.uid == "" && !c.ref.anyUID) {
			return fmt.Errorf("service account token: malformed %s binding in namespace %q", c.plural, b.namespace)
		}
		uid := c.ref.uid
		if c.ref.anyUID {
			uid = ""
		}
		if err := checkCached(ctx, reg, cache, c.plural, c.namespace, c.ref.name, uid); err != nil {
			return err
		}
	}
	return nil
}

// secretClaims reads the Secret a service-account JWT names: "kubernetes.io"
// {"namespace", "secret": {"name", "uid"}} for a token bound to a Secret,
// "kubernetes.io/serviceaccount/secret.name" (no uid) for a legacy one. A
// Secret in another namespace than the account's is not a binding.
func secretClaims(token, namespace string) *objectRef {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return nil
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return nil
	}
	var c struct {
		Kubernetes *struct {
			Namespace string    `json:"namespace"`
			Secret    *claimRef `json:"secret"`
		} `json:"kubernetes.io"`
		LegacyNamespace string `json:"kubernetes.io/serviceaccount/namespace"`
		LegacySecret    string `json:"kubernetes.io/serviceaccount/secret.name"`
	}
	if json.Unmarshal(payload, &c) != nil {
		return nil
	}
	switch {
	case c.Kubernetes != nil && c.Kubernetes.Secret != nil && c.Kubernetes.Secret.Name != "" && c.Kubernetes.Namespace == namespace:
		return c.Kubernetes.Secret.ref()
	case c.LegacySecret != "" && c.LegacyNamespace == namespace:
		return &objectRef{name: c.LegacySecret, anyUID: true}
	}
	return nil
}

// checkCached reports errBoundObjectGone unless the cache holds the core/v1
// object namespace/name with uid (any uid when uid is "").
func checkCached(ctx context.Context, reg *kube.Registry, cache heraldv1.CacheClient, plural, namespace, name, uid string) error {
	res, ok := reg.Lookup("", "v1", plural)
	if !ok {
		return nil // the cache does not hold them: TokenReview alone decides
	}
	for _, rv := range []string{"0", ""} {
		resp, err := cache.List(ctx, &heraldv1.ListRequest{Resource: res.ID(), Namespace: namespace, Name: name, ResourceVersion: rv})
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
