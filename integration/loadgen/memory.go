package loadgen

import (
	"context"
	"fmt"
	"net/http"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Memory is what holding pods costs one system: the growth of one
// process's Go heap in use after a forced GC (and of its RSS) between an
// empty etcd and Pods pods loaded and served, per 10,000 pods. The growth
// includes the event history the process keeps of the load (Herald's
// cache: its window, 1,000 events by default; kube-apiserver: its watch
// cache's history, History).
type Memory struct {
	Target, Process string
	Encoding        string // "JSON" or "protobuf": how the pods are stored in etcd
	Pods            int
	HeapPer10k      float64 // bytes
	RSSPer10k       float64 // bytes
	// History: kube-apiserver's pods watch cache capacity after the load
	// (-1: not measured).
	History float64
	Err     string `json:",omitempty"`
}

// MeasureMemory measures proc of t holding pods: heap and RSS with etcd
// empty, then pods loaded into etcd through cli and served by t (a LIST
// through t at the load's revision), then heap and RSS again.
func MeasureMemory(ctx context.Context, c *http.Client, t *Target, cli *clientv3.Client, pods *Pods, proc MemProc) (*Memory, error) {
	m := &Memory{Target: t.Name, Process: proc.Name, Encoding: pods.Encoding(), Pods: pods.N, History: -1}
	time.Sleep(2 * time.Second) // let the servers settle after their start, as after the load
	heap0, err := proc.Heap(ctx)
	if err != nil {
		return m, fmt.Errorf("heap before the load: %w", err)
	}
	rss0, _ := RSSBytes(proc.Pid)
	rev, err := pods.Load(ctx, cli)
	if err != nil {
		return m, fmt.Errorf("loading %d pods: %w", pods.N, err)
	}
	if err := WaitListRV(ctx, c, t, rev, 2*time.Minute); err != nil {
		return m, err
	}
	time.Sleep(2 * time.Second) // let the servers settle, as before idle memory (Runner.Run)
	heap1, err := proc.Heap(ctx)
	if err != nil {
		return m, fmt.Errorf("heap after the load: %w", err)
	}
	rss1, _ := RSSBytes(proc.Pid)
	per10k := func(a, b uint64) float64 { return (float64(b) - float64(a)) / float64(pods.N) * 10000 }
	m.HeapPer10k, m.RSSPer10k = per10k(heap0, heap1), per10k(rss0, rss1)
	if t.History != nil {
		if v, err := t.History(ctx); err == nil {
			m.History = v
		}
	}
	return m, nil
}
