package conformance

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"herald.dev/integration/stack"
)

// Options say how `make conformance` runs.
type Options struct {
	// Dir holds the cluster's state, every log and both reports; it is
	// emptied first and kept afterwards.
	Dir string
	// Out receives progress lines and the table.
	Out     io.Writer
	Kubectl string
	// CompactionInterval is kube-apiserver's --etcd-compaction-interval:
	// the chunking test waits until etcd compacts its continue token's
	// revision (up to twice the interval and more; 10 minutes at the 5-minute
	// default).
	CompactionInterval time.Duration
	// Timeout bounds each of the two runs (ginkgo's suite timeout).
	Timeout time.Duration
	// Suite is the selection run (Conformance by default).
	Suite Suite
	// Focus overrides the suite's Focus.
	Focus string
}

// Names of the two sides in files and the table.
const (
	Baseline = "kube-apiserver"
	Herald   = "herald"
)

// Run builds what is missing, checks the skip list, starts the cluster and
// Herald, runs the tests against kube-apiserver and then through Herald,
// and prints the comparison. The error is the comparison's (Comparison.Err)
// or whatever kept the runs from happening.
func Run(ctx context.Context, o Options) (Comparison, error) {
	if o.Suite.Name == "" {
		o.Suite = Conformance
	}
	start := time.Now()
	step := func(format string, args ...any) {
		fmt.Fprintf(o.Out, "conformance [%s]: %s\n", time.Since(start).Round(time.Second), fmt.Sprintf(format, args...))
	}
	if err := os.RemoveAll(o.Dir); err != nil {
		return Comparison{}, err
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return Comparison{}, err
	}
	kas, err := stack.KubeAPIServerBinary(o.Out)
	if err != nil {
		return Comparison{}, err
	}
	e2eBin, kcm, err := stack.ConformanceBinaries(o.Out)
	if err != nil {
		return Comparison{}, err
	}
	heraldBin := filepath.Join(o.Dir, "bin")
	if err := stack.Build(heraldBin); err != nil {
		return Comparison{}, err
	}
	step("binaries ready: %s, %s, %s", kas, e2eBin, kcm)

	// Everything Focus selects, to check that each Skip entry still names
	// a test (a dry run talks to no server).
	listed, err := RunSuite(ctx, SuiteOptions{Bin: e2eBin, Kubeconfig: os.DevNull, Kubectl: o.Kubectl, Dir: o.Dir,
		Name: "selected", Timeout: time.Minute, DryRun: true, NoSkip: true, Suite: o.Suite, Focus: o.Focus})
	if err != nil {
		return Comparison{}, err
	}
	var names []string
	skipped := 0
	for n := range listed.Results {
		names = append(names, n)
		if _, ok := o.Suite.Skipped(n); ok {
			skipped++
		}
	}
	if o.Focus == "" {
		if err := o.Suite.CheckSkipList(names); err != nil {
			return Comparison{}, err
		}
	}
	step("suite %s: %d tests selected, %d of them skipped by the harness (see its skip list)", o.Suite.Name, len(names), skipped)

	cluster, err := StartCluster(ctx, ClusterOptions{
		Dir: o.Dir, KubeAPIServer: kas, KubeControllerManager: kcm, HeraldBinDir: heraldBin,
		Kubectl: o.Kubectl, CompactionInterval: o.CompactionInterval,
	})
	if err != nil {
		return Comparison{}, err
	}
	defer cluster.Stop()
	step("cluster ready: kube-apiserver %s, Herald %s (logs in %s)", cluster.KubeAPIServerURL, cluster.HeraldURL, o.Dir)

	runs := map[string]Report{}
	for _, side := range []struct{ name, kubeconfig string }{{Baseline, cluster.Kubeconfig}, {Herald, cluster.HeraldKubeconfig}} {
		t := time.Now()
		step("running the tests against %s (log: %s)", side.name, filepath.Join(o.Dir, side.name+".log"))
		r, err := RunSuite(ctx, SuiteOptions{Bin: e2eBin, Kubeconfig: side.kubeconfig, Kubectl: o.Kubectl, Dir: o.Dir,
			Name: side.name, Timeout: o.Timeout, Suite: o.Suite, Focus: o.Focus})
		if err != nil {
			return Comparison{}, err
		}
		passed := 0
		for _, res := range r.Results {
			if res.Passed() {
				passed++
			}
		}
		step("%s: %d of %d tests passed in %s", side.name, passed, len(r.Results), time.Since(t).Round(time.Second))
		runs[side.name] = r
	}
	c := Compare(runs[Baseline], runs[Herald])
	c.WriteTable(o.Out, Baseline, Herald)
	return c, c.Err()
}
