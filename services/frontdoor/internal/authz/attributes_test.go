package authz

import (
	"net/http/httptest"
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/endpoints/filters"
	"k8s.io/apiserver/pkg/endpoints/request"
)

// TestRequestAttributes: the attributes frontdoor authorizes are those
// kube-apiserver's handler chain builds (its request-info resolver, with
// the API prefixes kube-apiserver configures, then its authorization
// filter's GetAuthorizerAttributes), and what they say for the cases of
// issue 53: a list or watch narrowed by fieldSelector=metadata.name names
// the object, a Namespace is in its own namespace, the version is the one
// asked for, subresources and non-resource paths.
func TestRequestAttributes(t *testing.T) {
	kube := &request.RequestInfoFactory{APIPrefixes: sets.NewString("api", "apis"), GrouplessAPIPrefixes: sets.NewString("api")}
	u := &user.DefaultInfo{Name: "system:node:n1", Groups: []string{"system:nodes"}}
	rr := func(verb, group, version, resource, sub, ns, name string) authorizer.AttributesRecord {
		return authorizer.AttributesRecord{Verb: verb, ResourceRequest: true, APIGroup: group, APIVersion: version, Resource: resource,
			Subresource: sub, Namespace: ns, Name: name}
	}
	sel := func(s string) fields.Requirements { return fields.ParseSelectorOrDie(s).Requirements() }
	with := func(a authorizer.AttributesRecord, f func(*authorizer.AttributesRecord)) authorizer.AttributesRecord {
		f(&a)
		return a
	}
	for _, tc := range []struct {
		method, target string
		want           authorizer.AttributesRecord
	}{
		{"GET", "/api/v1/namespaces/demo/secrets?fieldSelector=metadata.name%3Dmounted",
			with(rr("list", "", "v1", "secrets", "", "demo", "mounted"), func(a *authorizer.AttributesRecord) { a.FieldSelectorRequirements = sel("metadata.name=mounted") })},
		{"GET", "/api/v1/namespaces/demo/configmaps?watch=true&fieldSelector=metadata.name%3Dcm&resourceVersion=7",
			with(rr("watch", "", "v1", "configmaps", "", "demo", "cm"), func(a *authorizer.AttributesRecord) { a.FieldSelectorRequirements = sel("metadata.name=cm") })},
		// Not a single name: no name (an inequality, two names, an
		// invalid name).
		{"GET", "/api/v1/namespaces/demo/secrets?fieldSelector=metadata.name%21%3Dx",
			with(rr("list", "", "v1", "secrets", "", "demo", ""), func(a *authorizer.AttributesRecord) { a.FieldSelectorRequirements = sel("metadata.name!=x") })},
		{"GET", "/api/v1/namespaces/demo/secrets?fieldSelector=metadata.name%3Da%2Fb",
			with(rr("list", "", "v1", "secrets", "", "demo", ""), func(a *authorizer.AttributesRecord) { a.FieldSelectorRequirements = sel("metadata.name=a/b") })},
		{"GET", "/api/v1/namespaces/demo/secrets?fieldSelector=metadata.name%3Da%2Ctype%3Dt&labelSelector=app%3Dweb",
			with(rr("list", "", "v1", "secrets", "", "demo", "a"), func(a *authorizer.AttributesRecord) {
				a.FieldSelectorRequirements = sel("metadata.name=a,type=t")
				a.LabelSelectorRequirements, _ = labels.SelectorFromSet(labels.Set{"app": "web"}).Requirements()
			})},
		// A /watch/ path: its verb from the path, selectors not carried.
		{"GET", "/api/v1/watch/namespaces/demo/secrets/s?fieldSelector=metadata.name%3Ds", rr("watch", "", "v1", "secrets", "", "demo", "s")},
		// A GET's selectors are not its options.
		{"GET", "/api/v1/namespaces/demo/secrets/s?fieldSelector=metadata.name%3Dx", rr("get", "", "v1", "secrets", "", "demo", "s")},
		{"GET", "/api/v1/namespaces/demo", rr("get", "", "v1", "namespaces", "", "demo", "demo")},
		{"GET", "/api/v1/namespaces", rr("list", "", "v1", "namespaces", "", "", "")},
		{"GET", "/api/v1/namespaces/demo/status", rr("get", "", "v1", "namespaces", "status", "demo", "demo")},
		{"GET", "/apis/apps/v1/deployments", rr("list", "apps", "v1", "deployments", "", "", "")},
		{"GET", "/apis/batch/v1beta1/namespaces/ns/cronjobs/c", rr("get", "batch", "v1beta1", "cronjobs", "", "ns", "c")},
		{"GET", "/api/v1/namespaces/demo/pods/p/log", rr("get", "", "v1", "pods", "log", "demo", "p")},
		{"POST", "/api/v1/namespaces/demo/pods/p/exec", rr("create", "", "v1", "pods", "exec", "demo", "p")},
		{"GET", "/api/v1/nodes/n1/proxy/metrics", rr("get", "", "v1", "nodes", "proxy", "", "n1")},
		{"HEAD", "/api/v1/namespaces/demo/pods", rr("list", "", "v1", "pods", "", "demo", "")},
		{"GET", "/metrics", authorizer.AttributesRecord{Verb: "get", Path: "/metrics"}},
		{"HEAD", "/debug/pprof/heap", authorizer.AttributesRecord{Verb: "head", Path: "/debug/pprof/heap"}},
	} {
		r := httptest.NewRequest(tc.method, tc.target, nil)
		got, err := RequestAttributes(r, u)
		if err != nil {
			t.Errorf("%s %s: %v", tc.method, tc.target, err)
			continue
		}
		info, err := kube.NewRequestInfo(r)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := filters.GetAuthorizerAttributes(request.WithRequestInfo(request.WithUser(r.Context(), u), info))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(&got.AttributesRecord, ref) {
			t.Errorf("%s %s:\n%+v\nkube-apiserver's:\n%+v", tc.method, tc.target, got.AttributesRecord, ref)
		}
		want := tc.want
		want.User = u
		if want.Path == "" {
			want.Path = r.URL.Path
		}
		if !reflect.DeepEqual(got.AttributesRecord, want) {
			t.Errorf("%s %s:\n%+v\nwant\n%+v", tc.method, tc.target, got.AttributesRecord, want)
		}
	}
}
