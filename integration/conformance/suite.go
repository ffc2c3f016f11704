package conformance

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Suite is one selection of the e2e tests: what Focus selects, less what
// Skip leaves out.
type Suite struct {
	// Name names the selection (-suite) and the directory of its runs.
	Name  string
	Focus string
	// Skip is every test Focus selects that the harness does not run, each
	// with why. An entry that matches no selected test fails the run, so
	// the list cannot silently go stale.
	Skip []SkipEntry
}

// SkipEntry leaves out the tests whose full name contains Match (a literal
// part of it) or, if Pattern is set instead, matches that regular
// expression.
type SkipEntry struct {
	Match, Pattern, Reason string
}

func (e SkipEntry) regexp() string {
	if e.Pattern != "" {
		return e.Pattern
	}
	return regexp.QuoteMeta(e.Match)
}

func (e SkipEntry) matches(name string) bool {
	if e.Pattern != "" {
		return regexp.MustCompile(e.Pattern).MatchString(name)
	}
	return strings.Contains(name, e.Match)
}

func (e SkipEntry) String() string {
	if e.Pattern != "" {
		return "/" + e.Pattern + "/"
	}
	return e.Match
}

// Suites are the selections the harness runs: Conformance (`make
// conformance`, in CI) and Wide (`make conformance SUITE=wide`).
var Suites = []Suite{Conformance, Wide}

// SuiteNamed returns the suite called name.
func SuiteNamed(name string) (Suite, error) {
	var names []string
	for _, s := range Suites {
		if s.Name == name {
			return s, nil
		}
		names = append(names, s.Name)
	}
	return Suite{}, fmt.Errorf("no suite %q (have %s)", name, strings.Join(names, ", "))
}

// Conformance is sig-api-machinery's conformance tests that need no running
// pod. Each skipped test needs something the cluster deliberately lacks (a
// kubelet that runs pods, hence webhook servers and aggregated API servers,
// or a controller that creates pods).
var Conformance = Suite{
	Name:  "conformance",
	Focus: `\[sig-api-machinery\].*\[Conformance\]`,
	Skip: []SkipEntry{
		{Match: "[sig-api-machinery] AdmissionWebhook [Privileged:ClusterAdmin]",
			Reason: "every test deploys its webhook server as a Deployment: needs running pods"},
		{Match: "[sig-api-machinery] CustomResourceConversionWebhook [Privileged:ClusterAdmin]",
			Reason: "deploys the conversion webhook server as a Deployment: needs running pods"},
		{Match: "[sig-api-machinery] CustomResourceFieldSelectors [Privileged:ClusterAdmin]",
			Reason: "deploys a conversion webhook server as a Deployment: needs running pods"},
		{Match: "[sig-api-machinery] Aggregator Should be able to support the 1.17 Sample API Server",
			Reason: "runs the sample aggregated API server as a Deployment: needs running pods"},
		{Match: "[sig-api-machinery] Namespaces should ensure that all pods are removed when a namespace is deleted",
			Reason: "waits for its pod to be Running: needs a kubelet"},
		{Match: "[sig-api-machinery] OrderedNamespaceDeletion namespace deletion should delete pod first",
			Reason: "waits for its pod to be Running: needs a kubelet"},
	},
}

// SkipRegexp is the -ginkgo.skip expression of the suite's Skip.
func (s Suite) SkipRegexp() string {
	parts := make([]string, len(s.Skip))
	for i, e := range s.Skip {
		parts[i] = e.regexp()
	}
	return strings.Join(parts, "|")
}

// CheckSkipList returns an error if an entry of the suite's Skip matches
// none of names (the tests Focus selects).
func (s Suite) CheckSkipList(names []string) error {
	var stale []string
	for _, e := range s.Skip {
		found := false
		for _, n := range names {
			if e.matches(n) {
				found = true
				break
			}
		}
		if !found {
			stale = append(stale, e.String())
		}
	}
	if len(stale) > 0 {
		return fmt.Errorf("%s: skip list entries that match no selected test (renamed upstream?): %q", s.Name, stale)
	}
	return nil
}

// Skipped returns the entry of Skip that leaves out the test called name.
func (s Suite) Skipped(name string) (SkipEntry, bool) {
	for _, e := range s.Skip {
		if e.matches(name) {
			return e, true
		}
	}
	return SkipEntry{}, false
}

// SuiteOptions say how to run the e2e binary once.
type SuiteOptions struct {
	Bin        string // the e2e test binary
	Kubeconfig string // whom the tests talk to
	Kubectl    string
	Dir        string // its report, log and output files
	Name       string // "kube-apiserver" or "herald": names the files
	Timeout    time.Duration
	// DryRun lists the selected tests without running them (ginkgo's
	// -ginkgo.dry-run): every selected test reports "passed".
	DryRun bool
	// Suite is the selection: its Focus, less its Skip.
	Suite Suite
	// Focus overrides the suite's Focus (e.g. one test).
	Focus string
	// NoSkip runs without the suite's Skip (with DryRun: lists everything
	// Focus selects, to check Skip against).
	NoSkip bool
}

// RunSuite runs the selected tests once, serially (the framework's
// parallel mode needs the ginkgo CLI, not the compiled binary), and returns
// the results from ginkgo's JSON report. The binary's exit code is not an
// error: failed tests are results. A missing or unreadable report is.
func RunSuite(ctx context.Context, o SuiteOptions) (Report, error) {
	if o.Focus == "" {
		o.Focus = o.Suite.Focus
	}
	report := filepath.Join(o.Dir, o.Name+".json")
	out := filepath.Join(o.Dir, o.Name+"-output")
	os.Remove(report)
	if err := os.MkdirAll(out, 0o755); err != nil {
		return Report{}, err
	}
	args := []string{
		"-kubeconfig=" + o.Kubeconfig,
		"-kubectl-path=" + o.Kubectl,
		// No cloud, no kubelet: the framework neither waits for nodes'
		// pods nor for daemon sets.
		"-provider=skeleton", "-allowed-not-ready-nodes=-1", "-minStartupPods=0", "-num-nodes=1",
		"-e2e-output-dir=" + out,
		"-ginkgo.focus=" + o.Focus,
		"-ginkgo.json-report=" + report,
		"-ginkgo.timeout=" + o.Timeout.String(),
		"-ginkgo.no-color", "-ginkgo.v",
	}
	if !o.NoSkip && len(o.Suite.Skip) > 0 {
		args = append(args, "-ginkgo.skip="+o.Suite.SkipRegexp())
	}
	if o.DryRun {
		args = append(args, "-ginkgo.dry-run")
	}
	log, err := os.Create(filepath.Join(o.Dir, o.Name+".log"))
	if err != nil {
		return Report{}, err
	}
	defer log.Close()
	cmd := exec.CommandContext(ctx, o.Bin, args...)
	cmd.Dir = o.Dir
	cmd.Stdout, cmd.Stderr = log, log
	cmd.WaitDelay = 30 * time.Second
	runErr := cmd.Run()
	if _, err := os.Stat(report); err != nil {
		return Report{}, fmt.Errorf("e2e tests against %s wrote no report (%v; see %s)", o.Name, runErr, log.Name())
	}
	return ReadReport(report)
}
