package stack

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// KubeVersion is the Kubernetes release every binary built from
// k8s.io/kubernetes reports. A build from the module leaves
// k8s.io/component-base/version at "v0.0.0-master+$Format:%H$", which the e2e
// framework cannot parse and which no released server reports: the version
// is stamped at link time instead, as Kubernetes' own release build does.
const KubeVersion = "v1.37.2"

// kubeVersionLDFlags stamp KubeVersion into k8s.io/component-base/version.
func kubeVersionLDFlags() string {
	v := strings.Split(strings.TrimPrefix(KubeVersion, "v"), ".")
	const pkg = "k8s.io/component-base/version"
	return fmt.Sprintf("-X %[1]s.gitVersion=%[2]s -X %[1]s.gitMajor=%[3]s -X %[1]s.gitMinor=%[4]s -X %[1]s.gitTreeState=clean",
		pkg, KubeVersion, v[0], v[1])
}

// moduleBuild is a build of binaries from a module of this repository that
// lives outside go.work (built with GOWORK=off), cached across runs.
type moduleBuild struct {
	name   string   // what is built, for messages and the cache directory
	module string   // relative to the repository root
	files  []string // the module's files whose content keys the cache
	// steps are the go commands (run in the module) that write each
	// binary: "go" args, with {out} standing for the binary's path.
	steps []buildStep
}

type buildStep struct {
	bin  string
	args []string
}

// build returns the directory holding the binaries, building them first
// unless a build of the same sources (the files' content, the build
// commands and the Go version) is already in the user's cache directory.
// An exclusive file lock makes concurrent callers wait for one build
// instead of running two. Progress lines go to log.
func (b moduleBuild) build(log io.Writer) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	src := filepath.Join(root, b.module)
	h := sha256.New()
	for _, f := range b.files {
		data, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", f, len(data))
		h.Write(data)
	}
	for _, s := range b.steps {
		fmt.Fprintf(h, "%s %q\n", s.bin, s.args)
	}
	io.WriteString(h, runtime.Version())
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory for %s: %w", b.name, err)
	}
	dir := filepath.Join(cache, "herald", b.name, hex.EncodeToString(h.Sum(nil))[:16])
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(dir+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("locking %s: %w", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	for _, s := range b.steps {
		bin := filepath.Join(dir, s.bin)
		if _, err := os.Stat(bin); err == nil {
			continue
		}
		fmt.Fprintf(log, "building %s into %s (the first build compiles k8s.io/kubernetes: several minutes; later runs reuse it)\n", s.bin, dir)
		start := time.Now()
		// Build next to the final path and rename, so that a build killed
		// half way never leaves a binary that looks complete.
		tmp := bin + ".tmp"
		args := make([]string, len(s.args))
		for i, a := range s.args {
			args[i] = strings.ReplaceAll(a, "{out}", tmp)
		}
		cmd := exec.Command("go", args...)
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			os.Remove(tmp)
			return "", fmt.Errorf("building %s: %w\n%s", s.bin, err, out)
		}
		if err := os.Rename(tmp, bin); err != nil {
			return "", err
		}
		fmt.Fprintf(log, "built %s in %s\n", s.bin, time.Since(start).Round(time.Second))
	}
	return dir, nil
}

// conformanceModule builds Kubernetes' e2e test binary (its
// sig-api-machinery tests) and kube-controller-manager, outside go.work.
const conformanceModule = "integration/conformance/kube"

// ConformanceBinaries returns the paths of Kubernetes' e2e test binary and
// of kube-controller-manager, both built from k8s.io/kubernetes v1.37.2 in
// integration/conformance/kube and cached as KubeAPIServerBinary's build is.
// The first build takes about ten minutes of two cores (the test binary);
// progress lines go to log.
func ConformanceBinaries(log io.Writer) (e2eTest, kubeControllerManager string, err error) {
	ld := kubeVersionLDFlags()
	dir, err := moduleBuild{
		name: "kube-conformance", module: conformanceModule,
		files: []string{"go.mod", "go.sum", "e2e/e2e_test.go", "kube-controller-manager/main.go"},
		steps: []buildStep{
			// -vet=off: go vet would analyse every one of its ~2,200 dependencies first.
			{bin: "e2e.test", args: []string{"test", "-c", "-vet=off", "-ldflags", ld, "-o", "{out}", "./e2e"}},
			{bin: "kube-controller-manager", args: []string{"build", "-ldflags", ld, "-o", "{out}", "./kube-controller-manager"}},
		},
	}.build(log)
	if err != nil {
		return "", "", err
	}
	return filepath.Join(dir, "e2e.test"), filepath.Join(dir, "kube-controller-manager"), nil
}
