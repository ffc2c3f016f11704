package service

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

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
