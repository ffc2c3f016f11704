package request

import (
	"testing"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"

	"herald.dev/libs/kube"
)

// A selector crosses a hop as its terms (Requirements) and is rebuilt there
// (NewSelector) without parsing: the same selector, and the same 400s.
func TestSelectorRequirements(t *testing.T) {
	g := defaultRegistry(t)
	pods, _ := g.ByID("pods")
	objects := []struct {
		labels labels.Set
		fields fields.Set
	}{
		{map[string]string{"app": "web", "tier": "1"}, map[string]string{"spec.nodeName": "n1", "status.phase": "Running"}},
		{map[string]string{"app": "db", "tier": "3"}, map[string]string{"spec.nodeName": "n2", "status.phase": "Pending"}},
		{map[string]string{}, map[string]string{"spec.nodeName": "", "status.phase": "Running"}},
	}
	for _, tc := range []struct{ labels, fields string }{
		{"", ""},
		{"app=web", "spec.nodeName=n1"},
		{"app==web,tier!=3", "spec.nodeName!=n2,status.phase=Running"},
		{"app in (web,db),!gone,tier", ""},
		{"app notin (db),tier>0,tier<3", "spec.nodeName=="},
		{"", "metadata.name=p1,metadata.namespace=a"},
	} {
		want, err := ParseSelector(pods, "a", tc.labels, tc.fields)
		if err != nil {
			t.Fatal(err)
		}
		lbls, flds := want.Requirements()
		got, err := NewSelector(pods, "a", lbls, flds)
		if err != nil {
			t.Fatalf("%q %q: %v", tc.labels, tc.fields, err)
		}
		if got.String() != want.String() || got.Empty != want.Empty || got.Namespace != "a" {
			t.Errorf("%q %q: rebuilt as %s (empty %v), want %s (empty %v)", tc.labels, tc.fields, got, got.Empty, want, want.Empty)
		}
		for _, o := range objects {
			if got.Matches("a", o.labels, o.fields) != want.Matches("a", o.labels, o.fields) {
				t.Errorf("%q %q: rebuilt selector decides %v otherwise", tc.labels, tc.fields, o)
			}
		}
	}
	for _, tc := range []struct {
		name       string
		lbls, flds []Requirement
		want       string
	}{
		{"unselectable field", nil, []Requirement{{Key: "spec.foo", Operator: "=", Values: []string{"x"}}}, pods.UnknownFieldLabel("spec.foo")},
		{"field operator", nil, []Requirement{{Key: "spec.nodeName", Operator: "in", Values: []string{"x"}}}, ""},
		{"field values", nil, []Requirement{{Key: "spec.nodeName", Operator: "=", Values: []string{"x", "y"}}}, ""},
		{"label key", []Requirement{{Key: "a b", Operator: "=", Values: []string{"x"}}}, nil, ""},
		{"label operator", []Requirement{{Key: "app", Operator: "~", Values: []string{"x"}}}, nil, ""},
		{"label values", []Requirement{{Key: "app", Operator: "exists", Values: []string{"x"}}}, nil, ""},
	} {
		_, err := NewSelector(pods, "", tc.lbls, tc.flds)
		if st := kube.StatusOf(err); st.Code != 400 || (tc.want != "" && st.Message != tc.want) {
			t.Errorf("%s: %v, want a 400 %q", tc.name, err, tc.want)
		}
	}
}
