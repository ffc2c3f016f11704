package main

import (
	"strings"
	"testing"
	"time"

	"herald.dev/integration/loadgen"
)

// result is a run that delivered delivered of expected events over a
// window after writes of 20 s, at p99.
func result(expected, delivered int, window time.Duration, p99 time.Duration) *loadgen.Result {
	return &loadgen.Result{Expected: expected, Deliveries: delivered, WriteTime: 20 * time.Second, Window: window, P99: p99,
		ServerCPU: float64(delivered) / 100}
}

// The broadcast's throughput target applies where kube-apiserver falls
// behind the writes, and only a Herald that falls behind too can miss it.
func TestTargetsSaturation(t *testing.T) {
	const expected = 4_000_000 // 1,000 watchers x 200 writes/s x 20 s
	keepsUp := result(expected, expected, 20050*time.Millisecond, 80*time.Millisecond)
	for _, tc := range []struct {
		name       string
		herald     *loadgen.Result
		kube       *loadgen.Result
		line, want string
	}{
		{"both keep up: latency and CPU targets", keepsUp,
			result(expected, expected, 20200*time.Millisecond, 300*time.Millisecond),
			"p99 80.0 ms vs kube-apiserver 300.0 ms, ratio 0.27 (target <= 0.5)", "met"},
		{"kube-apiserver behind, Herald keeps up under 2x", keepsUp,
			result(expected, expected, 22400*time.Millisecond, 3*time.Second),
			"kube-apiserver delivered 89.3% of the rate offered (saturated)", "not shown: Herald delivered 99.8% of the rate offered"},
		{"both behind, under 2x", result(expected, expected, 20400*time.Millisecond/98*100, time.Second),
			result(expected, expected, 35*time.Second, 18*time.Second),
			"ratio 1.68 (target >= 2)", "**missed**"},
		{"both behind, 2x", result(expected, expected, 20400*time.Millisecond/98*100, time.Second),
			result(expected, expected, 45*time.Second, 18*time.Second),
			"ratio 2.16 (target >= 2)", "met"},
		{"Herald keeps up but with a worse p99", result(expected, expected, 20050*time.Millisecond, 4*time.Second),
			result(expected, expected, 22400*time.Millisecond, 3*time.Second),
			"(target: no worse)", "**missed**"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := loadgen.Workload{Name: "broadcast-1000x200", Watchers: 1000, WritesPerSec: 200}
			rp := &loadgen.Report{Workloads: []loadgen.Workload{w},
				Herald: map[string]*loadgen.Result{w.Name: tc.herald}, Kube: map[string]*loadgen.Result{w.Name: tc.kube}}
			var found bool
			for _, l := range targets(rp) {
				if strings.Contains(l, tc.line) {
					found = true
					if !strings.Contains(l, ": "+tc.want) {
						t.Errorf("verdict of %q: want %q", l, tc.want)
					}
				}
			}
			if !found {
				t.Errorf("no target line has %q:\n%s", tc.line, strings.Join(targets(rp), "\n"))
			}
		})
	}
}
