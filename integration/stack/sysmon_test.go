package stack

import (
	"slices"
	"testing"
)

func TestSysmonEnv(t *testing.T) {
	for _, tc := range []struct {
		name    string
		environ []string
		awake   bool
		want    []string
	}{
		{"awake adds the setting", []string{"HOME=/root"}, true, []string{"HOME=/root", "GODEBUG=schedtrace=2147483647"}},
		{"awake keeps an operator's schedtrace", []string{"GODEBUG=schedtrace=1000"}, true, []string{"GODEBUG=schedtrace=1000"}},
		{"default without GODEBUG", []string{"HOME=/root"}, false, []string{"HOME=/root"}},
		{"default drops an inherited schedtrace", []string{"GODEBUG=schedtrace=2147483647", "HOME=/root"}, false, []string{"HOME=/root"}},
		{"default keeps other settings", []string{"GODEBUG=gctrace=1,schedtrace=2147483647,madvdontneed=1"}, false, []string{"GODEBUG=gctrace=1,madvdontneed=1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.environ)
			if got := SysmonEnv(in, tc.awake); !slices.Equal(got, tc.want) {
				t.Errorf("SysmonEnv(%q, %v) = %q, want %q", tc.environ, tc.awake, got, tc.want)
			}
			if !slices.Equal(in, tc.environ) {
				t.Errorf("SysmonEnv modified its argument: %q", in)
			}
		})
	}
}
