package loadgen

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestPlanCPUs(t *testing.T) {
	for _, tc := range []struct {
		spec            string
		avail           []int
		client, servers []int
		err             string
	}{
		{spec: "auto", avail: []int{0, 1}},
		{spec: "auto", avail: []int{0, 1, 2}},
		{spec: "auto", avail: []int{3, 0, 2, 1}, client: []int{3}, servers: []int{0, 1, 2}},
		{spec: "auto", avail: []int{0, 1, 2, 3, 4, 5, 6, 7}, client: []int{6, 7}, servers: []int{0, 1, 2, 3, 4, 5}},
		{spec: "auto", avail: []int{2, 4, 6, 8, 10}, client: []int{10}, servers: []int{2, 4, 6, 8}},
		{spec: "none", avail: []int{0, 1, 2, 3, 4, 5, 6, 7}},
		{spec: "1", avail: []int{0, 1}, client: []int{1}, servers: []int{0}},
		{spec: "0,2", avail: []int{0, 1, 2, 3}, client: []int{0, 2}, servers: []int{1, 3}},
		{spec: "2-3,2", avail: []int{0, 1, 2, 3}, client: []int{2, 3}, servers: []int{0, 1}},
		{spec: "0-1", avail: []int{0, 1}, err: "leave none of 0-1 to the servers"},
		{spec: "4", avail: []int{0, 1}, err: "CPU 4 is not one this process may use (0-1)"},
		{spec: "3-1", avail: []int{0, 1, 2, 3}, err: `"3-1" is not a CPU list`},
		{spec: "", avail: []int{0, 1}, err: `"" is not a CPU list`},
		{spec: "half", avail: []int{0, 1}, err: `"half" is not a CPU list`},
	} {
		plan, err := PlanCPUs(tc.spec, tc.avail)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("PlanCPUs(%q, %v): error %v, want one saying %q", tc.spec, tc.avail, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("PlanCPUs(%q, %v): %v", tc.spec, tc.avail, err)
			continue
		}
		if !slices.Equal(plan.Client, tc.client) || !slices.Equal(plan.Servers, tc.servers) || plan.Pinned() != (tc.client != nil) {
			t.Errorf("PlanCPUs(%q, %v) = client %v, servers %v; want %v, %v", tc.spec, tc.avail, plan.Client, plan.Servers, tc.client, tc.servers)
		}
	}
}

// TestStartServerPins starts a process through a pinned plan and checks
// where the kernel lets it and this process's threads run.
func TestStartServerPins(t *testing.T) {
	if os.Getenv("HERALD_CPUS_CHILD") != "" {
		io.Copy(io.Discard, os.Stdin) // until the test closes it
		return
	}
	avail, err := AvailableCPUs()
	if err != nil {
		t.Fatal(err)
	}
	if len(avail) < 2 {
		t.Skipf("this process may use %d CPU; pinning needs two", len(avail))
	}
	plan, err := PlanCPUs(formatCPUs(avail[len(avail)-1:]), avail)
	if err != nil {
		t.Fatal(err)
	}
	if err := plan.PinClient(); errors.Is(err, unix.EPERM) {
		t.Skipf("this process may not set CPU affinity: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	// Every thread back on every CPU afterwards, for the other tests.
	t.Cleanup(func() {
		if err := (CPUPlan{Client: avail, Servers: avail}).PinClient(); err != nil {
			t.Error(err)
		}
	})
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^TestStartServerPins$")
	cmd.Env = append(os.Environ(), "HERALD_CPUS_CHILD=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := plan.StartServer(cmd.Start); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Wait() }()

	if got := allowedCPUs(t, cmd.Process.Pid); !slices.Equal(got, []string{formatCPUs(plan.Servers)}) {
		t.Errorf("the started process's threads may run on CPUs %v, want only the servers' %s", got, formatCPUs(plan.Servers))
	}
	if got := allowedCPUs(t, os.Getpid()); !slices.Equal(got, []string{formatCPUs(plan.Client)}) {
		t.Errorf("this process's threads may run on CPUs %v after the start, want only the client's %s", got, formatCPUs(plan.Client))
	}
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	if got := cpuList(&set); !slices.Equal(got, plan.Client) {
		t.Errorf("the calling thread may run on CPUs %v, want %v", got, plan.Client)
	}
}

// allowedCPUs is the distinct Cpus_allowed_list of pid's threads.
func allowedCPUs(t *testing.T, pid int) []string {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "status"))
	if err != nil || len(dirs) == 0 {
		t.Fatalf("threads of %d: %v", pid, err)
	}
	var lists []string
	for _, f := range dirs {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // the thread exited
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
				lists = append(lists, strings.TrimSpace(v))
			}
		}
	}
	slices.Sort(lists)
	return slices.Compact(lists)
}
