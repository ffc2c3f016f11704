package main

import (
	"testing"
	"time"

	"herald.dev/integration/loadgen"
)

// The scale-out workloads fit their processes, set their own replicas, and
// leave the load client only the watchers of the others.
func TestScaleOutWorkloads(t *testing.T) {
	ws := scaleOutWorkloads(time.Minute, 5*time.Second, 90*time.Second, "http1")
	for _, w := range ws {
		if err := loadgen.CheckWatcherProcs(w.Watchers, w.Procs); err != nil {
			t.Errorf("%s: %v", w.Name, err)
		}
		if !w.Kubelet || !w.Protobuf || w.KubeReplicas != 3 || heraldReplicas(w, 1) < 2 {
			t.Errorf("%s: %+v", w.Name, w)
		}
	}
	if ws[0].Name != "kubelet-50000x500-protobuf" || ws[0].Nodes != 50000 || ws[0].WritesPerSec != 500 {
		t.Errorf("first: %+v", ws[0])
	}
	all := append([]loadgen.Workload{{Name: "kubelet-5000x200", Watchers: 5000}}, ws...)
	if n := localWatchers(all); n != 5000 {
		t.Errorf("local watchers %d, want 5000", n)
	}
	if n := nodeUsers(all, 5000); n != 50000 {
		t.Errorf("node users %d, want 50000", n)
	}
	if heraldReplicas(all[0], 3) != 3 {
		t.Error("a workload without replicas of its own does not take -replicas")
	}
}

func TestPodSets(t *testing.T) {
	s := podSets{}
	a, b := s.get(10, 10, true), s.get(10, 10, false)
	if a == b || s.get(10, 10, true) != a || !a.Protobuf || b.Protobuf || a.Nodes != 10 || a.N != 10 {
		t.Errorf("pods by layout: %+v %+v", a, b)
	}
}
