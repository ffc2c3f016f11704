package loadgen

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
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
