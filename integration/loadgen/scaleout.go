package loadgen

import (
	"context"
	"fmt"
	"time"
)

// ScaleOutWorkload are the settings of a workload whose watchers one
// process cannot hold (a process's open file limit, an address's
// ephemeral ports), nor one server process serve.
type ScaleOutWorkload struct {
	// Procs, when > 0, spreads the watchers over that many child
	// processes of the load client (Runner.WatcherProcArgv), each dialing from a
	// source address of its own; 0: this process holds them.
	Procs int `json:",omitempty"`
	// Nodes, when > 0, is how many nodes (and pods, one each) the
	// workload's pods lay out over; 0: the run's default.
	Nodes int `json:",omitempty"`
	// KubeReplicas, when > 1, is how many kube-apiservers serve the
	// watchers, each its own process with its own watch cache and its own
	// etcd watches, on one etcd, as a cluster scales them out.
	KubeReplicas int `json:",omitempty"`
}

// ScaleOut is what a run measures of opening many watchers, beyond the
// per-process memory of Result.
type ScaleOut struct {
	// OpenTime: from the first watch opened to the last, both halves
	// (without the memory readings between them).
	OpenTime time.Duration
	// ClientProcs: the child processes that held the watchers (0: the
	// load client itself); ClientCPU is theirs and its own.
	ClientProcs int `json:",omitempty"`
	// HeapTotalPerWatcher, RSSTotalPerWatcher: the growth of every
	// measured process together, from half the watchers open to all of
	// them, over the watchers the second half added (-1: not measured).
	HeapTotalPerWatcher, RSSTotalPerWatcher float64
	// EtcdWatchStreams, EtcdWatchers: the target's etcd's gRPC watch
	// streams and watchers with every watcher open
	// (etcd_debugging_mvcc_watch_stream_total, _watcher_total, summed over
	// Target.EtcdMetrics; -1: not measured).
	EtcdWatchStreams, EtcdWatchers float64
}

// watchSet holds w's watchers: in child processes when w.Procs > 0,
// otherwise in this process.
func (r *Runner) watchSet(ctx context.Context, w Workload, specs []watcherSpec, rev0 int64) (watchSet, error) {
	if w.Procs == 0 {
		return newLocalSet(ctx, r.Target.CAFile, w, specs, nil, rev0)
	}
	if len(r.WatcherProcArgv) == 0 {
		return nil, fmt.Errorf("workload %s: %d watcher processes, and no command to run them (Runner.WatcherProcArgv)", w.Name, w.Procs)
	}
	return startWatcherProcs(r.WatcherProcArgv, r.WatcherProcDir, w.Procs, r.Target.CAFile, w, specs, rev0)
}

// etcdWatches reads the target's etcd watch streams and watchers into res.
func (r *Runner) etcdWatches(ctx context.Context, res *Result) {
	res.EtcdWatchStreams, res.EtcdWatchers = -1, -1
	if len(r.Target.EtcdMetrics) == 0 {
		return
	}
	var streams, watchers float64
	for _, base := range r.Target.EtcdMetrics {
		s, err := MetricSum(ctx, r.Metrics, base, "", "etcd_debugging_mvcc_watch_stream_total")
		if err != nil {
			r.Log.Warn("etcd watch streams not measured", "etcd", base, "err", err)
			return
		}
		w, err := MetricSum(ctx, r.Metrics, base, "", "etcd_debugging_mvcc_watcher_total")
		if err != nil {
			r.Log.Warn("etcd watchers not measured", "etcd", base, "err", err)
			return
		}
		streams, watchers = streams+s, watchers+w
	}
	res.EtcdWatchStreams, res.EtcdWatchers = streams, watchers
	r.Log.Info("etcd watches with every watcher open", "target", r.Target.Name, "streams", streams, "watchers", watchers)
}

// totalPerWatcher is the growth of every process's heap and RSS together,
// from half (heap0, rss0) to all (heap1, rss1), over added watchers; a
// process missing from either heap reading is left out of both sums, and
// with none, or no watchers added, -1.
func totalPerWatcher(heap0, heap1, rss0, rss1 map[string]uint64, added float64) (heap, rss float64) {
	heap, rss = -1, -1
	if added <= 0 {
		return heap, rss
	}
	var dh, dr float64
	n := 0
	for name, h1 := range heap1 {
		h0, ok := heap0[name]
		if !ok {
			continue
		}
		dh += float64(h1) - float64(h0)
		dr += float64(rss1[name]) - float64(rss0[name])
		n++
	}
	if n == 0 {
		return heap, rss
	}
	return dh / added, dr / added
}

// waitListed waits until a LIST through every one of the target's
// servers reflects rev: a replica whose cache lags would make a watch
// from rev wait, or refuse it.
func (r *Runner) waitListed(ctx context.Context, rev int64) error {
	urls := r.Target.BaseURLs
	if len(urls) == 0 {
		urls = []string{r.Target.BaseURL}
	}
	for _, u := range urls {
		t := *r.Target
		t.BaseURL = u
		if err := WaitListRV(ctx, r.HTTP, &t, rev, 60*time.Second); err != nil {
			return err
		}
	}
	return nil
}
