package service

import (
	"os"
	"strings"
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
// sleep. Whoever starts a Herald process puts it in the process's
// environment (SysmonAwakeEnv): the runtime reads GODEBUG's schedtrace only
// at start.
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
