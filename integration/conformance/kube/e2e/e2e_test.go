// Package e2e is Kubernetes' e2e test binary (k8s.io/kubernetes v1.37.2's
// test/e2e), reduced to the sig-api-machinery and sig-auth tests: `go test -c` of this
// package is what `make conformance` runs against kube-apiserver and then
// against Herald. It registers the same flags and file sources as upstream's
// test/e2e/e2e_test.go and runs the same suite (e2e.RunE2ETests); only the
// test sources imported differ (sig-api-machinery's and sig-auth's alone keep
// the build to about a quarter of the full binary's).
package e2e

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"k8s.io/component-base/version"
	conformancetestdata "k8s.io/kubernetes/test/conformance/testdata"
	"k8s.io/kubernetes/test/e2e"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	e2etestingmanifests "k8s.io/kubernetes/test/e2e/testing-manifests"
	testfixtures "k8s.io/kubernetes/test/fixtures"

	// Constants the tests' labels use, frozen before the tests register.
	_ "k8s.io/kubernetes/test/e2e/feature"

	// The tests: sig-api-machinery's (make conformance and its wide
	// selection) and sig-auth's (the wide selection's SelfSubjectReview,
	// SubjectReview and ServiceAccounts tests; a dozen packages more).
	_ "k8s.io/kubernetes/test/e2e/apimachinery"
	_ "k8s.io/kubernetes/test/e2e/auth"

	// The framework's reconfiguration, as upstream's binary has it.
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/metrics/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	_ "k8s.io/kubernetes/test/utils/ktesting/format"
)

func TestMain(m *testing.M) {
	showVersion := flag.Bool("version", false, "Print the version of the Kubernetes tests and exit.")
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	if *showVersion {
		fmt.Println(version.Get())
		os.Exit(0)
	}
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "unknown arguments: %q\n", flag.Args())
		os.Exit(2)
	}
	testfiles.AddFileSource(e2etestingmanifests.GetE2ETestingManifestsFS())
	testfiles.AddFileSource(testfixtures.GetTestFixturesFS())
	testfiles.AddFileSource(conformancetestdata.GetConformanceTestdataFS())
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

func TestE2E(t *testing.T) {
	e2e.RunE2ETests(t)
}
