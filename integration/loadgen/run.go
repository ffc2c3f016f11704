package loadgen

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Result is what one workload measured on one target.
type Result struct {
	Target, Workload string
	Watchers         int // streams that opened
	OpenFailures     int
	Ended            int    // streams that ended for good before the run did
	Resumes          int    // streams the server closed and the watcher resumed
	FirstError       string `json:",omitempty"`
	Writes           int
	WriteTime        time.Duration // first write to the last write's answer
	Window           time.Duration // first write to last delivery (or drain timeout)
	Deliveries       int
	Expected         int
	Missing          int
	Duplicates       int
	// Reordered: events a watcher received after one of a higher
	// revision (resumes included).
	Reordered     int
	Unexpected    int // events of revisions the writer did not make
	P50, P99, Max time.Duration
	// PutP50, PutP99: the writer's etcd Put round trips (etcd's commit,
	// part of every latency above).
	PutP50, PutP99 time.Duration
	// CPU in milliseconds during Window, per process, and the sum of the
	// target's processes.
	CPU       map[string]float64
	ServerCPU float64
	ClientCPU float64 // this process: writer and watchers
	// WriteCalls: write system calls during Window, per process, and the
	// sum of the target's processes (0 where /proc/<pid>/io is unreadable).
	WriteCalls       map[string]float64 `json:",omitempty"`
	ServerWriteCalls float64            `json:",omitempty"`
	// Wait: how long each process's threads were runnable but not
	// running during Window, in milliseconds, and Slices: how many times
	// they were put on a CPU (schedstat; a process whose figures cannot be
	// read is left out). Every hop an event crosses wakes a process, and
	// what it waits for a CPU is in the latency.
	Wait   map[string]float64 `json:",omitempty"`
	Slices map[string]float64 `json:",omitempty"`
	// Steal: the share of the machine's CPU time the hypervisor gave to
	// something else during Window (-1: not measured). It slows both
	// systems and varies from run to run.
	Steal float64
	// ClientBusy: ClientCPU over the window and the client's CPUs when it
	// was pinned to some (0: not pinned).
	ClientBusy float64 `json:",omitempty"`
	// Memory growth per idle watcher, in bytes, per measured process: Go
	// heap in use after GC, and RSS, from half the watchers open to all of
	// them, over the watchers the second half added (the slope).
	HeapPerWatcher map[string]float64
	RSSPerWatcher  map[string]float64
	// HeapFromNone: the heap's growth from no watchers to all of them,
	// over all of them (what the first watches allocate once included).
	HeapFromNone map[string]float64 `json:",omitempty"`
	// Stages: the target's per-hop latencies over the measured writes
	// (warm-up excluded; resumed watchers' catch-up included).
	Stages []StageLatency `json:",omitempty"`
	// Hops: the measured events' path, hop by hop, from their spans
	// (Target.Hops; nil when not traced).
	Hops *HopLatencies `json:",omitempty"`
	// Terminated: watches the target closed on its own over the whole
	// workload, opening and warm-up included (Target.Terminated; -1: not
	// measured).
	Terminated float64
	// History: the target's pods event history when the watchers opened
	// (Target.History; -1: not measured).
	History float64
	// Bytes: the event lines the watchers received for the measured
	// writes, in bytes (the JSON as it arrived, without HTTP or TLS
	// framing).
	Bytes int64
	ScaleOut
}

// BytesPerEvent is the average event line the watchers received.
func (r *Result) BytesPerEvent() float64 {
	if r.Deliveries == 0 {
		return 0
	}
	return float64(r.Bytes) / float64(r.Deliveries)
}

// OfferedShare is the share of the rate its writes offered that r
// delivered: DeliveriesPerSec over the events expected per second of
// writes (0: not measured). A system that keeps up delivers about 1 (its
// last deliveries trail the last write by a latency); one that falls
// behind, less.
func (r *Result) OfferedShare() float64 {
	if r.Expected == 0 || r.WriteTime <= 0 {
		return 0
	}
	return r.DeliveriesPerSec() / (float64(r.Expected) / r.WriteTime.Seconds())
}

