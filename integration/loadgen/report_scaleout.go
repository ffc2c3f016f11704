package loadgen

import (
	"fmt"
	"io"
)

// writeScaleOut writes, for a workload whose watchers run in child
// processes or whose kube-apiserver is replicated, how each system held
// them: the processes, the time to open them, memory per watch of every
// server process together, and the watches on etcd.
func writeScaleOut(w io.Writer, wl Workload, h, k *Result) {
	if wl.Procs == 0 && wl.KubeReplicas <= 1 {
		return
	}
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	kube := max(wl.KubeReplicas, 1)
	p("Scale-out: Herald with %d fanout and %d frontdoor replicas, one ingest and one cache; %d kube-apiserver replicas on one etcd, each with its own watch cache and etcd watches; watchers round-robin over each system's frontdoors or kube-apiservers. ", max(wl.Replicas, 1), max(wl.Replicas, 1), kube)
	if wl.Procs > 0 {
		p("The load client's watchers ran in %d child processes, each dialing from its own address of 127.0.0.0/8 (the parent writes and checks; their CPU is the load client's). ", wl.Procs)
	}
	p("Memory per watch of every server process together: the growth of their heaps (RSS) from half the watches open to all of them, over the watches the second half added; per process in the lines above. etcd's watch streams and watchers are etcd's own gauges (etcd_debugging_mvcc_watch_stream_total, _watcher_total) with every watch open.\n\n")
	p("| scale-out | Herald | kube-apiserver |\n|---|---:|---:|\n")
	row := func(name string, f func(r *Result) float64, format string) {
		cell := func(r *Result) string {
			if r == nil || f(r) < 0 {
				return "not measured"
			}
			return fmt.Sprintf(format, f(r))
		}
		p("| %s | %s | %s |\n", name, cell(h), cell(k))
	}
	row("load client watcher processes", func(r *Result) float64 { return float64(r.ClientProcs) }, "%.0f")
	row("time to open every watch (s, first to last, both halves)", func(r *Result) float64 { return r.OpenTime.Seconds() }, "%.1f")
	row("heap per watch, every server process (KB)", func(r *Result) float64 { return kb(r.HeapTotalPerWatcher) }, "%.1f")
	row("RSS per watch, every server process (KB)", func(r *Result) float64 { return kb(r.RSSTotalPerWatcher) }, "%.1f")
	row("etcd watch streams", func(r *Result) float64 { return r.EtcdWatchStreams }, "%.0f")
	row("etcd watchers", func(r *Result) float64 { return r.EtcdWatchers }, "%.0f")
	p("\n")
}

// kb keeps a negative (not measured) figure negative.
func kb(v float64) float64 {
	if v < 0 {
		return v
	}
	return v / 1000
}

// kubeProcesses says how many kube-apiservers w runs.
func kubeProcesses(w Workload) string {
	if w.KubeReplicas > 1 {
		return fmt.Sprintf("%d kube-apiservers on one etcd, watchers round-robin over them", w.KubeReplicas)
	}
	return "kube-apiserver one process"
}
