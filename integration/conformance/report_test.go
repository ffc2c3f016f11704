package conformance

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"
)

// report is a ginkgo JSON report (-ginkgo.json-report) in the shape ginkgo
// v2 writes it: suite-level nodes and specs, states as strings, run times
// in nanoseconds.
const report = `[{"SuiteDescription":"Kubernetes e2e suite","SuiteSucceeded":false,"SpecReports":[
 {"LeafNodeType":"SynchronizedBeforeSuite","State":"passed","RunTime":1000000},
 {"ContainerHierarchyTexts":["[sig-api-machinery] Watchers"],"LeafNodeType":"It","LeafNodeText":"should observe add, update, and delete watch notifications on configmaps [Conformance]","State":"passed","RunTime":2100000000},
 {"ContainerHierarchyTexts":["[sig-api-machinery] Servers with support for API chunking"],"LeafNodeType":"It","LeafNodeText":"should return chunks of results for list calls [Conformance]","State":"failed","RunTime":3000000000,"Failure":{"Message":"Expected\n    <int>: 440\nto be ==\n    <int>: 400"}},
 {"ContainerHierarchyTexts":["[sig-api-machinery] AdmissionWebhook [Privileged:ClusterAdmin]"],"LeafNodeType":"It","LeafNodeText":"should mutate pod [Conformance]","State":"skipped","RunTime":0},
 {"ContainerHierarchyTexts":["[sig-api-machinery] server version"],"LeafNodeType":"It","LeafNodeText":"should find the server version [Conformance]","State":"skipped","RunTime":5000000,"Failure":{"Message":"Only supported for providers [gce]"}},
 {"LeafNodeType":"ReportAfterSuite","LeafNodeText":"Kubernetes e2e suite report","State":"passed"}
]}]`

const (
	watchTest = "[sig-api-machinery] Watchers should observe add, update, and delete watch notifications on configmaps [Conformance]"
	chunkTest = "[sig-api-machinery] Servers with support for API chunking should return chunks of results for list calls [Conformance]"
	skipTest  = "[sig-api-machinery] server version should find the server version [Conformance]"
)

func TestParseReport(t *testing.T) {
	r, err := ParseReport([]byte(report))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Result{
		watchTest: {State: "passed", RunTime: 2100 * time.Millisecond},
		chunkTest: {State: "failed", RunTime: 3 * time.Second, Message: "Expected <int>: 440 to be == <int>: 400"},
		skipTest:  {State: "skipped", RunTime: 5 * time.Millisecond, Message: "Only supported for providers [gce]"},
	}
	if len(r.Results) != len(want) {
		t.Fatalf("results: got %v, want %v (a spec left out by the focus is not a result)", r.Results, want)
	}
	for name, w := range want {
		if got := r.Results[name]; got != w {
			t.Errorf("%s: got %+v, want %+v", name, got, w)
		}
	}
	if r.SuiteFailure != "" {
		t.Errorf("suite failure %q, want none", r.SuiteFailure)
	}
}

func TestParseReportSuiteFailure(t *testing.T) {
	r, err := ParseReport([]byte(`[{"SpecReports":[{"LeafNodeType":"SynchronizedBeforeSuite","State":"failed","Failure":{"Message":"no nodes"}}]}]`))
	if err != nil {
		t.Fatal(err)
	}
	if want := "SynchronizedBeforeSuite failed: no nodes"; r.SuiteFailure != want {
		t.Fatalf("suite failure %q, want %q", r.SuiteFailure, want)
	}
	if _, err := ParseReport([]byte(`{"not":"a list"}`)); err == nil {
		t.Fatal("a report that is not a list of suites parsed")
	}
}

func TestCompare(t *testing.T) {
	res := func(states map[string]string) Report {
		r := Report{Results: map[string]Result{}}
		for n, s := range states {
			r.Results[n] = Result{State: s}
		}
		return r
	}
	for _, tc := range []struct {
		name            string
		baseline, under Report
		differences     []string
		err             string
	}{
		{name: "same results", baseline: res(map[string]string{"a": "passed", "b": "failed"}), under: res(map[string]string{"a": "passed", "b": "failed"})},
		{name: "herald passes more", baseline: res(map[string]string{"a": "passed", "b": "failed"}), under: res(map[string]string{"a": "passed", "b": "passed"})},
		{name: "herald fails one", baseline: res(map[string]string{"a": "passed", "b": "passed"}), under: res(map[string]string{"a": "passed", "b": "failed"}),
			differences: []string{"b"}, err: "Herald failed 1 of the 2 tests kube-apiserver passed"},
		{name: "skipped is not passed", baseline: res(map[string]string{"a": "passed"}), under: res(map[string]string{"a": "skipped"}),
			differences: []string{"a"}, err: "Herald failed 1 of the 1 tests"},
		{name: "missing from herald's run", baseline: res(map[string]string{"a": "passed", "b": "passed"}), under: res(map[string]string{"a": "passed"}),
			differences: []string{"b"}, err: "Herald failed 1 of the 2"},
		{name: "timed out", baseline: res(map[string]string{"a": "passed"}), under: res(map[string]string{"a": "timedout"}),
			differences: []string{"a"}, err: "Herald failed 1"},
		{name: "broken baseline", baseline: Report{Results: map[string]Result{}, SuiteFailure: "SynchronizedBeforeSuite failed: x"}, under: res(map[string]string{}),
			err: "kube-apiserver passed no test: the baseline is broken, nothing was compared (SynchronizedBeforeSuite failed: x)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Compare(tc.baseline, tc.under)
			var got []string
			for _, r := range c.Differences() {
				got = append(got, r.Test)
			}
			if strings.Join(got, ",") != strings.Join(tc.differences, ",") {
				t.Errorf("differences %q, want %q", got, tc.differences)
			}
			err := c.Err()
			switch {
			case tc.err == "" && err != nil:
				t.Errorf("error %v, want none", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Errorf("error %v, want one containing %q", err, tc.err)
			}
		})
	}
}

