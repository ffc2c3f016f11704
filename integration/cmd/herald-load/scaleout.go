package main

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"herald.dev/integration/loadgen"
)

// scaleOutWorkloads are the workloads whose watchers no one process holds:
// the load client spreads them over child processes (`herald-load
// watchers`), Herald runs several fanout and frontdoor replicas and
// kube-apiserver several replicas on its one etcd. Not in the default set.
func scaleOutWorkloads(kubeletDuration, warmup, settle time.Duration, proto string) []loadgen.Workload {
	w := func(name string, watchers, perSec, nodes, procs, replicas int) loadgen.Workload {
		return loadgen.Workload{Name: name, Watchers: watchers, WritesPerSec: perSec, Kubelet: true, Protobuf: true, Proto: proto,
			Duration: kubeletDuration, Warmup: warmup, Settle: settle, Replicas: replicas,
			ScaleOutWorkload: loadgen.ScaleOutWorkload{Procs: procs, Nodes: nodes, KubeReplicas: 3}}
	}
	return []loadgen.Workload{
		// 50,000 kubelets, one node each and a pod on every node: 4
		// processes of 12,500 watchers each; 6 frontdoors, as a frontdoor
		// holds at most 10,000 watches by default (-max-watches; fanout
		// 20,000).
		w("kubelet-50000x500-protobuf", 50000, 500, 50000, 4, 6),
		// The same path at a scale a shared machine runs in a minute.
		w("kubelet-2000x50-protobuf-scaleout", 2000, 50, 0, 2, 2),
	}
}

// heraldReplicas is how many fanout and frontdoor processes Herald runs
// for w (-replicas, unless w sets its own).
func heraldReplicas(w loadgen.Workload, flag int) int {
	if w.Replicas > 0 {
		return w.Replicas
	}
	return flag
}

// localWatchers is the most watchers this process itself holds over
// workloads: those of a workload with watcher processes are theirs.
func localWatchers(workloads []loadgen.Workload) int {
	n := 0
	for _, w := range workloads {
		if w.Procs == 0 {
			n = max(n, w.Watchers)
		}
	}
	return n
}

// nodeUsers is how many node users the token file needs: one per node of
// every workload.
func nodeUsers(workloads []loadgen.Workload, nodes int) int {
	for _, w := range workloads {
		nodes = max(nodes, w.Nodes)
	}
	return nodes
}

// podSets keeps the pods of each layout, built once per run.
type podSets map[[3]int]*loadgen.Pods

func (s podSets) get(n, nodes int, protobuf bool) *loadgen.Pods {
	key := [3]int{n, nodes, 0}
	if protobuf {
		key[2] = 1
	}
	if p, ok := s[key]; ok {
		return p
	}
	p := loadgen.NewPods(n, nodes)
	if protobuf {
		p = loadgen.NewProtobufPods(n, nodes)
	}
	s[key] = p
	return p
}

// kubeReplica is a kube-apiserver of a target, by the name the report
// gives it.
type kubeReplica struct {
	name string
	k    *loadgen.KubeAPIServer
}

// scaleKubeTarget makes t, whose first kube-apiserver is ks[0], serve
// through every one of ks: watchers round-robin over them, each
// process's CPU and memory per watch it holds, open and terminated
// watches summed.
func scaleKubeTarget(t *loadgen.Target, ks []kubeReplica, c *http.Client, admin string) {
	t.BaseURLs = nil
	t.Mem = nil
	for _, r := range ks {
		t.BaseURLs = append(t.BaseURLs, r.k.URL)
		if r.name != ks[0].name {
			t.CPU = append(t.CPU, loadgen.NamedPid{Name: r.name, Pid: r.k.Pid()})
		}
		t.Mem = append(t.Mem, loadgen.MemProc{Name: r.name, Pid: r.k.Pid(), Heap: loadgen.HeapFromMetrics(c, r.k.URL, admin),
			Watchers: func(ctx context.Context) (float64, error) { return kubeWatches(ctx, c, r.k.URL, admin) }})
	}
	t.OpenWatches = func(ctx context.Context) (float64, error) {
		return sumKube(ctx, ks, func(k *loadgen.KubeAPIServer) (float64, error) { return kubeWatches(ctx, c, k.URL, admin) })
	}
	t.Terminated = func(ctx context.Context) (float64, error) {
		return sumKube(ctx, ks, func(k *loadgen.KubeAPIServer) (float64, error) { return kubeTerminated(ctx, c, k.URL, admin) })
	}
}

func sumKube(ctx context.Context, ks []kubeReplica, f func(k *loadgen.KubeAPIServer) (float64, error)) (float64, error) {
	var sum float64
	for _, r := range ks {
		v, err := f(r.k)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", r.name, err)
		}
		sum += v
	}
	return sum, nil
}

// kubeWatches is how many pods watches a kube-apiserver serves.
func kubeWatches(ctx context.Context, c *http.Client, url, admin string) (float64, error) {
	return loadgen.MetricSum(ctx, c, url, admin, "apiserver_longrunning_requests", `resource="pods"`, `verb="WATCH"`)
}

// kubeTerminated is how many pods watches a kube-apiserver closed on its
// own.
func kubeTerminated(ctx context.Context, c *http.Client, url, admin string) (float64, error) {
	v, err := loadgen.MetricSum(ctx, c, url, admin, "apiserver_terminated_watchers_total", `resource="pods"`)
	if err != nil && strings.Contains(err.Error(), "no apiserver_terminated_watchers_total") {
		return 0, nil // a counter with no samples yet
	}
	return v, err
}

// startKubeReplicas starts kube-apiserver-1 to -(n-1), each in a directory
// of its own under dir, with start (the first is already running); stop
// stops them.
func startKubeReplicas(n int, dir string, start func(dir string) (*loadgen.KubeAPIServer, error)) (ks []kubeReplica, stop func(), err error) {
	stop = func() {
		for _, r := range ks {
			r.k.Stop()
		}
	}
	for j := 1; j < n; j++ {
		k, err := start(filepath.Join(dir, fmt.Sprintf("kube-apiserver-%d", j)))
		if err != nil {
			stop()
			return nil, nil, fmt.Errorf("kube-apiserver-%d: %w", j, err)
		}
		ks = append(ks, kubeReplica{fmt.Sprintf("kube-apiserver-%d", j), k})
	}
	return ks, stop, nil
}
