package frontdoor

import (
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// sarKube is a stand-in kube-apiserver for authorization: TokenReview for
// a node's and a user's token, and SubjectAccessReview decided by policy,
// every review's spec recorded.
type sarKube struct {
	srv    *httptest.Server
	policy func(*authorizationv1.SubjectAccessReviewSpec) bool
	mu     sync.Mutex
	specs  []authorizationv1.SubjectAccessReviewSpec
}

const (
	tokNodeN1 = "node-n1-kubelet-token" // system:node:n1
	tokDan    = "dan-token"             // a user with no grants
)

func newSARKube(t *testing.T, policy func(*authorizationv1.SubjectAccessReviewSpec) bool) *sarKube {
	k := &sarKube{policy: policy}
	k.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+heraldToken {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/version":
			w.Write([]byte(`{"major":"1","minor":"37","gitVersion":"v1.37.2"}`))
		case "/apis/authentication.k8s.io/v1/tokenreviews":
			var tr authenticationv1.TokenReview
			json.NewDecoder(r.Body).Decode(&tr)
			switch tr.Spec.Token {
			case tokNodeN1:
				tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{
					Username: "system:node:n1", Groups: []string{"system:nodes", "system:authenticated"}}}
			case tokDan:
				tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{
					Username: "dan", UID: "d-1", Groups: []string{"system:authenticated"}}}
			default:
				tr.Status.Error = "invalid bearer token"
			}
			json.NewEncoder(w).Encode(tr)
		case "/apis/authorization.k8s.io/v1/subjectaccessreviews":
			var sar authorizationv1.SubjectAccessReview
			json.NewDecoder(r.Body).Decode(&sar)
			k.mu.Lock()
			k.specs = append(k.specs, sar.Spec)
			k.mu.Unlock()
			sar.Status.Allowed = k.policy(&sar.Spec)
			if !sar.Status.Allowed {
				sar.Status.Reason = "no relationship found"
			}
			json.NewEncoder(w).Encode(sar)
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	t.Cleanup(k.srv.Close)
	return k
}

func (k *sarKube) caPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: k.srv.Certificate().Raw})
}

// reviews returns the specs reviewed since the last call.
func (k *sarKube) reviews() []authorizationv1.SubjectAccessReviewSpec {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := k.specs
	k.specs = nil
	return out
}

// nodeAuthorizer decides as kube-apiserver's Node authorizer does for a
// kubelet's reads of Secrets and ConfigMaps: of one object its pods
// reference (named in the review), never of a collection.
func nodeAuthorizer(s *authorizationv1.SubjectAccessReviewSpec) bool {
	ra := s.ResourceAttributes
	if s.User != "system:node:n1" || ra == nil || ra.Namespace != "demo" {
		return false
	}
	switch ra.Verb {
	case "get", "list", "watch":
	default:
		return false
	}
	return (ra.Resource == "secrets" && ra.Name == "mounted") || (ra.Resource == "configmaps" && ra.Name == "mounted-cm")
}

