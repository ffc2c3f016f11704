package request

import (
	"testing"

	"herald.dev/libs/kube"
)

func TestSelectorAndDecide(t *testing.T) {
	g := defaultRegistry(t)
	pods, _ := g.ByID("pods")
	s, err := ParseSelector(pods, "", "app=web", "spec.nodeName=n1")
	if err != nil {
		t.Fatal(err)
	}
	if !s.Matches("a", map[string]string{"app": "web"}, map[string]string{"spec.nodeName": "n1"}) {
		t.Fatal("should match")
	}
	if s.Matches("a", map[string]string{"app": "db"}, map[string]string{"spec.nodeName": "n1"}) {
		t.Fatal("should not match")
	}
	if _, err := ParseSelector(pods, "", "", "spec.foo=x"); kube.StatusOf(err).Code != 400 {
		t.Fatalf("unsupported field: %v", err)
	}
	if _, err := ParseSelector(pods, "", "a in (", ""); kube.StatusOf(err).Code != 400 {
		t.Fatalf("bad label selector: %v", err)
	}
	cases := []struct {
		kind      string
		cur, prev bool
		want      Transition
	}{
		{"ADDED", true, false, AsAdded}, {"ADDED", false, false, Skip},
		{"MODIFIED", true, true, AsModified}, {"MODIFIED", true, false, AsAdded},
		{"MODIFIED", false, true, AsDeletedPrev}, {"MODIFIED", false, false, Skip},
		{"DELETED", true, false, AsDeleted}, {"DELETED", false, false, Skip},
	}
	for _, c := range cases {
		if got := Decide(c.kind, c.cur, c.prev); got != c.want {
			t.Errorf("Decide(%s,%v,%v) = %v, want %v", c.kind, c.cur, c.prev, got, c.want)
		}
	}
}
