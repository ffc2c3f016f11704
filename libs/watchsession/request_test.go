package watchsession

import (
	"net/url"
	"testing"

	"google.golang.org/protobuf/proto"

	"herald.dev/libs/kube"
	"herald.dev/libs/kube/request"
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// TestRequestRoundTrip: a watch frontdoor parsed crosses as a stream
// request, through its wire encoding, and comes back as the same watch:
// resource, namespace, name, selector (the name folded in), plan,
// bookmarks and timeout.
func TestRequestRoundTrip(t *testing.T) {
	reg, err := kube.LoadRegistry("", "/registry")
	if err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{
		"/api/v1/pods?watch=true",
		"/api/v1/namespaces/default/pods?watch=1&labelSelector=app%3Dweb,tier+in+(a,b),!canary,x!%3Dy&fieldSelector=spec.nodeName%3Dnode-7,status.phase!%3DFailed&resourceVersion=4711&allowWatchBookmarks=true&timeoutSeconds=30",
		"/api/v1/namespaces/default/pods/web-0?watch=true&resourceVersion=0",
		"/api/v1/pods?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
		"/api/v1/nodes?watch=true&resourceVersion=12&resourceVersionMatch=NotOlderThan&sendInitialEvents=false",
		"/apis/apps/v1/namespaces/kube-system/deployments?watch=true&labelSelector=k8s-app",
	} {
		u, err := url.Parse(target)
		if err != nil {
			t.Fatal(err)
		}
		info, err := request.Parse(reg, u.Path, u.Query())
		if err != nil {
			t.Fatalf("%s: %v", target, err)
		}
		want, err := request.ParseWatch(info, u.Query())
		if err != nil {
			t.Fatalf("%s: %v", target, err)
		}
		b, err := proto.Marshal(NewRequest(info, want))
		if err != nil {
			t.Fatal(err)
		}
		req := &heraldv1.WatchStreamRequest{}
		if err := proto.Unmarshal(b, req); err != nil {
			t.Fatal(err)
		}
		res, ok := reg.Lookup(req.Group, req.Version, req.Resource)
		if !ok || res != info.Resource || req.Namespace != info.Namespace || req.Name != info.Name {
			t.Fatalf("%s: resource %s/%s/%s, namespace %q, name %q", target, req.Group, req.Version, req.Resource, req.Namespace, req.Name)
		}
		got, err := WatchOf(req)
		if err != nil {
			t.Fatalf("%s: %v", target, err)
		}
		if got.Plan != want.Plan || got.AllowWatchBookmarks != want.AllowWatchBookmarks || got.TimeoutSeconds != want.TimeoutSeconds {
			t.Errorf("%s: plan %+v, bookmarks %v, timeout %d; want %+v, %v, %d", target, got.Plan, got.AllowWatchBookmarks, got.TimeoutSeconds, want.Plan, want.AllowWatchBookmarks, want.TimeoutSeconds)
		}
		gs, ws := got.Selector, want.Selector
		if gs.Namespace != ws.Namespace || gs.Labels.String() != ws.Labels.String() || gs.Fields.String() != ws.Fields.String() || gs.Empty != ws.Empty {
			t.Errorf("%s: selector %q %q %q empty %v; want %q %q %q empty %v", target, gs.Namespace, gs.Labels, gs.Fields, gs.Empty, ws.Namespace, ws.Labels, ws.Fields, ws.Empty)
		}
	}
}

// TestRequestRefused: a stream request no frontdoor sends (an operator a
// field selector does not have, no start) is a 400.
func TestRequestRefused(t *testing.T) {
	for _, req := range []*heraldv1.WatchStreamRequest{
		{Start: heraldv1.WatchStreamRequest_FROM_NOW, FieldRequirements: []*heraldv1.WatchStreamRequest_FieldRequirement{{Field: "spec.nodeName", Operator: "in", Value: "a"}}},
		{Start: heraldv1.WatchStreamRequest_FROM_NOW, LabelRequirements: []*heraldv1.WatchStreamRequest_LabelRequirement{{Key: "a", Operator: "=", Values: []string{"x", "y"}}}},
		{},
	} {
		if _, err := WatchOf(req); err == nil {
			t.Errorf("%v: accepted", req)
		}
	}
}