// DeliveriesPerSec over the window.
func (r *Result) DeliveriesPerSec() float64 {
	if r.Window <= 0 {
		return 0
	}
	return float64(r.Deliveries) / r.Window.Seconds()
}

// WriteCallsPer1000 is the target's write system calls per 1,000
// deliveries; -1 (not measured) unless every process's count was read.
func (r *Result) WriteCallsPer1000() float64 {
	if len(r.WriteCalls) == 0 || len(r.WriteCalls) < len(r.CPU) {
		return -1
	}
	if r.Deliveries == 0 {
		return 0
	}
	return r.ServerWriteCalls / float64(r.Deliveries) * 1000
}

// WaitPer1000 is the target's run-queue wait, in milliseconds, per 1,000
// deliveries; -1 (not measured) unless every process's figures were read.
func (r *Result) WaitPer1000() float64 {
	if len(r.Wait) == 0 || len(r.Wait) < len(r.CPU) {
		return -1
	}
	if r.Deliveries == 0 {
		return 0
	}
	var sum float64
	for _, v := range r.Wait {
		sum += v
	}
	return sum / float64(r.Deliveries) * 1000
}

// CPUPer1000 is the target's CPU milliseconds per 1,000 deliveries.
func (r *Result) CPUPer1000() float64 {
	if r.Deliveries == 0 {
		return 0
	}
	return r.ServerCPU / float64(r.Deliveries) * 1000
}

// Runner runs workloads against one target over one etcd.
type Runner struct {
	Target *Target
	HTTP   *http.Client
	Etcd   *clientv3.Client
	Pods   *Pods
	Log    *slog.Logger
	// Metrics reads the target's Stages (admin ports); nil means
	// http.DefaultClient.
	Metrics *http.Client
	// Idle, when set, measures each server process's CPU over this long
	// with every watcher open and no writes (timers, bookmarks, keepalives,
	// metrics: what the servers cost a fleet of idle watchers), logged
	// before the warm-up.
	Idle time.Duration
	// IdleAfter, when set, logs each Mem process's heap in use (after a
	// forced GC) once the measured writes are delivered, with the
	// watchers still open, and again after this long without writes:
	// what a server keeps for a burst that is over.
	IdleAfter time.Duration
	// ClientCPUs: how many CPUs the load client was pinned to (CPUPlan; 0:
	// not pinned). A client busy on nearly all of them slows both systems'
	// deliveries alike; Run warns and the report says how busy it was.
	ClientCPUs int
	// WatcherProcArgv runs a child process that holds watchers (ServeWatchers),
	// for workloads with Procs; its log goes to WatcherProcDir.
	WatcherProcArgv []string
	WatcherProcDir  string
	children        []int // the current workload's watcher processes
	next            int   // next pod to write
}

