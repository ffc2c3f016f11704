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

// Focus selects the tests: sig-api-machinery's conformance tests.
const Focus = `\[sig-api-machinery\].*\[Conformance\]`

// Skip is every test Focus selects that this harness does not run, each
// with why: each needs something the cluster deliberately lacks (a kubelet
// that runs pods, hence webhook servers and aggregated API servers, or a
// controller that creates pods). Each entry is a literal part of the tests'
// full names; an entry that matches no selected test fails the run, so the
// list cannot silently go stale.
var Skip = []struct{ Match, Reason string }{
	{"[sig-api-machinery] AdmissionWebhook [Privileged:ClusterAdmin]",
		"every test deploys its webhook server as a Deployment: needs running pods"},
	{"[sig-api-machinery] CustomResourceConversionWebhook [Privileged:ClusterAdmin]",
		"deploys the conversion webhook server as a Deployment: needs running pods"},
	{"[sig-api-machinery] CustomResourceFieldSelectors [Privileged:ClusterAdmin]",
		"deploys a conversion webhook server as a Deployment: needs running pods"},
	{"[sig-api-machinery] Aggregator Should be able to support the 1.17 Sample API Server",
		"runs the sample aggregated API server as a Deployment: needs running pods"},
	{"[sig-api-machinery] Namespaces should ensure that all pods are removed when a namespace is deleted",
		"waits for its pod to be Running: needs a kubelet"},
	{"[sig-api-machinery] OrderedNamespaceDeletion namespace deletion should delete pod first",
		"waits for its pod to be Running: needs a kubelet"},
	{"[sig-api-machinery] Garbage collector should delete pods created by rc when not orphaning",
		"needs the replication controller (pods made by a controller this cluster does not run)"},
	{"[sig-api-machinery] Garbage collector should orphan pods created by rc if delete options say so",
		"needs the replication controller (pods made by a controller this cluster does not run)"},
	{"[sig-api-machinery] Garbage collector should keep the rc around until all its pods are deleted if the deleteOptions says so",
		"needs the replication controller (pods made by a controller this cluster does not run)"},
	{"[sig-api-machinery] Garbage collector should not delete dependents that have both valid owner and owner that's waiting for dependents to be deleted",
		"needs the replication controller (pods made by a controller this cluster does not run)"},
	{"[sig-api-machinery] Garbage collector should delete RS created by deployment when not orphaning",
		"needs the deployment controller (ReplicaSets made by a controller this cluster does not run)"},
	{"[sig-api-machinery] Garbage collector should orphan RS created by deployment when deleteOptions.PropagationPolicy is Orphan",
		"needs the deployment controller (ReplicaSets made by a controller this cluster does not run)"},
}

// SkipRegexp is the -ginkgo.skip expression of Skip.
func SkipRegexp() string {
	parts := make([]string, len(Skip))
	for i, s := range Skip {
		parts[i] = regexp.QuoteMeta(s.Match)
	}
	return strings.Join(parts, "|")
}

// CheckSkipList returns an error if an entry of Skip matches none of names
// (the tests Focus selects).
func CheckSkipList(names []string) error {
	var stale []string
	for _, s := range Skip {
		found := false
		for _, n := range names {
			if containsLiteral(n, s.Match) {
				found = true
				break
			}
		}
		if !found {
			stale = append(stale, s.Match)
		}
	}
	if len(stale) > 0 {
		return fmt.Errorf("skip list entries that match no selected test (renamed upstream?): %q", stale)
	}
	return nil
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
	// Focus overrides the package's Focus (e.g. one test).
	Focus string
	// NoSkip runs without Skip (with DryRun: lists everything Focus
	// selects, to check Skip against).
	NoSkip bool
}

// RunSuite runs the selected tests once, serially (the framework's
// parallel mode needs the ginkgo CLI, not the compiled binary), and returns
// the results from ginkgo's JSON report. The binary's exit code is not an
// error: failed tests are results. A missing or unreadable report is.
func RunSuite(ctx context.Context, o SuiteOptions) (Report, error) {
	if o.Focus == "" {
		o.Focus = Focus
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
	if !o.NoSkip {
		args = append(args, "-ginkgo.skip="+SkipRegexp())
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

func containsLiteral(name, part string) bool { return strings.Contains(name, part) }
