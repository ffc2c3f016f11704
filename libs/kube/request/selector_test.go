package request

import (
	"testing"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

func TestSelectorAndDecide(t *testing.T) {
	g := defaultRegistry(t)
	pods, _ := g.ByID("pods")
	s, err := ParseSelector(pods, "", "app=web", "spec.nodeName=n1")
	if err != nil {
		t.Fatal(err)
	}
	if !s.Matches("a", labels.Set{"app": "web"}, fields.Set{"spec.nodeName": "n1"}) {
		t.Fatal("should match")
	}
	if s.Matches("a", labels.Set{"app": "db"}, fields.Set{"spec.nodeName": "n1"}) {
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

// An event's labels and fields match as decoded, as pairs (heraldv1.Pairs),
// exactly as the same labels and fields do as sets, for every kind of
// label and field requirement; and matching them allocates nothing.
func TestMatchesPairs(t *testing.T) {
	g := defaultRegistry(t)
	pods, _ := g.ByID("pods")
	objects := []struct {
		labels, fields map[string]string
	}{
		{map[string]string{"app": "web", "tier": "1"}, map[string]string{"spec.nodeName": "n1", "status.phase": "Running"}},
		{map[string]string{"app": "db", "tier": "3", "gone": ""}, map[string]string{"spec.nodeName": "n2", "status.phase": "Pending"}},
		{map[string]string{"app": ""}, map[string]string{"spec.nodeName": "", "status.phase": "Running"}},
		{nil, nil},
	}
	selectors := []struct{ labels, fields string }{
		{"", ""},
		{"app=web", "spec.nodeName=n1"},
		{"app in (web,db)", ""}, {"app notin (db)", ""}, {"app", ""}, {"!gone", ""}, {"!app", ""},
		{"app!=web,tier", ""}, {"tier>1", ""}, {"tier<3", ""}, {"app in (web,db),!gone,tier", ""},
		{"", "spec.nodeName=n2"}, {"", "spec.nodeName!=n2"}, {"", "spec.nodeName="}, {"", "spec.nodeName!="},
		{"", "spec.nodeName=n1,status.phase=Running"}, {"", "status.phase!=Running,spec.nodeName!="},
		{"app=web", "status.phase=Pending"},
	}
	for _, sc := range selectors {
		s, err := ParseSelector(pods, "", sc.labels, sc.fields)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objects {
			lp, fp := heraldv1.Pairs(heraldv1.SortedPairs(o.labels)), heraldv1.Pairs(heraldv1.SortedPairs(o.fields))
			got, want := s.Matches("a", &lp, &fp), s.Matches("a", labels.Set(o.labels), fields.Set(o.fields))
			if got != want {
				t.Errorf("labels %q fields %q on %v %v: pairs match %v, sets %v", sc.labels, sc.fields, o.labels, o.fields, got, want)
			}
			if n := testing.AllocsPerRun(10, func() { s.Matches("a", &lp, &fp) }); n != 0 {
				t.Errorf("labels %q fields %q: matching pairs allocates %v times", sc.labels, sc.fields, n)
			}
		}
	}
}
