package cache

import (
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// A request's selectors as the client parsed them are used without
// parsing the strings (which a client sets only for an older cache), and
// checked as a parsed string would be.
func TestSelectorAsParsed(t *testing.T) {
	rs := newWindow(t, 100)
	apply(t, rs, 11, put("a", "p1"), put("b", "p2"))
	v, _ := testServer(t, rs, 11, 8)
	p2 := &heraldv1.Selector{Fields: []*heraldv1.Requirement{{Key: "metadata.name", Operator: "=", Values: []string{"p2"}}}}
	resp, err := v.List(t.Context(), &heraldv1.ListRequest{Resource: "pods", ResourceVersion: "0", Selector: p2, LabelSelector: "unparsable ((("})
	if err != nil || !slices.Equal(resp.GetKeys(), []string{rs.res.ObjectKey("b", "p2")}) {
		t.Errorf("list: %v, %v; want p2 alone", resp.GetKeys(), err)
	}
	// (The window's events of this test have no labels.)
	labelled := &heraldv1.Selector{Labels: []*heraldv1.Requirement{{Key: "app", Operator: "exists"}}}
	got, _, err := watch(t, v, &heraldv1.WatchRequest{Resource: "pods", AfterRevision: 10, Selector: labelled, FieldSelector: "unparsable((("})
	if want := []string{"10:", "11:"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("watch: %v, %v; want %v", got, err, want)
	}
	unlabelled := &heraldv1.Selector{Labels: []*heraldv1.Requirement{{Key: "app", Operator: "!"}}}
	got, _, err = watch(t, v, &heraldv1.WatchRequest{Resource: "pods", AfterRevision: 10, Selector: unlabelled, LabelSelector: "app"})
	if want := []string{"10:", "11:p1", "11:p2", "11:"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("watch: %v, %v; want %v", got, err, want)
	}
	all := &heraldv1.Selector{}
	if got, _, err := watch(t, v, &heraldv1.WatchRequest{Resource: "pods", AfterRevision: 10, Selector: all}); len(got) != 4 || err != nil {
		t.Errorf("watch with an empty selector: %v, %v; want every event", got, err)
	}
	bad := &heraldv1.Selector{Fields: []*heraldv1.Requirement{{Key: "spec.foo", Operator: "=", Values: []string{"x"}}}}
	if _, err := v.List(t.Context(), &heraldv1.ListRequest{Resource: "pods", ResourceVersion: "0", Selector: bad}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("list with an unselectable field: %v, want InvalidArgument", err)
	}
	if _, _, err := watch(t, v, &heraldv1.WatchRequest{Resource: "pods", AfterRevision: 10, Selector: bad}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("watch with an unselectable field: %v, want InvalidArgument", err)
	}
}
