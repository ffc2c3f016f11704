// Command herald-kube-apiserver builds the kube-apiserver v1.37.2 that the
// end-to-end tests run (integration/bench/kubeapiserver) into the user's
// cache directory, unless a build of the same sources is already there,
// and prints its path. `make test` runs it first, so that the one slow
// build happens in plain sight and outside the tests' timeout.
package main

import (
	"fmt"
	"os"

	"herald.dev/integration/stack"
)

func main() {
	bin, err := stack.KubeAPIServerBinary(os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "herald-kube-apiserver:", err)
		os.Exit(1)
	}
	fmt.Println(bin)
}
