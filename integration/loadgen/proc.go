package loadgen

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat;
// 100 on every Linux this runs on.
const clockTicks = 100

// CPUMillis is the CPU time (user + system) the process has used so far, in
// milliseconds, read from /proc/<pid>/stat.
func CPUMillis(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; the fields after its
	// closing parenthesis start at field 3 (state).
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseFloat(f[11], 64) // field 14
	stime, err2 := strconv.ParseFloat(f[12], 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad utime/stime", pid)
	}
	return (utime + stime) * 1000 / clockTicks, nil
}

// WriteCalls is the number of write system calls (write, writev, pwrite:
// the "syscw" of /proc/<pid>/io) the process has made so far. Every socket
// write of a Go program is one of them, so on a watch workload it counts
// the writes to clients and between processes.
func WriteCalls(pid int) (float64, error) {
	v, err := procField(pid, "io", "syscw:")
	if err != nil {
		return 0, err
	}
	return strconv.ParseFloat(v, 64)
}

// RSSBytes is the process's resident set size, from /proc/<pid>/status.
func RSSBytes(pid int) (uint64, error) {
	v, err := procField(pid, "status", "VmRSS:")
	if err != nil {
		return 0, err
	}
	kb, err := strconv.ParseUint(strings.TrimSuffix(v, " kB"), 10, 64)
	return kb << 10, err
}

// procField is the value of the line of /proc/<pid>/<file> that starts
// with key, spaces trimmed.
func procField(pid int, file, key string) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, file))
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, key); ok {
			return strings.TrimSpace(rest), nil
		}
	}
	return "", fmt.Errorf("/proc/%d/%s: no %s", pid, file, strings.TrimSuffix(key, ":"))
}

// Sched is a process's scheduling so far, summed over its threads from
// /proc/<pid>/task/<tid>/schedstat: Wait is the time its threads were
// runnable but not running (waiting in a run queue for a CPU, or for a
// virtual CPU the hypervisor had not scheduled), Slices the times they
// were put on a CPU. Threads that have exited are not counted.
type Sched struct {
	Wait   time.Duration
	Slices float64
}

// ReadSched reads pid's Sched.
func ReadSched(pid int) (Sched, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return Sched{}, err
	}
	var (
		s    Sched
		read int
		ran  time.Duration
	)
	for _, t := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, t.Name(), "schedstat"))
		if err != nil {
			continue // the thread exited since the listing
		}
		read++
		ts, err := parseSchedstat(b)
		if err != nil {
			return Sched{}, fmt.Errorf("%s/%s/schedstat: %w", dir, t.Name(), err)
		}
		s.Wait += ts.Wait
		s.Slices += ts.Slices
		ran += ts.run
	}
	if read == 0 || ran == 0 {
		// A live process has run: zeros are a kernel that does not keep
		// these figures.
		return Sched{}, fmt.Errorf("%s: no thread's schedstat readable, or all zero (a kernel without scheduler statistics?)", dir)
	}
	return s, nil
}

// threadSched is one thread's schedstat.
type threadSched struct {
	Sched
	run time.Duration // on a CPU
}

// parseSchedstat reads one thread's schedstat: time on a CPU, time
// waiting in a run queue (both in nanoseconds) and timeslices run.
func parseSchedstat(b []byte) (threadSched, error) {
	f := strings.Fields(string(b))
	if len(f) != 3 {
		return threadSched{}, fmt.Errorf("%d fields, want 3", len(f))
	}
	run, err0 := strconv.ParseInt(f[0], 10, 64)
	wait, err1 := strconv.ParseInt(f[1], 10, 64)
	slices, err2 := strconv.ParseFloat(f[2], 64)
	if err0 != nil || err1 != nil || err2 != nil {
		return threadSched{}, fmt.Errorf("bad fields %q", f)
	}
	return threadSched{Sched: Sched{Wait: time.Duration(wait), Slices: slices}, run: time.Duration(run)}, nil
}

// MachineTicks is the machine's CPU time so far, from /proc/stat's first
// line, in USER_HZ ticks: all of it, and the part the hypervisor gave to
// something else while this machine had work for the CPU (steal).
type MachineTicks struct {
	Total, Steal float64
}

// ReadMachineTicks reads /proc/stat.
func ReadMachineTicks() (MachineTicks, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return MachineTicks{}, err
	}
	return parseStat(b)
}

// parseStat reads the "cpu" line of /proc/stat: user nice system idle
// iowait irq softirq steal, then guest times, which user and nice already
// hold.
func parseStat(b []byte) (MachineTicks, error) {
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return MachineTicks{}, fmt.Errorf("/proc/stat: first line %q, want cpu and at least 8 times", line)
	}
	var m MachineTicks
	for i, v := range f[1:9] {
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return MachineTicks{}, fmt.Errorf("/proc/stat: bad time %q", v)
		}
		m.Total += n
		if i == 7 {
			m.Steal = n
		}
	}
	return m, nil
}

// StealShare is the share of the machine's CPU time between m0 and m that
// the hypervisor stole (-1: not measured).
func StealShare(m0, m MachineTicks) float64 {
	if m.Total <= m0.Total {
		return -1
	}
	return (m.Steal - m0.Steal) / (m.Total - m0.Total)
}