// TestClusterReviewAttributes (issue 53, point 6): the SubjectAccessReview
// of a read frontdoor serves carries what kube-apiserver's request info
// gives its authorizers: the name of a list or watch narrowed by
// fieldSelector=metadata.name, the namespace of a Namespace, the version
// asked for. A kubelet's watch-based Secret and ConfigMap managers list and
// watch single objects that way, and the Node authorizer allows exactly
// those.
func TestClusterReviewAttributes(t *testing.T) {
	k := newSARKube(t, nodeAuthorizer)
	fan := newFanoutFake(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
	}))
	defer fan.Close()
	s := clusterServer(t, k.srv.URL, k.caPEM(), func(c *Config) { c.FanoutAddrs = fan.URL })
	k.reviews() // frontdoor's start

	mounted := &authorizationv1.FieldSelectorAttributes{Requirements: []metav1.FieldSelectorRequirement{
		{Key: "metadata.name", Operator: metav1.FieldSelectorOpIn, Values: []string{"mounted"}}}}
	for _, tc := range []struct {
		target string
		code   int
		want   authorizationv1.ResourceAttributes
	}{
		{"/api/v1/namespaces/demo/secrets?fieldSelector=metadata.name%3Dmounted", http.StatusOK,
			authorizationv1.ResourceAttributes{Namespace: "demo", Verb: "list", Version: "v1", Resource: "secrets", Name: "mounted", FieldSelector: mounted}},
		{"/api/v1/namespaces/demo/secrets?fieldSelector=metadata.name%3Dmounted&watch=true&resourceVersion=0", http.StatusOK,
			authorizationv1.ResourceAttributes{Namespace: "demo", Verb: "watch", Version: "v1", Resource: "secrets", Name: "mounted", FieldSelector: mounted}},
		{"/api/v1/namespaces/demo/configmaps?fieldSelector=metadata.name%3Dmounted-cm&watch=1", http.StatusOK,
			authorizationv1.ResourceAttributes{Namespace: "demo", Verb: "watch", Version: "v1", Resource: "configmaps", Name: "mounted-cm",
				FieldSelector: &authorizationv1.FieldSelectorAttributes{Requirements: []metav1.FieldSelectorRequirement{
					{Key: "metadata.name", Operator: metav1.FieldSelectorOpIn, Values: []string{"mounted-cm"}}}}}},
		// Not the one its pods mount: 403, as from kube-apiserver.
		{"/api/v1/namespaces/demo/secrets?fieldSelector=metadata.name%3Dother", http.StatusForbidden,
			authorizationv1.ResourceAttributes{Namespace: "demo", Verb: "list", Version: "v1", Resource: "secrets", Name: "other",
				FieldSelector: &authorizationv1.FieldSelectorAttributes{Requirements: []metav1.FieldSelectorRequirement{
					{Key: "metadata.name", Operator: metav1.FieldSelectorOpIn, Values: []string{"other"}}}}}},
		// A collection: no name.
		{"/api/v1/namespaces/demo/secrets", http.StatusForbidden,
			authorizationv1.ResourceAttributes{Namespace: "demo", Verb: "list", Version: "v1", Resource: "secrets"}},
		// A Namespace is in its own namespace.
		{"/api/v1/namespaces/demo", http.StatusForbidden,
			authorizationv1.ResourceAttributes{Namespace: "demo", Verb: "get", Version: "v1", Resource: "namespaces", Name: "demo"}},
		{"/apis/apps/v1/namespaces/demo/deployments?labelSelector=app%3Dweb", http.StatusForbidden,
			authorizationv1.ResourceAttributes{Namespace: "demo", Verb: "list", Group: "apps", Version: "v1", Resource: "deployments",
				LabelSelector: &authorizationv1.LabelSelectorAttributes{Requirements: []metav1.LabelSelectorRequirement{
					{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{"web"}}}}}},
	} {
		rec := send(s, http.MethodGet, tc.target, tokNodeN1, nil, nil)
		got := k.reviews()
		if rec.Code != tc.code {
			t.Errorf("%s: %d, want %d: %s", tc.target, rec.Code, tc.code, rec.Body)
		}
		if len(got) != 1 || got[0].ResourceAttributes == nil {
			t.Errorf("%s: reviewed %+v, want one resource review", tc.target, got)
			continue
		}
		if !reflect.DeepEqual(*got[0].ResourceAttributes, tc.want) {
			t.Errorf("%s: reviewed\n%+v\nwant\n%+v", tc.target, *got[0].ResourceAttributes, tc.want)
		}
	}
}

