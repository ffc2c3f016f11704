package service

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

// The Go runtime's system monitor (sysmon, a thread of its own) sleeps
// deeply while every P is idle, and the first system call a goroutine makes
// after that wakes it (a futex). Woken so, it starts again at its shortest
// period and sleeps 20 µs at a time (nanosleep) until it finds every P idle
// again, then goes back to its deep sleep (a futex). A Herald process that
// is idle between events, as every one is while kubelets' watches are quiet
// (a pod event every 5 ms per process at 200 writes/s), pays that for every
// event: strace counted, per event, 2-4 futex calls and 3-5 nanosleeps in
// each of ingest, cache, fanout and frontdoor (about half of their system
// calls), each one a switch to or from sysmon's thread.
//
// With GODEBUG's schedtrace set, sysmon never sleeps deeply
// (runtime/proc.go: "sysmon should not enter deep sleep if schedtrace is
// enabled"): while the process is idle it ticks every 10 ms, 100 wake-ups a
// second whatever the event rate, and it wakes for no system call. Its own
// effect, a line of scheduler state on standard error every schedtrace
// milliseconds, is pushed out to the largest value the runtime takes,
// 2^31-1 ms (24.8 days, counted on the machine's monotonic clock, which
// starts at boot: a host up that long prints one line at start, then one
// every 24.8 days). docs/operations.md ("Cores") has the measurements.

// SysmonAwake is the GODEBUG setting that keeps sysmon out of its deep
// sleep. Whoever starts a Herald process may put it in the process's
// environment (SysmonAwakeEnv): the runtime reads GODEBUG's schedtrace only
// at start. A process started without it re-executes itself with it
// (keepSysmonAwake).
const SysmonAwake = "schedtrace=2147483647"

// SysmonAwakeEnv returns environ (os.Environ's form) with SysmonAwake added
// to its GODEBUG, as the last entry (os/exec uses the last of duplicate
// keys). An environ whose GODEBUG already sets schedtrace is returned as it
// is: the operator's setting wins.
func SysmonAwakeEnv(environ []string) []string {
	godebug := ""
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
			godebug = v
		}
	}
	if setsSchedtrace(godebug) {
		return environ
	}
	if godebug != "" {
		godebug += ","
	}
	return append(environ[:len(environ):len(environ)], "GODEBUG="+godebug+SysmonAwake)
}

// setsSchedtrace reports whether a GODEBUG value sets schedtrace.
func setsSchedtrace(godebug string) bool {
	for _, field := range strings.Split(godebug, ",") {
		if k, _, ok := strings.Cut(field, "="); ok && strings.TrimSpace(k) == "schedtrace" {
			return true
		}
	}
	return false
}

// sysmonAwake reports whether this process was started with schedtrace in
// its GODEBUG.
func sysmonAwake() bool { return setsSchedtrace(os.Getenv("GODEBUG")) }

// reexecGuard marks a process this package re-executed (keepSysmonAwake),
// so that it is never re-executed twice, whatever its GODEBUG reads.
const reexecGuard = "HERALD_SYSMON_REEXECUTED"

// keepSysmonAwake makes a process started without schedtrace in its
// GODEBUG run with SysmonAwake as if whoever started it had set it: it
// re-executes the program (same binary, arguments and process id) with
// SysmonAwake added to GODEBUG, which the runtime reads only at start. It
// returns without doing so when GODEBUG already sets schedtrace (the
// operator's choice: schedtrace=0 keeps sysmon's deep sleep), after a
// re-execution, and when the program cannot be re-executed (the error
// says why; the process then runs with sysmon's deep sleep). Call it
// first, before the process starts anything.
//
// Without it, a process run by hand or by a manifest without the setting
// paid for it: Herald's whole stack, right after 1,000 watches opened, used
// 7.1-8.1 ms of CPU per 1,000 deliveries where it used 5.8-6.2 with the
// setting (docs/operations.md, Cores).
func keepSysmonAwake() error {
	if sysmonAwake() || os.Getenv(reexecGuard) != "" {
		return nil
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding the program to re-execute with GODEBUG=%s: %w", SysmonAwake, err)
	}
	env := append(withoutGODEBUG(SysmonAwakeEnv(os.Environ())), reexecGuard+"=1")
	err = syscall.Exec(exe, os.Args, env)
	return fmt.Errorf("re-executing %s with GODEBUG=%s: %w", exe, SysmonAwake, err)
}

// withoutGODEBUG returns environ with only its last GODEBUG entry:
// SysmonAwakeEnv appends one, and the runtime, unlike os/exec, reads the
// first.
func withoutGODEBUG(environ []string) []string {
	last := -1
	for i, kv := range environ {
		if strings.HasPrefix(kv, "GODEBUG=") {
			last = i
		}
	}
	out := make([]string, 0, len(environ))
	for i, kv := range environ {
		if i == last || !strings.HasPrefix(kv, "GODEBUG=") {
			out = append(out, kv)
		}
	}
	return out
}
