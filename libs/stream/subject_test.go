package stream

import (
	"strconv"
	"testing"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

func testRegistry(t testing.TB) *kube.Registry {
	t.Helper()
	reg, err := kube.NewRegistry(kube.DefaultPrefix, kube.DefaultResources())
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

func resource(t testing.TB, reg *kube.Registry, id string) *kube.Resource {
	t.Helper()
	r, ok := reg.ByID(id)
	if !ok {
		t.Fatalf("no resource %s", id)
	}
	return r
}

func TestSubjects(t *testing.T) {
	reg := testRegistry(t)
	pods, deps := resource(t, reg, "pods"), resource(t, reg, "deployments.apps")
	p := strconv.Itoa(kube.Partition("default"))
	for _, tc := range []struct{ name, got, want string }{
		{"namespaced", Subject(pods, "default"), "herald.ev.pods." + p},
		{"dotted id", Subject(deps, "default"), "herald.ev.deployments_apps." + p},
		{"partition", PartitionSubject(pods, 15), "herald.ev.pods.15"},
		{"filter", Filter(pods), "herald.ev.pods.*"},
		{"dotted filter", Filter(deps), "herald.ev.deployments_apps.*"},
		{"multi", SubjectMulti, "herald.ev._multi"},
		{"other", SubjectOther, "herald.ev._other"},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, tc.got, tc.want)
		}
	}
	if got := Subjects(); len(got) != 2 || got[0] != "herald.ev.>" || got[1] != SubjectProgress {
		t.Errorf("Subjects() = %q", got)
	}
}

func TestSubjectOf(t *testing.T) {
	reg := testRegistry(t)
	pods := resource(t, reg, "pods")
	// Two namespaces in different partitions.
	a, b := "ns-a", "ns-b"
	for i := 0; kube.Partition(a) == kube.Partition(b); i++ {
		b = "ns-b" + strconv.Itoa(i)
	}
	put := func(keys ...string) []*heraldv1.Change {
		out := make([]*heraldv1.Change, len(keys))
		for i, k := range keys {
			out[i] = &heraldv1.Change{Kind: heraldv1.Change_PUT, Key: k}
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		changes []*heraldv1.Change
		want    string
	}{
		{"one object", put("/registry/pods/" + a + "/x"), Subject(pods, a)},
		{"one partition", put("/registry/pods/"+a+"/x", "/registry/pods/"+a+"/y"), Subject(pods, a)},
		{"two partitions", put("/registry/pods/"+a+"/x", "/registry/pods/"+b+"/y"), SubjectMulti},
		{"two resources", put("/registry/pods/"+a+"/x", "/registry/minions/n1"), SubjectMulti},
		{"unowned", put("/registry/ranges/serviceips"), SubjectOther},
		{"not the served layout", put("/registry/nodes/n1"), SubjectOther},
		{"malformed key", put("/registry/pods/only-a-name"), SubjectOther},
		{"owned and unowned", put("/registry/ranges/serviceips", "/registry/minions/n1"), SubjectMulti},
		{"cluster-scoped", put("/registry/minions/n1", "/registry/minions/n2"), Subject(resource(t, reg, "nodes"), "")},
	} {
		if got := SubjectOf(reg, tc.changes); got != tc.want {
			t.Errorf("%s: SubjectOf = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestParseSubject(t *testing.T) {
	for _, tc := range []struct {
		in    string
		token string
		part  int
		ok    bool
	}{
		{"herald.ev.pods.0", "pods", 0, true},
		{"herald.ev.pods.15", "pods", 15, true},
		{"herald.ev.deployments_apps.7", "deployments_apps", 7, true},
		{"herald.ev.pods.16", "", 0, false}, // no such partition
		{"herald.ev.pods.07", "", 0, false}, // not canonical
		{"herald.ev.pods.-1", "", 0, false},
		{"herald.ev.pods.+1", "", 0, false},
		{"herald.ev.pods.1.2", "", 0, false},
		{"herald.ev.pods.", "", 0, false},
		{"herald.ev.pods.*", "", 0, false},
		{"herald.ev..3", "", 0, false},
		{"herald.ev.pods", "", 0, false},
		{"herald.ev.99999999999999999999.1", "99999999999999999999", 1, true},
		{"herald.ev.pods.99999999999999999999", "", 0, false},
		{SubjectMulti, "", 0, false},
		{SubjectOther, "", 0, false},
		{SubjectProgress, "", 0, false},
		{SubjectProgressRequest, "", 0, false},
		{"", "", 0, false},
		{"herald.evx.pods.1", "", 0, false},
	} {
		tok, p, ok := ParseSubject(tc.in)
		if tok != tc.token || p != tc.part || ok != tc.ok {
			t.Errorf("ParseSubject(%q) = %q, %d, %v; want %q, %d, %v", tc.in, tok, p, ok, tc.token, tc.part, tc.ok)
		}
	}
}

// TestParseSubjectRoundTrip: every subject a resource's change can go to
// parses back to its resource and partition.
func TestParseSubjectRoundTrip(t *testing.T) {
	reg := testRegistry(t)
	for _, r := range reg.Resources() {
		for p := range kube.Partitions {
			s := PartitionSubject(r, p)
			tok, got, ok := ParseSubject(s)
			if !ok || got != p || PartitionSubject(r, got) != s || tok != token(r) {
				t.Errorf("ParseSubject(%q) = %q, %d, %v", s, tok, got, ok)
			}
		}
	}
}

func FuzzParseSubject(f *testing.F) {
	for _, s := range []string{"herald.ev.pods.3", "herald.ev.deployments_apps.15", SubjectMulti, SubjectProgress, "herald.ev.a.00", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok, p, ok := ParseSubject(s)
		if !ok {
			return
		}
		if p < 0 || p >= kube.Partitions {
			t.Fatalf("ParseSubject(%q): partition %d out of range", s, p)
		}
		// What parses formats back to itself.
		if back := SubjectRoot + "." + tok + "." + strconv.Itoa(p); back != s {
			t.Fatalf("ParseSubject(%q) = %q, %d: formats back to %q", s, tok, p, back)
		}
	})
}