// Run runs one workload: open the watchers idle (memory), write for
// w.Duration (latency, CPU), wait up to 15 s for the last events, close the
// watchers and check what each received.
func (r *Runner) Run(ctx context.Context, w Workload) (*Result, error) {
	t := r.Target
	if r.Metrics == nil {
		r.Metrics = http.DefaultClient
	}
	res := &Result{Target: t.Name, Workload: w.Name, CPU: map[string]float64{}, WriteCalls: map[string]float64{},
		Wait: map[string]float64{}, Slices: map[string]float64{}, Steal: -1,
		HeapPerWatcher: map[string]float64{}, RSSPerWatcher: map[string]float64{}, HeapFromNone: map[string]float64{}, Terminated: -1, History: -1}
	// Settle: the servers see the write rate for a while before any
	// watcher opens (see Workload.Settle).
	if w.Settle > 0 {
		r.Log.Info("settling: writing before the watchers open", "target", t.Name, "workload", w.Name, "for", w.Settle)
		settle, err := r.Pods.WriteFor(ctx, r.Etcd, w.WritesPerSec, w.Settle, r.next)
		r.next += len(settle)
		if err != nil {
			return nil, fmt.Errorf("settle: %w", err)
		}
	}
	cur, err := r.Etcd.Get(ctx, "/registry/pods/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return nil, err
	}
	rev0 := cur.Header.Revision
	if err := r.waitListed(ctx, rev0); err != nil {
		return nil, err
	}
	if t.OpenWatches != nil {
		// The previous workload's watchers must be gone before memory is
		// measured.
		for wait := time.Now().Add(30 * time.Second); time.Now().Before(wait); time.Sleep(250 * time.Millisecond) {
			if n, err := t.OpenWatches(ctx); err != nil || n == 0 {
				if err != nil {
					r.Log.Warn("open watches", "err", err)
				}
				break
			}
		}
	}
	heap0, rss0 := r.memory(ctx)
	if t.History != nil {
		if v, err := t.History(ctx); err == nil {
			res.History = v
		} else {
			r.Log.Warn("event history not measured", "target", t.Name, "err", err)
		}
	}
	var term0 float64
	if t.Terminated != nil {
		if v, err := t.Terminated(ctx); err == nil {
			term0, res.Terminated = v, 0
		} else {
			r.Log.Warn("terminated watchers not measured", "target", t.Name, "err", err)
		}
	}

	// Open the watchers, 64 at a time (in each process holding them), in
	// two halves: memory per idle watcher is what the second half adds
	// (see below).
	specs := watcherSpecs(t, w, r.Pods.Nodes)
	set, err := r.watchSet(ctx, w, specs, rev0)
	if err != nil {
		return nil, err
	}
	defer set.close()
	r.children = set.pids()
	res.ClientProcs = len(r.children)
	openStart := time.Now()
	var openErr error
	open := func(from, to int) {
		failed, first, err := set.open(from, to)
		res.OpenFailures += failed
		if res.FirstError == "" {
			res.FirstError = first
		}
		openErr = cmp.Or(openErr, err)
	}
	// Memory per idle watcher is the slope: the growth from half the
	// watchers open to all of them, over the watchers the second half
	// added. What the first watches allocate once (pools, lazily built
	// state, a server's first connections) is not any watch's; from no
	// watchers at all it would be spread over them, more thinly the more
	// there are. The growth from none is kept too (HeapFromNone).
	half := w.Watchers / 2
	if w.Fleet {
		half = 0 // all at once, and no memory measured (Workload.Fleet)
	}
	open(0, half)
	took := time.Since(openStart)
	failedFirst := res.OpenFailures
	heapHalf, rssHalf := heap0, rss0
	heldHalf := map[string]float64{}
	for name := range heap0 {
		heldHalf[name] = 0
	}
	if half > 0 {
		time.Sleep(3 * time.Second) // let the servers settle
		heapHalf, rssHalf = r.memory(ctx)
		heldHalf = r.held(ctx, half-res.OpenFailures)
	}
	secondStart := time.Now()
	open(half, w.Watchers)
	took += time.Since(secondStart)
	if openErr != nil {
		return nil, openErr
	}
	res.OpenTime = took
	res.Watchers = w.Watchers - res.OpenFailures
	r.Log.Info("watchers open", "target", t.Name, "workload", w.Name, "connections", w.Connections(), "open", res.Watchers, "failed", res.OpenFailures, "took", took.Round(time.Millisecond))
	var heap1, rss1 map[string]uint64
	var held map[string]float64
	if !w.Fleet {
		time.Sleep(3 * time.Second) // let the servers settle
		heap1, rss1 = r.memory(ctx)
		held = r.held(ctx, res.Watchers)
		r.etcdWatches(ctx, res)
		if t.IdleProfile != nil {
			t.IdleProfile(ctx)
		}
	}
	for name, h := range heap1 {
		// Each figure only from what was read: a process whose heap or
		// watch count is missing at a point has none from that point.
		if h0, ok := heap0[name]; ok && held[name] > 0 {
			res.HeapFromNone[name] = (float64(h) - float64(h0)) / held[name]
		}
		hh, okHeap := heapHalf[name]
		nh, okHeld := heldHalf[name]
		added := held[name] - nh
		if !okHeap || !okHeld || added <= 0 {
			r.Log.Warn("memory per idle watcher not measured", "process", name, "heapRead", okHeap, "watchersRead", okHeld, "watchersAdded", added)
			continue
		}
		res.HeapPerWatcher[name] = (float64(h) - float64(hh)) / added
		res.RSSPerWatcher[name] = (float64(rss1[name]) - float64(rssHalf[name])) / added
	}
	res.HeapTotalPerWatcher, res.RSSTotalPerWatcher = totalPerWatcher(heapHalf, heap1, rssHalf, rss1, float64(res.Watchers-(half-failedFirst)))

	if r.Idle > 0 && !w.Fleet {
		c0 := r.cpu()
		time.Sleep(r.Idle)
		c1 := r.cpu()
		idle := map[string]float64{}
		for name, v := range c1 {
			idle[name] = v - c0[name]
		}
		r.Log.Info("idle CPU by process (ms)", "target", t.Name, "workload", w.Name, "over", r.Idle, "cpu", idle)
	}

	// Warm up: the same writes for a few seconds, not measured, so that
	// servers that size per-watcher buffers from the recent event rate
	// (kube-apiserver's cacher: about a second of history) see the rate.
	if w.Warmup > 0 {
		warm, err := r.Pods.WriteFor(ctx, r.Etcd, w.WritesPerSec, w.Warmup, r.next)
		r.next += len(warm)
		if err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}
	// Write, measuring CPU from the first write to the last delivery.
	stages0 := make([]histogram, len(t.Stages))
	for i, st := range t.Stages {
		h, err := readHistogram(ctx, r.Metrics, st)
		if err != nil {
			r.Log.Warn("stage latency not measured", "stage", st.Name, "err", err)
		}
		stages0[i] = h
	}
	cpu0, writes0, sched0 := r.cpu(), r.writeCalls(), r.sched()
	ticks0, ticksErr := ReadMachineTicks()
	start := time.Now()
	if t.Hops != nil {
		t.Hops.Since(start)
	}
	if t.Profile != nil {
		go t.Profile(ctx, w.Duration)
	}
	writes, werr := r.Pods.WriteFor(ctx, r.Etcd, w.WritesPerSec, w.Duration, r.next)
	res.WriteTime = time.Since(start)
	r.next += len(writes)
	res.Writes = len(writes)
	if n := len(writes); n > 0 {
		took := make([]time.Duration, n)
		for i, wr := range writes {
			took[i] = wr.Took
		}
		slices.Sort(took)
		res.PutP50, res.PutP99 = took[n/2], took[min(n*99/100, n-1)]
	}
	slices.SortFunc(writes, func(a, b Write) int { return int(a.Rev - b.Rev) })
	byNode := map[int][]int64{}
	var all []int64
	for _, wr := range writes {
		all = append(all, wr.Rev)
		if w.Kubelet {
			n := int(wr.Pod) % r.Pods.Nodes
			byNode[n] = append(byNode[n], wr.Rev)
		}
	}
	expect := func(node int) []int64 {
		if node < 0 {
			return all
		}
		return byNode[node]
	}
	lastAt, err := set.drain(func(i int) int64 {
		if e := expect(specs[i].Node); len(e) > 0 {
			return e[len(e)-1]
		}
		return 0
	}, time.Now().Add(15*time.Second))
	if err != nil {
		return nil, err
	}
	end := time.Now()
	if lastAt > start.UnixNano() {
		end = time.Unix(0, lastAt)
	}
	res.Window = end.Sub(start)
	cpu1 := r.cpu()
	for name, v := range cpu1 {
		res.CPU[name] = v - cpu0[name]
		if name != "client" {
			res.ServerCPU += res.CPU[name]
		}
	}
	res.ClientCPU = res.CPU["client"]
	delete(res.CPU, "client")
	for name, v := range r.writeCalls() {
		res.WriteCalls[name] = v - writes0[name]
		res.ServerWriteCalls += res.WriteCalls[name]
	}
	for name, v := range r.sched() {
		s0, ok := sched0[name]
		if !ok {
			continue
		}
		if v.Wait < s0.Wait || v.Slices < s0.Slices {
			// Threads that ended took their figures with them.
			r.Log.Warn("scheduling figures went down over the window: not measured", "process", name)
			continue
		}
		res.Wait[name] = float64((v.Wait - s0.Wait).Milliseconds())
		res.Slices[name] = v.Slices - s0.Slices
	}
	if ticks1, err := ReadMachineTicks(); err == nil && ticksErr == nil {
		res.Steal = StealShare(ticks0, ticks1)
	}
	if r.ClientCPUs > 0 && res.Window > 0 {
		res.ClientBusy = res.ClientCPU / (float64(res.Window.Milliseconds()) * float64(r.ClientCPUs))
		if res.ClientBusy > 0.8 {
			r.Log.Warn("the load client was busy on its CPUs: its own delays are in both systems' latencies", "target", t.Name, "workload", w.Name, "busy", fmt.Sprintf("%.0f%%", 100*res.ClientBusy), "cpus", r.ClientCPUs)
		}
	}
	if t.Hops != nil {
		// The processes export their spans in batches after the events.
		t.Hops.Wait(ctx, len(writes), 2*time.Second)
		res.Hops = t.Hops.Latencies()
	}
	for i, st := range t.Stages {
		h, err := readHistogram(ctx, r.Metrics, st)
		if err != nil || len(stages0[i].counts) == 0 {
			continue
		}
		d := h.since(stages0[i])
		res.Stages = append(res.Stages, StageLatency{Name: st.Name, Count: uint64(d.counts[len(d.counts)-1]), P50: d.quantile(0.5), P99: d.quantile(0.99)})
	}
	if r.IdleAfter > 0 {
		heaps := func() map[string]uint64 {
			out := map[string]uint64{}
			for _, m := range t.Mem {
				if h, err := m.Heap(ctx); err == nil {
					out[m.Name] = h
				}
			}
			return out
		}
		after := heaps()
		time.Sleep(r.IdleAfter)
		r.Log.Info("heap in use by process (bytes), after the writes and after idle", "target", t.Name, "workload", w.Name, "over", r.IdleAfter, "after", after, "idle", heaps())
	}
	if res.Terminated >= 0 {
		if v, err := t.Terminated(ctx); err == nil {
			res.Terminated = v - term0
		} else {
			res.Terminated = -1
		}
	}
	ws, err := set.close()
	if err != nil {
		return nil, err
	}

	// Check every watcher against the writes it should have seen.
	var lat []int32
	from := int64(0)
	if len(all) > 0 {
		from = all[0]
	}
	for _, x := range ws {
		if x == nil {
			continue // never opened: the run ended early
		}
		// Only the measured writes count; drop the warm-up's events.
		i := 0
		for i < len(x.revs) && x.revs[i] < from {
			i++
		}
		x.revs, x.lat, x.size = x.revs[i:], x.lat[i:], x.size[i:]
		for _, n := range x.size {
			res.Bytes += int64(n)
		}
		if x.err != nil && !x.openFailed {
			res.Ended++
			if res.FirstError == "" {
				res.FirstError = x.err.Error()
			}
		}
		res.Resumes += x.resumes
		e := expect(x.node)
		res.Expected += len(e)
		res.Deliveries += len(x.revs)
		miss, dup, unexp := compare(e, x.revs)
		res.Reordered += reordered(x.revs)
		res.Missing += miss
		res.Duplicates += dup
		res.Unexpected += unexp
		lat = append(lat, x.lat...)
	}
	slices.Sort(lat)
	if n := len(lat); n > 0 {
		us := func(v int32) time.Duration { return time.Duration(v) * time.Microsecond }
		res.P50, res.P99, res.Max = us(lat[n/2]), us(lat[min(n*99/100, n-1)]), us(lat[n-1])
	}
	return res, werr
}

