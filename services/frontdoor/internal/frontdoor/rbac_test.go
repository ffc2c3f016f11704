package frontdoor

import (
	"path/filepath"
	"testing"

	"k8s.io/apiserver/pkg/authorization/authorizer"
)

func TestPolicy(t *testing.T) {
	dir := t.TempDir()
	f := writeFile(t, filepath.Join(dir, "p.yaml"), []byte(`
apiVersion: v1
kind: List
items:
- apiVersion: rbac.authorization.k8s.io/v1
  kind: Role
  metadata: {name: one-cm, namespace: ns1}
  rules:
  - {apiGroups: [""], resources: [configmaps], resourceNames: [settings], verbs: [get, watch]}
- apiVersion: rbac.authorization.k8s.io/v1
  kind: RoleBinding
  metadata: {name: sa, namespace: ns1}
  roleRef: {kind: Role, name: one-cm}
  subjects: [{kind: ServiceAccount, name: builder}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: view}
aggregationRule:
  clusterRoleSelectors: [{matchLabels: {aggregate-to-view: "true"}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: view-deploy, labels: {aggregate-to-view: "true"}}
rules:
- {apiGroups: [apps], resources: [deployments], verbs: [list]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: viewers}
roleRef: {kind: ClusterRole, name: view}
subjects: [{kind: Group, name: viewers}]
`))
	p, err := loadPolicy([]string{f})
	if err != nil {
		t.Fatal(err)
	}
	sa := &User{Name: "system:serviceaccount:ns1:builder", Groups: []string{"system:serviceaccounts"}}
	viewer := &User{Name: "v", Groups: []string{"viewers"}}
	master := &User{Name: "m", Groups: []string{"system:masters"}}
	res := func(u *User, verb, group, resource, ns, name string) attributes {
		return attributes{user: u, AttributesRecord: authorizer.AttributesRecord{Verb: verb, ResourceRequest: true, APIGroup: group, Resource: resource, Namespace: ns, Name: name}}
	}
	for _, tc := range []struct {
		a    attributes
		want bool
	}{
		{res(sa, "get", "", "configmaps", "ns1", "settings"), true},
		{res(sa, "watch", "", "configmaps", "ns1", "settings"), true},
		{res(sa, "get", "", "configmaps", "ns1", "other"), false},
		{res(sa, "list", "", "configmaps", "ns1", ""), false}, // resourceNames never allow a collection
		// A subresource is not its resource.
		{attributes{user: viewer, AttributesRecord: authorizer.AttributesRecord{Verb: "list", ResourceRequest: true, APIGroup: "apps", Resource: "deployments", Subresource: "status"}}, false},
		{res(sa, "get", "", "configmaps", "ns2", "settings"), false},
		{res(sa, "get", "", "configmaps", "", "settings"), false},
		{res(&User{Name: "system:serviceaccount:ns2:builder"}, "get", "", "configmaps", "ns1", "settings"), false},
		{res(viewer, "list", "apps", "deployments", "", ""), true}, // aggregated, cluster-wide
		{res(viewer, "list", "apps", "deployments", "ns9", ""), true},
		{res(viewer, "watch", "apps", "deployments", "", ""), false},
		{res(viewer, "list", "", "deployments", "", ""), false}, // wrong group
		{res(master, "watch", "", "secrets", "", ""), true},
		{attributes{user: viewer, AttributesRecord: authorizer.AttributesRecord{Verb: "get", Path: "/metrics"}}, false},
		{attributes{user: master, AttributesRecord: authorizer.AttributesRecord{Verb: "get", Path: "/debug/pprof/heap"}}, true},
	} {
		if got := p.authorize(tc.a); got != tc.want {
			t.Errorf("%+v: %v, want %v", tc.a, got, tc.want)
		}
	}
	for _, bad := range []string{
		"apiVersion: v1\nkind: Secret\nmetadata: {name: x}\n",
		"apiVersion: rbac.authorization.k8s.io/v1beta1\nkind: Role\nmetadata: {name: x, namespace: y}\n",
		"apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: x}\nroleRef: {kind: Role, name: r}\n",
		"apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: x}\nroleRef: {kind: Role, name: r}\n",
	} {
		if _, err := loadPolicy([]string{writeFile(t, filepath.Join(dir, "bad.yaml"), []byte(bad))}); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}

// TestResourceMatches: rules name a subresource as kube-apiserver's RBAC
// does ("resource/subresource", "*/subresource", "*").
func TestResourceMatches(t *testing.T) {
	for _, tc := range []struct {
		rules         []string
		resource, sub string
		want          bool
	}{
		{[]string{"pods"}, "pods", "", true},
		{[]string{"pods"}, "pods", "log", false},
		{[]string{"pods/log"}, "pods", "log", true},
		{[]string{"pods/log"}, "pods", "", false},
		{[]string{"*/scale"}, "deployments", "scale", true},
		{[]string{"*/scale"}, "deployments", "", false},
		{[]string{"*"}, "deployments", "scale", true},
	} {
		if got := resourceMatches(tc.rules, tc.resource, tc.sub); got != tc.want {
			t.Errorf("%v on %s/%s: %v, want %v", tc.rules, tc.resource, tc.sub, got, tc.want)
		}
	}
}