func TestWriteTable(t *testing.T) {
	base, _ := ParseReport([]byte(report))
	under := Report{Results: map[string]Result{
		watchTest: {State: "failed", RunTime: 30 * time.Second, Message: "timed out waiting for the event"},
		chunkTest: {State: "failed", RunTime: time.Second, Message: "x"},
	}}
	var b bytes.Buffer
	Compare(base, under).WriteTable(&b, Baseline, Herald)
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	wantPrefixes := []string{
		"  TEST",
		"  " + chunkTest,
		"! " + watchTest,
		"  " + skipTest,
		"! " + watchTest,
		"    kube-apiserver: passed",
		"    herald: failed: timed out waiting for the event",
		"3 tests; kube-apiserver passed 1; herald passed 0 of those; differences: 1",
	}
	if len(lines) != len(wantPrefixes) {
		t.Fatalf("table:\n%s", b.String())
	}
	for i, w := range wantPrefixes {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d: %q, want it to start with %q", i, lines[i], w)
		}
	}
	for i, cells := range map[int][]string{1: {"failed 3s", "failed 1s"}, 2: {"passed 2.1s", "failed 30s"}, 3: {"skipped 0s", "not run"}} {
		for _, c := range cells {
			if !strings.Contains(lines[i], c) {
				t.Errorf("line %d: %q, want %q in it", i, lines[i], c)
			}
		}
	}
}

// TestSkipList: every literal entry of the conformance suite is a part of a
// test name that the -ginkgo.skip expression matches, and nothing else the
// focus selects.
func TestSkipList(t *testing.T) {
	skip := regexp.MustCompile(Conformance.SkipRegexp())
	focus := regexp.MustCompile(Conformance.Focus)
	for _, s := range Conformance.Skip {
		name := s.Match + " some test [Conformance]"
		if !skip.MatchString(name) || !focus.MatchString(name) {
			t.Errorf("%q: skip matches %v, focus matches %v; want both", name, skip.MatchString(name), focus.MatchString(name))
		}
		if s.Reason == "" {
			t.Errorf("%q has no reason", s.Match)
		}
	}
	for _, kept := range []string{watchTest, chunkTest, "[sig-api-machinery] Garbage collector should not be blocked by dependency circle [Conformance]"} {
		if skip.MatchString(kept) {
			t.Errorf("skip matches %q", kept)
		}
	}
	if err := Conformance.CheckSkipList([]string{watchTest}); err == nil || !strings.Contains(err.Error(), "match no selected test") {
		t.Errorf("a skip list naming absent tests: %v, want an error", err)
	}
	var all []string
	for _, s := range Conformance.Skip {
		all = append(all, s.Match+" x")
	}
	if err := Conformance.CheckSkipList(all); err != nil {
		t.Error(err)
	}
}

// TestWideSuite: the wide selection leaves out every test the conformance
// suite selects, keeps sig-api-machinery's others and sig-auth's, and each
// entry of its skip list has a reason and is a valid expression.
func TestWideSuite(t *testing.T) {
	focus := regexp.MustCompile(Wide.Focus)
	skip := regexp.MustCompile(Wide.SkipRegexp())
	for _, e := range Wide.Skip {
		if e.Reason == "" {
			t.Errorf("%s has no reason", e)
		}
		if (e.Match == "") == (e.Pattern == "") {
			t.Errorf("%s: want exactly one of Match and Pattern", e)
		}
	}
	for _, tc := range []struct {
		name string
		run  bool
	}{
		{watchTest, false},
		{chunkTest, false},
		{"[sig-api-machinery] ServerSideApply should work for CRDs", true},
		{"[sig-auth] SelfSubjectReview should support SelfSubjectReview API operations", true},
		{"[sig-apps] Deployment deployment should support rollover [Conformance]", false},
	} {
		if got := focus.MatchString(tc.name) && !skip.MatchString(tc.name); got != tc.run {
			t.Errorf("%q runs: %v, want %v", tc.name, got, tc.run)
		}
		if _, skipped := Wide.Skipped(tc.name); focus.MatchString(tc.name) && skipped == tc.run {
			t.Errorf("%q: Skipped says %v, want %v", tc.name, skipped, !tc.run)
		}
	}
	if err := Wide.CheckSkipList([]string{"[sig-api-machinery] ServerSideApply should work for CRDs"}); err == nil {
		t.Error("a pattern that matches no selected test: no error")
	}
	for _, name := range []string{"conformance", "wide"} {
		if s, err := SuiteNamed(name); err != nil || s.Name != name {
			t.Errorf("SuiteNamed(%q) = %q, %v", name, s.Name, err)
		}
	}
	if _, err := SuiteNamed("all"); err == nil {
		t.Error(`SuiteNamed("all"): no error`)
	}
}