// reordered counts the events received after one of a higher revision.
func reordered(got []int64) int {
	n := 0
	var top int64
	for _, r := range got {
		if r < top {
			n++
		}
		top = max(top, r)
	}
	return n
}

func closed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// compare counts, for one watcher, expected revisions it did not receive,
// revisions it received more than once, and revisions nobody wrote.
func compare(expected, got []int64) (missing, dup, unexpected int) {
	g := slices.Clone(got)
	slices.Sort(g)
	i, j := 0, 0
	for i < len(expected) || j < len(g) {
		switch {
		case j < len(g) && j > 0 && g[j] == g[j-1]:
			dup++
			j++
		case j >= len(g) || i < len(expected) && expected[i] < g[j]:
			missing++
			i++
		case i >= len(expected) || g[j] < expected[i]:
			unexpected++
			j++
		default:
			i++
			j++
		}
	}
	return missing, dup, unexpected
}

func (r *Runner) cpu() map[string]float64 {
	out := map[string]float64{}
	for _, p := range r.Target.CPU {
		v, err := CPUMillis(p.Pid)
		if err != nil {
			r.Log.Warn("cpu", "process", p.Name, "err", err)
		}
		out[p.Name] = v
	}
	out["client"], _ = CPUMillis(os.Getpid())
	for _, pid := range r.children {
		v, err := CPUMillis(pid)
		if err != nil {
			r.Log.Warn("cpu", "process", "watchers", "pid", pid, "err", err)
		}
		out["client"] += v
	}
	return out
}