// TestStandaloneRBACAttributes (issue 53, point 6, standalone mode): local
// RBAC sees what kube-apiserver's RBAC authorizer sees: resourceNames allow
// a list or watch narrowed to one of the names by fieldSelector, and a
// RoleBinding in namespace X grants what it grants on Namespace X itself.
func TestStandaloneRBACAttributes(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "policy.yaml"), []byte(`
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: one-pod, namespace: ns1}
rules:
- {apiGroups: [""], resources: [pods], resourceNames: [p], verbs: [get, list, watch]}
- {apiGroups: [""], resources: [namespaces], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: bob, namespace: ns1}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: one-pod}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: bob}]
`))
	s, _ := testServer(t, "", func(c *Config) { c.AuthorizationDir = dir })
	for _, tc := range []struct {
		target string
		code   int
	}{
		{"/api/v1/namespaces/ns1/pods?fieldSelector=metadata.name%3Dp", http.StatusOK},
		{"/api/v1/namespaces/ns1/pods/p", http.StatusOK},
		{"/api/v1/namespaces/ns1/pods?fieldSelector=metadata.name%3Dq", http.StatusForbidden},
		{"/api/v1/namespaces/ns1/pods", http.StatusForbidden},
		{"/api/v1/namespaces/ns1/pods?fieldSelector=metadata.name%3Dp%2Cstatus.phase%3DRunning", http.StatusOK},
		{"/api/v1/namespaces/ns1", http.StatusOK},
		{"/api/v1/namespaces/ns2", http.StatusForbidden},
		{"/api/v1/namespaces", http.StatusForbidden},
	} {
		code, body, _ := do(s, tokBob, tc.target)
		if code != tc.code {
			t.Errorf("bob GET %s: %d, want %d: %s", tc.target, code, tc.code, body)
		}
	}
	// The 403 names the object, as kube-apiserver's does.
	_, body, _ := do(s, tokBob, "/api/v1/namespaces/ns1/pods?fieldSelector=metadata.name%3Dq")
	var st metav1.Status
	json.Unmarshal(body, &st)
	if st.Details == nil || st.Details.Name != "q" || !strings.Contains(st.Message, `pods "q" is forbidden: User "bob" cannot list resource "pods" in API group "" in the namespace "ns1"`) {
		t.Errorf("403: %s", body)
	}
}

// TestSelectorsCheckedBeforeReview (issue 53, point 2): a selector that
// does not parse is kube-apiserver's 400, and one past max-selector-bytes a
// 400 naming the limit, both before any SubjectAccessReview.
func TestSelectorsCheckedBeforeReview(t *testing.T) {
	k := newSARKube(t, func(*authorizationv1.SubjectAccessReviewSpec) bool { return false })
	s := clusterServer(t, k.srv.URL, k.caPEM(), nil)
	k.reviews()
	for _, tc := range []struct {
		query, msg string
	}{
		{"fieldSelector=" + url.QueryEscape("metadata.name"), `invalid selector: 'metadata.name'; can't understand 'metadata.name'`},
		{"labelSelector=" + url.QueryEscape("a in (b"), "unable to parse requirement"},
		{"fieldSelector=" + url.QueryEscape("spec.nope=1"), `field label not supported: spec.nope`},
		{"fieldSelector=metadata.name%3D" + strings.Repeat("x", 70000), "fieldSelector and labelSelector together are 70014 bytes, more than the 65536 this server accepts"},
		{"watch=true&labelSelector=a%3D" + strings.Repeat("x", 40000) + "&fieldSelector=metadata.name%3D" + strings.Repeat("x", 30000), "more than the 65536 this server accepts"},
	} {
		rec := send(s, http.MethodGet, "/api/v1/namespaces/demo/secrets?"+tc.query, tokDan, nil, nil)
		code, reason, msg := statusOf(t, rec.Body.Bytes())
		if rec.Code != http.StatusBadRequest || code != 400 || reason != "BadRequest" || !strings.Contains(msg, tc.msg) {
			t.Errorf("%.60s: %d %s %q, want 400 BadRequest with %q", tc.query, code, reason, msg, tc.msg)
		}
	}
	if got := k.reviews(); len(got) != 0 {
		t.Errorf("%d SubjectAccessReviews for requests refused as bad input", len(got))
	}
}
