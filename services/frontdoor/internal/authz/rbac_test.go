package authz

import (
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apiserver/pkg/authentication/user"
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
	p, err := LoadPolicy([]string{f})
	if err != nil {
		t.Fatal(err)
	}
	sa := &user.DefaultInfo{Name: "system:serviceaccount:ns1:builder", Groups: []string{"system:serviceaccounts"}}
	viewer := &user.DefaultInfo{Name: "v", Groups: []string{"viewers"}}
	master := &user.DefaultInfo{Name: "m", Groups: []string{"system:masters"}}
	res := func(u user.Info, verb, group, resource, ns, name string) Attributes {
		return Attributes{AttributesRecord: authorizer.AttributesRecord{User: u, Verb: verb, ResourceRequest: true, APIGroup: group, Resource: resource, Namespace: ns, Name: name}}
	}
	for _, tc := range []struct {
		a    Attributes
		want bool
	}{
		{res(sa, "get", "", "configmaps", "ns1", "settings"), true},
		{res(sa, "watch", "", "configmaps", "ns1", "settings"), true},
		{res(sa, "get", "", "configmaps", "ns1", "other"), false},
		{res(sa, "list", "", "configmaps", "ns1", ""), false}, // resourceNames never allow a collection
		// A subresource is not its resource.
		{Attributes{AttributesRecord: authorizer.AttributesRecord{User: viewer, Verb: "list", ResourceRequest: true, APIGroup: "apps", Resource: "deployments", Subresource: "status"}}, false},
		{res(sa, "get", "", "configmaps", "ns2", "settings"), false},
		{res(sa, "get", "", "configmaps", "", "settings"), false},
		{res(&user.DefaultInfo{Name: "system:serviceaccount:ns2:builder"}, "get", "", "configmaps", "ns1", "settings"), false},
		{res(viewer, "list", "apps", "deployments", "", ""), true}, // aggregated, cluster-wide
		{res(viewer, "list", "apps", "deployments", "ns9", ""), true},
		{res(viewer, "watch", "apps", "deployments", "", ""), false},
		{res(viewer, "list", "", "deployments", "", ""), false}, // wrong group
		{res(master, "watch", "", "secrets", "", ""), true},
		{Attributes{AttributesRecord: authorizer.AttributesRecord{User: viewer, Verb: "get", Path: "/metrics"}}, false},
		{Attributes{AttributesRecord: authorizer.AttributesRecord{User: master, Verb: "get", Path: "/debug/pprof/heap"}}, true},
	} {
		if got := p.Authorize(tc.a); got != tc.want {
			t.Errorf("%+v: %v, want %v", tc.a, got, tc.want)
		}
	}
	for _, bad := range []string{
		"apiVersion: v1\nkind: Secret\nmetadata: {name: x}\n",
		"apiVersion: rbac.authorization.k8s.io/v1beta1\nkind: Role\nmetadata: {name: x, namespace: y}\n",
		"apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: x}\nroleRef: {kind: Role, name: r}\n",
		"apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: x}\nroleRef: {kind: Role, name: r}\n",
	} {
		if _, err := LoadPolicy([]string{writeFile(t, filepath.Join(dir, "bad.yaml"), []byte(bad))}); err == nil {
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

func writeFile(t testing.TB, path string, b []byte) string {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