// sched reads the target's processes' scheduling so far.
func (r *Runner) sched() map[string]Sched { return readEach(r, "scheduling figures", ReadSched) }

// writeCalls reads the target's processes' write system calls so far.
func (r *Runner) writeCalls() map[string]float64 {
	return readEach(r, "write system calls", WriteCalls)
}

// readEach reads one figure of each of the target's processes; a process
// whose figure cannot be read is left out (logged), not counted as 0.
func readEach[T any](r *Runner, what string, read func(pid int) (T, error)) map[string]T {
	out := map[string]T{}
	for _, p := range r.Target.CPU {
		v, err := read(p.Pid)
		if err != nil {
			r.Log.Warn(what, "process", p.Name, "err", err)
			continue
		}
		out[p.Name] = v
	}
	return out
}

func (r *Runner) memory(ctx context.Context) (heap, rss map[string]uint64) {
	heap, rss = map[string]uint64{}, map[string]uint64{}
	for _, m := range r.Target.Mem {
		h, err := m.Heap(ctx)
		if err != nil {
			// Left out: a missing figure is not a zero.
			r.Log.Warn("heap", "process", m.Name, "err", err)
			continue
		}
		heap[m.Name] = h
		rss[m.Name], _ = RSSBytes(m.Pid)
	}
	return heap, rss
}

