// Command herald-conformance runs Kubernetes' sig-api-machinery conformance
// tests (or, with -suite wide, the wider selection) against kube-apiserver and then through Herald in cluster mode in
// front of the same cluster, prints the table test -> kube-apiserver ->
// Herald, and exits 1 if Herald fails a test kube-apiserver passes
// (`make conformance`; see package integration/conformance).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"herald.dev/integration/conformance"
	"herald.dev/integration/stack"
)

func main() {
	suite := flag.String("suite", "conformance", "The selection: conformance (sig-api-machinery's [Conformance] tests, in CI) or wide (the sig-api-machinery tests that are not conformance-tagged and sig-auth's about impersonation, reviews and service-account tokens).")
	dir := flag.String("dir", "", "State, logs and reports (default <repository>/.herald/conformance, or conformance-<suite> for another suite); emptied first, kept afterwards.")
	kubectl := flag.String("kubectl", "kubectl", "kubectl binary (Herald's ClusterRole is applied with it; the CRD OpenAPI tests run it).")
	compaction := flag.Duration("compaction-interval", time.Minute, "kube-apiserver's --etcd-compaction-interval.")
	timeout := flag.Duration("timeout", 40*time.Minute, "Limit of each of the two runs.")
	focus := flag.String("focus", "", "Run only the tests matching this regular expression (default: every test of the suite the harness does not skip).")
	flag.Parse()
	if err := run(*suite, *dir, *kubectl, *compaction, *timeout, *focus); err != nil {
		fmt.Fprintln(os.Stderr, "herald-conformance:", err)
		os.Exit(1)
	}
}

func run(suiteName, dir, kubectl string, compaction, timeout time.Duration, focus string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	suite, err := conformance.SuiteNamed(suiteName)
	if err != nil {
		return err
	}
	if dir == "" {
		root, err := stack.RepoRoot()
		if err != nil {
			return err
		}
		dir = filepath.Join(root, ".herald", "conformance")
		if suite.Name != conformance.Conformance.Name {
			dir += "-" + suite.Name
		}
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return err
	}
	if kubectl, err = exec.LookPath(kubectl); err != nil {
		return err
	}
	if kubectl, err = filepath.Abs(kubectl); err != nil {
		return err
	}
	_, err = conformance.Run(ctx, conformance.Options{
		Suite: suite, Dir: dir, Out: os.Stdout, Kubectl: kubectl, CompactionInterval: compaction, Timeout: timeout, Focus: focus,
	})
	return err
}
