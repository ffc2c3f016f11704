// Command kube-controller-manager is an unmodified kube-controller-manager
// v1.37.2 built from the k8s.io/kubernetes module: `make conformance` runs
// the few controllers the e2e framework needs (namespaces, service accounts
// and their tokens, the root CA ConfigMap, garbage collection, quotas).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format, as upstream
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics, as upstream
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric, as upstream
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	os.Exit(cli.Run(app.NewControllerManagerCommand()))
}
