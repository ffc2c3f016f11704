package containers

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"herald.dev/integration/checker"
)

// TestCluster starts the topology once and runs every fault scenario on it
// in turn. Each scenario starts its own writer and clients and checks them
// against etcd's history; a scenario leaves the cluster whole again.
func TestCluster(t *testing.T) {
	c := startCluster(t)
	for _, sc := range []struct {
		name  string
		fault func(t *testing.T, ctx context.Context, c *cluster, s *scenario)
	}{
		{"KillIngestLeader", killIngestLeader},
		{"KillCacheReplica", killCacheReplica},
		{"KillFanoutReplica", killFanoutReplica},
		{"RestartNATSNode", restartNATSNode},
		{"KillEtcdMember", killEtcdMember},
		{"PartitionFanout", partitionFanout},
		{"RollingRestart", rollingRestart},
		{"ScaleFanout", scaleFanout},
	} {
		if !t.Run(sc.name, func(t *testing.T) { c.run(t, sc.fault) }) {
			return // the cluster may not be whole: later scenarios would only add noise
		}
	}
	t.Run("RelistStorm", func(t *testing.T) { relistStorm(t, c) }) // its own clients: see relist_test.go
}

// scenario is the churn and the clients of one fault scenario.
type scenario struct {
	c        *cluster
	from     int64
	ctx      context.Context
	mu       sync.Mutex
	watchers []*watcher
	wg       sync.WaitGroup
}

// addWatcher starts one more resuming client from rv.
func (s *scenario) addWatcher(name string, prefer int, rv int64) *watcher {
	w := newWatcher(s.c, name, prefer, rv)
	s.mu.Lock()
	s.watchers = append(s.watchers, w)
	s.mu.Unlock()
	s.wg.Add(1)
	go func() { defer s.wg.Done(); w.run(s.ctx) }()
	return w
}

// advance waits until every client has seen n more events than now: the
// pipeline is flowing end to end.
func (s *scenario) advance(t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	s.mu.Lock()
	ws := append([]*watcher(nil), s.watchers...)
	s.mu.Unlock()
	start := make([]int, len(ws))
	for i, w := range ws {
		start[i], _ = w.progress()
	}
	waitFor(t, timeout, fmt.Sprintf("every client to see %d more events", n), func() bool {
		for i, w := range ws {
			if got, _ := w.progress(); got < start[i]+n {
				return false
			}
		}
		return true
	})
}

// run is one scenario: churn and two clients (one per frontdoor), the
// fault, churn on after it heals, then every client checked against etcd.
func (c *cluster) run(t *testing.T, fault func(t *testing.T, ctx context.Context, c *cluster, s *scenario)) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	wctx, stopWatchers := context.WithCancel(ctx)
	s := &scenario{c: c, ctx: wctx, from: currentRevision(t, ctx, c.etcd)}
	t.Cleanup(func() { stopWatchers(); s.wg.Wait() })
	s.addWatcher("client-a", 0, s.from)
	s.addWatcher("client-b", 1, s.from)

	cctx, stopChurn := context.WithCancel(ctx)
	churned := make(chan struct{})
	go func() { defer close(churned); churn(cctx, c.etcd, 20*time.Millisecond) }()
	defer func() { stopChurn(); <-churned }()

	s.advance(t, 100, time.Minute)
	fault(t, ctx, c, s)
	s.advance(t, 200, 2*time.Minute)
	stopChurn()
	<-churned

	last := currentRevision(t, ctx, c.etcd)
	s.mu.Lock()
	ws := append([]*watcher(nil), s.watchers...)
	s.mu.Unlock()
	waitFor(t, 2*time.Minute, fmt.Sprintf("every client to reach revision %d", last), func() bool {
		for _, w := range ws {
			if _, rv := w.progress(); rv < last {
				return false
			}
		}
		return true
	})
	stopWatchers()
	s.wg.Wait()

	for _, w := range ws {
		want, err := expectedEvents(ctx, c.etcd, w.from, last)
		if err != nil {
			t.Fatalf("etcd history: %v", err)
		}
		v := w.judge(want, last)
		t.Logf("%s: %v", w.name, v)
		if !v.ok() {
			for _, err := range v.errs {
				t.Errorf("%s: %v", w.name, err)
			}
			for _, err := range checker.Compare(streamOf(want), streamOf(w.upTo(last))) {
				t.Errorf("%s: %v", w.name, err)
			}
			t.Errorf("%s: %v", w.name, v)
		}
		if len(want) < 300 {
			t.Errorf("%s: only %d changes in the scenario; the churn did not run", w.name, len(want))
		}
		if lo, hi := byHalf(want); lo == 0 || hi == 0 {
			t.Errorf("%s: %d changes in partitions 0-7, %d in 8-15: the churn must cross both cache shards", w.name, lo, hi)
		}
	}
}

