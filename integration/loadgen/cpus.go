package loadgen

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"
	"k8s.io/utils/cpuset"
)

// CPU placement. The load client (this process: the writer and every
// watcher) and the servers it measures compete for the same cores unless
// they are kept apart. Where the machine has enough of them, the client is
// pinned to a few and every server process (each system's host, what it
// starts, and kube-apiserver) to the rest, so that neither system's figures
// carry the client's scheduling; on a small machine the servers would lose
// the cores the client gets, so everything shares them, and the report
// says so.

// MinCPUsToPin is the fewest CPUs (of those this process may use) on which
// "auto" keeps the client apart: a quarter of them, rounded down, for the
// client, the rest for the servers.
const MinCPUsToPin = 4

// CPUPlan is where the client and the servers run. Both empty: unpinned.
type CPUPlan struct {
	Client, Servers []int
	// Of: the CPUs this process could use when the plan was made.
	Of []int
}

// Pinned reports whether the client and the servers are kept apart.
func (p CPUPlan) Pinned() bool { return len(p.Client) > 0 }

// PlanCPUs splits avail (the CPUs this process may run on) by spec:
// "auto" (a quarter of them rounded down, the highest-numbered, for the
// client when there are MinCPUsToPin or more; otherwise none), "none", or
// a list of CPUs for the client ("3", "6-7", "0,2"), which must leave the
// servers at least one.
func PlanCPUs(spec string, avail []int) (CPUPlan, error) {
	avail = slices.Sorted(slices.Values(avail))
	plan := CPUPlan{Of: avail}
	switch spec {
	case "none":
		return plan, nil
	case "auto":
		if len(avail) < MinCPUsToPin {
			return plan, nil
		}
		n := len(avail) / 4 // at least one
		plan.Client = slices.Clone(avail[len(avail)-n:])
		plan.Servers = slices.Clone(avail[:len(avail)-n])
		return plan, nil
	}
	client, err := parseCPUList(spec)
	if err != nil {
		return plan, err
	}
	for _, c := range client {
		if !slices.Contains(avail, c) {
			return plan, fmt.Errorf("CPU %d is not one this process may use (%s)", c, formatCPUs(avail))
		}
	}
	for _, c := range avail {
		if !slices.Contains(client, c) {
			plan.Servers = append(plan.Servers, c)
		}
	}
	if len(plan.Servers) == 0 {
		return plan, fmt.Errorf("CPUs %s leave none of %s to the servers", formatCPUs(client), formatCPUs(avail))
	}
	plan.Client = client
	return plan, nil
}

// parseCPUList reads a Linux CPU list ("0-2,5"): sorted, without repeats;
// an empty list is an error.
func parseCPUList(s string) ([]int, error) {
	set, err := cpuset.Parse(s)
	if err != nil || set.IsEmpty() {
		return nil, fmt.Errorf("%q is not a CPU list (e.g. 3, 6-7 or 0,2)", s)
	}
	return set.List(), nil
}

// formatCPUs writes cpus as a Linux CPU list ("0-2,5").
func formatCPUs(cpus []int) string { return cpuset.New(cpus...).String() }

// String says where the client and the servers ran, for the report.
func (p CPUPlan) String() string {
	if p.Pinned() {
		return fmt.Sprintf("the load client pinned to CPUs %s, every server process to CPUs %s", formatCPUs(p.Client), formatCPUs(p.Servers))
	}
	why := "-client-cpus none"
	if len(p.Of) < MinCPUsToPin {
		why = fmt.Sprintf("fewer than the %d it takes to keep them apart", MinCPUsToPin)
	}
	return fmt.Sprintf("the load client and the servers sharing the %d CPUs herald-load may use, %s: %s", len(p.Of), formatCPUs(p.Of), why)
}

// AvailableCPUs is the CPUs this process may run on.
func AvailableCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, err
	}
	return cpuList(&set), nil
}

func cpuList(set *unix.CPUSet) []int {
	var cpus []int
	for c := range len(set) * 64 {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus
}

func cpuSet(cpus []int) *unix.CPUSet {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	return &set
}

// PinClient moves every thread of this process to the client's CPUs
// (threads started later inherit their creator's). A thread not moved yet
// may start another while the threads are listed: the listing is repeated
// until it finds none it has not moved. Unpinned: nothing.
func (p CPUPlan) PinClient() error {
	if !p.Pinned() {
		return nil
	}
	set := cpuSet(p.Client)
	moved := map[int]bool{}
	for {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return err
		}
		found := false
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil || moved[tid] {
				continue
			}
			found = true
			// A thread that exited since the listing is no error.
			if err := unix.SchedSetaffinity(tid, set); err != nil && err != unix.ESRCH {
				return fmt.Errorf("pinning thread %d: %w", tid, err)
			}
			moved[tid] = true
		}
		if !found {
			return nil
		}
	}
}

// StartServer runs start, which starts a server process, so that the
// process runs on the servers' CPUs: a child inherits the CPUs of the
// thread that forks it, and start runs on a thread moved there for the
// call and moved back before any other goroutine may run on it. (The
// runtime starts no thread from a locked one: it has a template thread for
// that.) Unpinned: start alone.
func (p CPUPlan) StartServer(start func() error) error {
	if !p.Pinned() {
		return start()
	}
	runtime.LockOSThread()
	// Unlocked whatever happens: a goroutine that exits locked ends its
	// thread, and a child started with Pdeathsig dies with the thread that
	// forked it.
	defer runtime.UnlockOSThread()
	if err := unix.SchedSetaffinity(0, cpuSet(p.Servers)); err != nil {
		return fmt.Errorf("moving the starting thread to the servers' CPUs: %w", err)
	}
	err := start()
	if perr := unix.SchedSetaffinity(0, cpuSet(p.Client)); perr != nil && err == nil {
		err = fmt.Errorf("moving the starting thread back to the client's CPUs: %w", perr)
	}
	return err
}
