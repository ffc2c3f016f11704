package main

import (
	"bytes"
	"encoding/csv"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"herald.dev/integration/loadgen"
)

// result is a run of the broadcast-1000x200 workload (4,000,000 events
// over 20 s of writes) that delivered them all over window, at p99.
func result(window, p99 time.Duration) *loadgen.Result {
	const expected = 4_000_000
	return &loadgen.Result{Expected: expected, Deliveries: expected, WriteTime: 20 * time.Second, Window: window, P99: p99,
		ServerCPU: expected / 100}
}

// The broadcast's throughput target applies where kube-apiserver falls
// behind the writes, and only a Herald that falls behind too can miss it.
func TestTargetsSaturation(t *testing.T) {
	keepsUp := result(20050*time.Millisecond, 80*time.Millisecond)
	for _, tc := range []struct {
		name       string
		herald     *loadgen.Result
		kube       *loadgen.Result
		line, want string
	}{
		{"both keep up: latency and CPU targets", keepsUp,
			result(20200*time.Millisecond, 300*time.Millisecond),
			"p99 80.0 ms vs kube-apiserver 300.0 ms, ratio 0.27 (target <= 0.5)", "met"},
		{"kube-apiserver behind, Herald keeps up under 2x", keepsUp,
			result(22400*time.Millisecond, 3*time.Second),
			"kube-apiserver delivered 89.3% of the rate offered (saturated)", "not shown: Herald delivered 99.8% of the rate offered"},
		{"both behind, under 2x", result(20400*time.Millisecond/98*100, time.Second),
			result(35*time.Second, 18*time.Second),
			"ratio 1.68 (target >= 2)", "**missed**"},
		{"both behind, 2x", result(20400*time.Millisecond/98*100, time.Second),
			result(45*time.Second, 18*time.Second),
			"ratio 2.16 (target >= 2)", "met"},
		{"Herald keeps up but with a worse p99", result(20050*time.Millisecond, 4*time.Second),
			result(22400*time.Millisecond, 3*time.Second),
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

// The CPU target compares the median CPU of each system's runs, which is
// not the CPU of its median-p99 run; runs that delivered nothing do not
// count.
func TestTargetsMedianCPU(t *testing.T) {
	run := func(p99 time.Duration, cpuPer1000 float64) *loadgen.Result {
		return &loadgen.Result{Expected: 4000, Deliveries: 4000, WriteTime: 20 * time.Second, Window: 20 * time.Second,
			P99: p99, ServerCPU: cpuPer1000 * 4}
	}
	none := &loadgen.Result{Expected: 4000, WriteTime: 20 * time.Second, Window: 20 * time.Second}
	w := loadgen.Workload{Name: "kubelet-5000x200", Watchers: 5000, WritesPerSec: 200, Kubelet: true}
	// Herald's median-p99 run (5 ms) has the highest CPU; its median CPU
	// is 3,000 against kube-apiserver's 3,100.
	hr := []*loadgen.Result{run(4*time.Millisecond, 2900), run(5*time.Millisecond, 3300), run(6*time.Millisecond, 3000)}
	// kube-apiserver's median-p99 run (6 ms) has 2,800; its median CPU
	// over the two runs that delivered is 3,100 (the upper of two),
	// where counting the empty run as 0 would give 2,800.
	kr := []*loadgen.Result{run(5*time.Millisecond, 3100), none, run(6*time.Millisecond, 2800)}
	for _, tc := range []struct {
		name   string
		rounds bool
		want   string
	}{
		{"medians of the runs", true,
			"kubelet-5000x200: CPU per 1,000 deliveries (median of the runs) 3000.00 ms vs 3100.00 ms, ratio 0.97 (target <= 1.0): met."},
		{"no runs listed: the median-p99 runs'", false,
			"kubelet-5000x200: CPU per 1,000 deliveries (median of the runs) 3300.00 ms vs 2800.00 ms, ratio 1.18 (target <= 1.0): **missed**."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rp := &loadgen.Report{Workloads: []loadgen.Workload{w},
				Herald: map[string]*loadgen.Result{w.Name: loadgen.Median(hr)}, Kube: map[string]*loadgen.Result{w.Name: loadgen.Median(kr)}}
			if tc.rounds {
				rp.HeraldRounds = map[string][]*loadgen.Result{w.Name: hr}
				rp.KubeRounds = map[string][]*loadgen.Result{w.Name: kr}
			}
			var lines []string
			for _, l := range targets(rp) {
				if l == tc.want {
					return
				}
				lines = append(lines, l)
			}
			t.Errorf("no target line %q:\n%s", tc.want, strings.Join(lines, "\n"))
		})
	}
}

// The token file holds one token per user, the admin first; every user is
// in system:masters but the fleet's, whose only group is the one its RBAC
// grant names.
func TestTokenLines(t *testing.T) {
	r := csv.NewReader(bytes.NewReader(tokenLines("p", numKubelets)))
	r.FieldsPerRecord = -1
	recs, err := r.ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if n := 1 + numUsers + 1 + 1 + numKubelets; len(recs) != n {
		t.Fatalf("%d tokens, want %d", len(recs), n)
	}
	if !slices.Equal(recs[0], []string{"p-admin", "herald-admin", "herald-admin", "system:masters"}) {
		t.Errorf("first line %q: want the admin", recs[0])
	}
	seen := map[string]bool{}
	var fleet []string
	for _, rec := range recs {
		if seen[rec[0]] {
			t.Errorf("token %s twice", rec[0])
		}
		seen[rec[0]] = true
		groups := strings.Split(rec[3], ",")
		if rec[0] == "p-fleet" {
			fleet = rec
			continue
		}
		if !slices.Contains(groups, "system:masters") {
			t.Errorf("%s not in system:masters: %q", rec[1], rec)
		}
	}
	if want := []string{"p-fleet", "herald-bench-watcher", "herald-bench-watcher", "herald:bench-watchers"}; !slices.Equal(fleet, want) {
		t.Errorf("fleet's line %q, want %q", fleet, want)
	}
	if loadgen.FleetUser != fleet[1] || loadgen.FleetGroup != fleet[3] {
		t.Errorf("fleet's line %q is not the user and group the RBAC grant names (%s, %s)", fleet, loadgen.FleetUser, loadgen.FleetGroup)
	}
}

// The fleet workloads: the shape's flag, 15 s of writes 500 ms after the
// opening, kubelet-like ones still one node each; the full-scale ones in
// the default set, the reduced one not; none named like another workload.
func TestFleetWorkloads(t *testing.T) {
	ws := fleetWorkloads("http2", 7*time.Second)
	var names []string
	for _, w := range ws {
		names = append(names, w.Name)
		if !w.Fleet || w.Duration != 15*time.Second || w.Warmup != 500*time.Millisecond || w.Settle != 7*time.Second || w.Proto != "http2" || w.OneUser || w.Mux != 0 {
			t.Errorf("%s: %+v", w.Name, w)
		}
		if w.Kubelet != strings.HasPrefix(w.Name, "kubelet-") || w.Protobuf != strings.Contains(w.Name, "-protobuf") {
			t.Errorf("%s: kubelet %v, protobuf %v", w.Name, w.Kubelet, w.Protobuf)
		}
		if inDefault := strings.Contains(","+defaultWorkloads+",", ","+w.Name+","); inDefault == strings.HasPrefix(w.Name, "broadcast-200x") {
			t.Errorf("%s: in the default set %v", w.Name, inDefault)
		}
	}
	want := []string{"broadcast-1000x100-fleet", "kubelet-5000x200-fleet", "kubelet-5000x200-protobuf-fleet", "broadcast-200x100-fleet"}
	if !slices.Equal(names, want) {
		t.Errorf("fleet workloads %q, want %q", names, want)
	}
	for _, w := range ws {
		var watchers, perSec int
		fmt.Sscanf(strings.SplitN(w.Name, "-", 2)[1], "%dx%d", &watchers, &perSec)
		if w.Watchers != watchers || w.WritesPerSec != perSec {
			t.Errorf("%s: %d watchers at %d writes/s", w.Name, w.Watchers, w.WritesPerSec)
		}
	}
}

func TestSysmonAwake(t *testing.T) {
	for _, tc := range []struct {
		flag string
		want awakeSystems
	}{{"both", awakeSystems{herald: true, kube: true}}, {"herald", awakeSystems{herald: true}}, {"none", awakeSystems{}}} {
		if got, err := sysmonAwake(tc.flag); err != nil || got != tc.want {
			t.Errorf("-godebug %s: %+v, %v; want %+v", tc.flag, got, err, tc.want)
		}
	}
	if _, err := sysmonAwake("kube"); err == nil {
		t.Error("-godebug kube: no error")
	}
}

// A fleet workload's watches share one token: the target says whether
// every one opened.
func TestTargetsFleetOpened(t *testing.T) {
	w := loadgen.Workload{Name: "broadcast-1000x100-fleet", Watchers: 1000, WritesPerSec: 100, Fleet: true}
	rp := &loadgen.Report{Workloads: []loadgen.Workload{w}, Herald: map[string]*loadgen.Result{w.Name: {Watchers: 998, OpenFailures: 2}}}
	want := "broadcast-1000x100-fleet: 998 of 1000 watches of one token opened with the default flags (target all): **missed**."
	if got := targets(rp); !slices.Contains(got, want) {
		t.Errorf("no target line %q:\n%s", want, strings.Join(got, "\n"))
	}
}

// The kubelet-like p99 target of issue 57: kube-apiserver's p99 plus 3 ms,
// and half of it wherever it passes 100 ms.
func TestTargetsKubeletP99(t *testing.T) {
	w := loadgen.Workload{Name: "kubelet-5000x200", Watchers: 5000, WritesPerSec: 200, Kubelet: true}
	run := func(p99 time.Duration) *loadgen.Result {
		return &loadgen.Result{Expected: 12000, Deliveries: 12000, WriteTime: 60 * time.Second, Window: 60 * time.Second, P99: p99, ServerCPU: 20000}
	}
	for _, tc := range []struct {
		name         string
		herald, kube time.Duration
		want         string
	}{
		{"within 3 ms", 6900 * time.Microsecond, 4 * time.Millisecond,
			"kubelet-5000x200: p99 6.9 ms vs kube-apiserver 4.0 ms, ratio 1.73 (target <= kube-apiserver's + 3 ms, <= 7.0 ms): met."},
		{"past 3 ms", 7100 * time.Microsecond, 4 * time.Millisecond,
			"kubelet-5000x200: p99 7.1 ms vs kube-apiserver 4.0 ms, ratio 1.77 (target <= kube-apiserver's + 3 ms, <= 7.0 ms): **missed**."},
		{"kube-apiserver past 100 ms: half", 90 * time.Millisecond, 150 * time.Millisecond,
			"kubelet-5000x200: p99 90.0 ms vs kube-apiserver 150.0 ms, ratio 0.60 (target <= 0.5x where kube-apiserver's passes 100 ms, <= 75.0 ms): **missed**."},
		{"kube-apiserver past 100 ms, halved", 70 * time.Millisecond, 150 * time.Millisecond,
			"kubelet-5000x200: p99 70.0 ms vs kube-apiserver 150.0 ms, ratio 0.47 (target <= 0.5x where kube-apiserver's passes 100 ms, <= 75.0 ms): met."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rp := &loadgen.Report{Workloads: []loadgen.Workload{w},
				Herald: map[string]*loadgen.Result{w.Name: run(tc.herald)}, Kube: map[string]*loadgen.Result{w.Name: run(tc.kube)}}
			lines := targets(rp)
			if !slices.Contains(lines, tc.want) {
				t.Errorf("no target line %q:\n%s", tc.want, strings.Join(lines, "\n"))
			}
		})
	}
}