// held returns, per measured process, how many of the open watchers it
// holds (MemProc.Watchers; all of them when not set). A process whose count
// cannot be read is left out.
func (r *Runner) held(ctx context.Context, open int) map[string]float64 {
	out := map[string]float64{}
	for _, m := range r.Target.Mem {
		n := float64(open)
		if m.Watchers != nil {
			v, err := m.Watchers(ctx)
			if err != nil {
				r.Log.Warn("watchers held", "process", m.Name, "err", err)
				continue
			}
			n = v
		}
		out[m.Name] = n
	}
	return out
}

// String is a one-line summary for logs.
func (r *Result) String() string {
	traced := ""
	if r.Hops != nil {
		traced = ", traced: " + r.Hops.String()
	}
	return fmt.Sprintf("%s %s: %d watchers (%d failed, %d ended, %d resumes, %.0f terminated by the server), history %.0f, %.0f bytes/event, %d writes, %d/%d delivered (%.0f/s), missing %d, dup %d, reordered %d, unexpected %d, p50 %s p99 %s max %s, server CPU %.0f ms (%.2f ms/1k), client CPU %.0f ms",
		r.Target, r.Workload, r.Watchers, r.OpenFailures, r.Ended, r.Resumes, r.Terminated, r.History, r.BytesPerEvent(), r.Writes, r.Deliveries, r.Expected, r.DeliveriesPerSec(),
		r.Missing, r.Duplicates, r.Reordered, r.Unexpected, r.P50, r.P99, r.Max, r.ServerCPU, r.CPUPer1000(), r.ClientCPU) + fmt.Sprintf(", etcd Put p50 %s p99 %s, CPU by process %v, write calls by process %v, run-queue wait by process %v, slices by process %v, steal %.3f, stages %+v", r.PutP50, r.PutP99, r.CPU, r.WriteCalls, r.Wait, r.Slices, r.Steal, r.Stages) + traced
}
