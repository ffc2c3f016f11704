package stack

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Services are the binaries Build produces.
var Services = []string{"ingest", "cache", "fanout", "frontdoor"}

// RepoRoot finds the directory holding go.work, from the working directory
// up.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("go.work not found above the working directory")
		}
		dir = parent
	}
}

// Build compiles every service into binDir.
func Build(binDir string) error {
	root, err := RepoRoot()
	if err != nil {
		return err
	}
	args := []string{"build", "-o", binDir + string(filepath.Separator)}
	for _, s := range Services {
		args = append(args, "./services/"+s+"/cmd/"+s)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %v\n%s", err, out)
	}
	return nil
}

// RunTests is the TestMain of packages whose tests start stacks: it builds
// the services into a temporary directory, sets *binDir to it, runs the
// tests, removes the directory and exits with the tests' code.
func RunTests(m interface{ Run() int }, binDir *string) {
	dir, err := os.MkdirTemp("", "herald-test-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*binDir = dir
	if err := Build(dir); err != nil {
		os.RemoveAll(dir)
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