// leader polls the ingest replicas until exactly one says it leads.
func leader(t *testing.T, ctx context.Context, c *cluster) *node {
	t.Helper()
	var lead *node
	waitFor(t, 30*time.Second, "exactly one ingest leader", func() bool {
		lead = nil
		count := 0
		for _, n := range c.group("ingest") {
			if v, err := n.metric(ctx, "herald_ingest_leader"); err == nil && v == 1 {
				lead, count = n, count+1
			}
		}
		return count == 1
	})
	return lead
}

func killIngestLeader(t *testing.T, ctx context.Context, c *cluster, s *scenario) {
	lead := leader(t, ctx, c)
	c.kill(t, ctx, lead)
	s.advance(t, 200, time.Minute) // the other replica took over
	if next := leader(t, ctx, c); next == lead {
		t.Fatalf("%s still leads after being killed", lead.name)
	}
	c.restart(t, ctx, lead)
}

// killCacheReplica kills, in each cache shard in turn, the replica that
// carries the most of fanout's upstream watch streams (the other replica
// keeps serving the shard): fanout's hubs must resume that shard's stream on
// the survivor, and frontdoor's LISTs retry there.
func killCacheReplica(t *testing.T, ctx context.Context, c *cluster, s *scenario) {
	for _, sh := range c.shards {
		n, streams := busiest(t, ctx, c, sh.alias, "herald_cache_watch_streams")
		if streams == 0 {
			t.Fatalf("no fanout watch stream on shard %s: the kill would test nothing", sh.alias)
		}
		t.Logf("%s carries %v watch streams of shard %s", n.name, streams, sh.alias)
		c.kill(t, ctx, n)
		s.advance(t, 200, time.Minute)
		c.restart(t, ctx, n)
	}
}

// busiest is the node of a group with the highest value of a metric.
func busiest(t *testing.T, ctx context.Context, c *cluster, group, metric string) (*node, float64) {
	t.Helper()
	var best *node
	var most float64 = -1
	for _, n := range c.group(group) {
		if v, err := n.metric(ctx, metric); err == nil && v > most {
			best, most = n, v
		}
	}
	if best == nil {
		t.Fatalf("no %s answers /metrics", group)
	}
	return best, most
}

// busiestFanout is the fanout replica with the most open watches.
func busiestFanout(t *testing.T, ctx context.Context, c *cluster) *node {
	t.Helper()
	n, _ := busiest(t, ctx, c, "fanout", "herald_fanout_watchers")
	return n
}

func killFanoutReplica(t *testing.T, ctx context.Context, c *cluster, s *scenario) {
	n := busiestFanout(t, ctx, c)
	c.kill(t, ctx, n)
	s.advance(t, 200, time.Minute)
	c.restart(t, ctx, n)
}

func restartNATSNode(t *testing.T, ctx context.Context, c *cluster, s *scenario) {
	n := c.node(t, "nats-1")
	c.stop(t, ctx, n)
	s.advance(t, 200, time.Minute)
	c.restart(t, ctx, n)
}

