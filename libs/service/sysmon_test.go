package service

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// sysmonChild, set in a test binary's environment, makes it a process that
// calls keepSysmonAwake and prints what it then runs with.
const sysmonChild = "HERALD_TEST_SYSMON_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(sysmonChild) != "" {
		err := keepSysmonAwake()
		fmt.Printf("pid=%d GODEBUG=%q guard=%q err=%v\n", os.Getpid(), os.Getenv("GODEBUG"), os.Getenv(reexecGuard), err)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A process started without schedtrace in its GODEBUG runs as if it had
// been given SysmonAwake: the same process (pid), re-executed once, its
// other settings kept; an operator's schedtrace is left alone.
func TestKeepSysmonAwake(t *testing.T) {
	for _, c := range []struct {
		name    string
		godebug []string // the child's GODEBUG entries
		want    string   // what it runs with
		reexec  bool
	}{
		{"no GODEBUG", nil, SysmonAwake, true},
		{"other settings kept", []string{"gctrace=0"}, "gctrace=0," + SysmonAwake, true},
		{"duplicate GODEBUGs: the runtime reads one", []string{"madvdontneed=1", "gctrace=0"}, "gctrace=0," + SysmonAwake, true},
		{"the operator's schedtrace wins", []string{"schedtrace=0"}, "schedtrace=0", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var env []string
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, "GODEBUG=") && !strings.HasPrefix(kv, reexecGuard+"=") {
					env = append(env, kv)
				}
			}
			env = append(env, sysmonChild+"=1")
			for _, g := range c.godebug {
				env = append(env, "GODEBUG="+g)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = env
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("child: %v: %s", err, out)
			}
			guard := ""
			if c.reexec {
				guard = "1"
			}
			want := fmt.Sprintf("pid=%d GODEBUG=%q guard=%q err=<nil>\n", cmd.Process.Pid, c.want, guard)
			if string(out) != want {
				t.Errorf("child printed %q, want %q", out, want)
			}
		})
	}
}

func TestSysmonAwakeEnv(t *testing.T) {
	for _, c := range []struct {
		name    string
		environ []string
		want    []string
	}{
		{"no GODEBUG", []string{"PATH=/bin"}, []string{"PATH=/bin", "GODEBUG=" + SysmonAwake}},
		{"other settings kept", []string{"GODEBUG=gctrace=1,madvdontneed=1", "HOME=/"},
			[]string{"GODEBUG=gctrace=1,madvdontneed=1", "HOME=/", "GODEBUG=gctrace=1,madvdontneed=1," + SysmonAwake}},
		{"the last GODEBUG is the one in force", []string{"GODEBUG=schedtrace=1000", "GODEBUG=gctrace=1"},
			[]string{"GODEBUG=schedtrace=1000", "GODEBUG=gctrace=1", "GODEBUG=gctrace=1," + SysmonAwake}},
		{"the operator's schedtrace wins", []string{"GODEBUG=gctrace=1,schedtrace=1000"}, []string{"GODEBUG=gctrace=1,schedtrace=1000"}},
		{"an empty GODEBUG", []string{"GODEBUG="}, []string{"GODEBUG=", "GODEBUG=" + SysmonAwake}},
		{"a key that only contains schedtrace", []string{"GODEBUG=xschedtrace=1"}, []string{"GODEBUG=xschedtrace=1", "GODEBUG=xschedtrace=1," + SysmonAwake}},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := slices.Clone(c.environ)
			got := SysmonAwakeEnv(in)
			if !slices.Equal(got, c.want) {
				t.Errorf("SysmonAwakeEnv(%q) = %q, want %q", c.environ, got, c.want)
			}
			if !slices.Equal(in, c.environ) {
				t.Errorf("SysmonAwakeEnv modified its argument: %q", in)
			}
		})
	}
}

// The runtime takes schedtrace as an int32 of milliseconds and ignores a
// value it cannot parse: SysmonAwake's must be the largest one it takes.
func TestSysmonAwakeIsTheLargestSchedtrace(t *testing.T) {
	v, ok := strings.CutPrefix(SysmonAwake, "schedtrace=")
	if !ok {
		t.Fatalf("SysmonAwake = %q, want schedtrace=<ms>", SysmonAwake)
	}
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil || n != 1<<31-1 {
		t.Fatalf("schedtrace %q: %d, %v; want 2^31-1 parsed as an int32", v, n, err)
	}
}