func killEtcdMember(t *testing.T, ctx context.Context, c *cluster, s *scenario) {
	var lead *node
	waitFor(t, 30*time.Second, "an etcd leader", func() bool {
		for _, n := range c.group("etcd") {
			if v, err := n.metric(ctx, "etcd_server_is_leader"); err == nil && v == 1 {
				lead = n
				return true
			}
		}
		return false
	})
	c.kill(t, ctx, lead)
	s.advance(t, 200, time.Minute)
	c.restart(t, ctx, lead)
}

// partitionFanout cuts the busiest fanout off the network (from the caches
// and from frontdoor alike): its clients' streams go silent, they resume on
// other replicas; after the heal it serves again.
func partitionFanout(t *testing.T, ctx context.Context, c *cluster, s *scenario) {
	n := busiestFanout(t, ctx, c)
	c.disconnect(t, ctx, n)
	s.advance(t, 200, time.Minute)
	c.connect(t, ctx, n)
	waitFor(t, time.Minute, n.name+" ready after the heal", func() bool { return n.ready(ctx) })
}

// rollingRestart restarts every replica of every Herald service, one at a
// time, gracefully (SIGTERM), as a Deployment rollout does.
func rollingRestart(t *testing.T, ctx context.Context, c *cluster, s *scenario) {
	groups := []string{"ingest"}
	for _, sh := range c.shards {
		groups = append(groups, sh.alias)
	}
	for _, g := range append(groups, "fanout", "frontdoor") {
		for _, n := range c.group(g) {
			c.stop(t, ctx, n)
			c.restart(t, ctx, n)
			s.advance(t, 50, time.Minute)
		}
	}
}

// scaleTakesLoad is how long three fanout replicas added under load may
// take to carry a third of the watches: frontdoor re-resolves the replicas
// every second (and when one fails) and moves the excess watches off the
// loaded ones every second here (--fanout.rebalance-interval), a bounded
// share each time; the clients resume from their resourceVersions.
const scaleTakesLoad = 30 * time.Second

// scaleFanout puts 30 watches on the three fanout replicas, adds three
// more, and checks that the new ones carry at least a third of the watches
// within scaleTakesLoad (the existing watches move: a scale-out must relieve
// the loaded replicas, not wait for new clients); then removes the three
// again. Every client still sees every event once, in order.
func scaleFanout(t *testing.T, ctx context.Context, c *cluster, s *scenario) {
	rv := currentRevision(t, ctx, c.etcd)
	for i := range 28 {
		s.addWatcher(fmt.Sprintf("client-scale-%d", i), i, rv)
	}
	s.advance(t, 100, time.Minute)
	s.mu.Lock()
	clients := len(s.watchers)
	s.mu.Unlock()
	watches := func(names ...string) (n float64) {
		for _, name := range names {
			v, _ := c.node(t, name).metric(ctx, "herald_fanout_watchers")
			n += v
		}
		return n
	}
	old, fresh := []string{"fanout-0", "fanout-1", "fanout-2"}, []string{"fanout-3", "fanout-4", "fanout-5"}
	t.Logf("before the scale-out: %v watches on %v", watches(old...), old)
	c.startAll(t, ctx, c.fanoutSpec(3), c.fanoutSpec(4), c.fanoutSpec(5))
	start := time.Now()
	want := float64((clients + 2) / 3)
	waitFor(t, scaleTakesLoad, fmt.Sprintf("the new fanout replicas to carry a third of the %d watches (%v)", clients, want), func() bool {
		return watches(fresh...) >= want
	})
	t.Logf("after %v the new replicas carry %v watches, the old %v", time.Since(start).Round(100*time.Millisecond), watches(fresh...), watches(old...))
	for _, name := range append(old, fresh...) {
		t.Logf("%s serves %v watches", name, watches(name))
	}
	s.advance(t, 50, time.Minute)
	for _, name := range fresh {
		n := c.node(t, name)
		c.stop(t, ctx, n)
		c.forget(name)
		s.advance(t, 50, time.Minute)
	}
}
