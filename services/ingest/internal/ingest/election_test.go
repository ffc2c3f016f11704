package ingest

import (
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The election on real etcd and NATS: of two replicas only the elected one
// appends; the other takes over when the leader's lease ends or the leader
// stops, resuming right after the stream's last record; a deposed leader
// appends nothing more and campaigns again only once its backoff has passed
// on its clock.

// twoReplicas starts replica a, waits until it leads (its start marker at
// etcd's revision then, returned), then starts b and waits until b
// campaigns behind a.
func twoReplicas(t *testing.T, e *testEtcd, n *testNATS, flags ...string) (a, b *replica, start int64) {
	t.Helper()
	a = startReplica(t, e.url(), n.url, "a", flags...)
	resume, _ := a.leads(t, 0)
	start = e.revision(t)
	if want := fmt.Sprintf("revision=%d skipParts=0 lastSequence=1", start+1); resume != want {
		t.Fatalf("a new stream's leader resumes at %q, want %q", resume, want)
	}
	waitIDs(t, n.js, progressID(start))
	b = startReplica(t, e.url(), n.url, "b", flags...)
	waitCandidates(t, e.cli, "a", "b")
	return a, b, start
}

// TestElectionLeaseExpiry: only the leader appends; when its lease ends
// (etcd revokes it, as when its TTL runs out) the follower leads, resumes
// after the stream's last revision and appends what follows, each revision
// once; the deposed leader appends nothing more and campaigns again only
// when its backoff has passed on its clock, then waits as a follower.
func TestElectionLeaseExpiry(t *testing.T) {
	n := startNATS(t)
	e := newTestEtcd(t)
	e.start(t)
	a, b, start := twoReplicas(t, e, n)

	first := e.puts(t, "p1", "p2", "p3")
	want := ids([]string{progressID(start)}, revs(first...))
	waitIDs(t, n.js, want...)
	a.waitAppended(t, 4)
	if b.appended() != 0 {
		t.Fatalf("the follower appended %d records", b.appended())
	}
	if got := testutil.ToFloat64(b.m.leaderChanges); got != 0 {
		t.Fatalf("the follower won %v terms", got)
	}
	if testutil.ToFloat64(a.m.leader) != 1 || testutil.ToFloat64(b.m.leader) != 0 {
		t.Fatalf("herald_ingest_leader: a %v, b %v; want 1 and 0", testutil.ToFloat64(a.m.leader), testutil.ToFloat64(b.m.leader))
	}
	for _, r := range []*replica{a, b} {
		if err := r.Ready(); err != nil {
			t.Fatalf("%s not ready: %v", r.id, err)
		}
	}

	mark := a.log.mark()
	expire(t, e.cli, "a")
	a.log.wait(t, mark, "leadership term ended; campaigning again", "backoff=50ms")
	if d := a.clock.nextTimer(t); d != a.cfg.RetryBackoff {
		t.Fatalf("the deposed leader waits %v before campaigning again, want %v", d, a.cfg.RetryBackoff)
	}
	resume, _ := b.leads(t, 0)
	if want := fmt.Sprintf("revision=%d skipParts=0 lastSequence=4", first[2]+1); resume != want {
		t.Fatalf("the new leader resumes at %q, want %q", resume, want)
	}
	const deposed = 4 // a's term is over: its count is final
	second := e.puts(t, "p4", "p5")
	want = ids(want, revs(second...))
	waitIDs(t, n.js, want...)
	b.waitAppended(t, len(second))
	if a.appended() != deposed {
		t.Fatalf("after its lease ended, a appended %d records", a.appended()-deposed)
	}
	// Its backoff has not passed on its clock: a has not campaigned again.
	waitCandidates(t, e.cli, "b")

	a.clock.Step(a.cfg.RetryBackoff)
	waitCandidates(t, e.cli, "b", "a")
	third := e.puts(t, "p6")
	want = ids(want, revs(third...))
	waitIDs(t, n.js, want...)
	if a.appended() != deposed || testutil.ToFloat64(a.m.leaderChanges) != 1 || testutil.ToFloat64(a.m.leader) != 0 {
		t.Fatalf("a, following again, appended %d records, won %v terms, leader gauge %v", a.appended()-deposed,
			testutil.ToFloat64(a.m.leaderChanges), testutil.ToFloat64(a.m.leader))
	}
	b.waitAppended(t, len(want)-deposed) // every record by one of them
}

// TestElectionLeaderStops: a leader that stops resigns at once (no wait for
// its lease to run out); the follower resumes right after the stream's last
// revision and appends what was written while nobody led, each revision
// once and in order.
func TestElectionLeaderStops(t *testing.T) {
	n := startNATS(t)
	e := newTestEtcd(t)
	e.start(t)
	a, b, start := twoReplicas(t, e, n)

	first := e.puts(t, "p1", "p2")
	want := ids([]string{progressID(start)}, revs(first...))
	waitIDs(t, n.js, want...)
	a.stop()
	handover := e.puts(t, "p3", "p4", "p5")
	resume, _ := b.leads(t, 0)
	if want := fmt.Sprintf("revision=%d skipParts=0 lastSequence=3", first[1]+1); resume != want {
		t.Fatalf("the new leader resumes at %q, want %q", resume, want)
	}
	after := e.puts(t, "p6")
	want = ids(want, revs(handover...), revs(after...))
	waitIDs(t, n.js, want...)
	b.waitAppended(t, 4)
	if a.appended() != 3 {
		t.Fatalf("a appended %d records, want 3", a.appended())
	}
	if got := a.log.count("leadership term ended"); got != 0 {
		t.Fatalf("a stopped by its context logged %d failed terms", got)
	}
}

// TestElectionBackoff: the wait before campaigning again starts at
// retry-backoff after a term that appended to the stream (the failure that
// ended it is the first of its kind) and doubles only while terms end
// without appending anything.
func TestElectionBackoff(t *testing.T) {
	n := startNATS(t)
	e := newTestEtcd(t)
	e.start(t)
	a := startReplica(t, e.url(), n.url, "a")
	_, next := a.leads(t, 0)
	start := e.revision(t)
	want := []string{progressID(start)}
	var waits []time.Duration
	for term, appends := range []bool{true, true, false, false} {
		if appends {
			want = ids(want, revs(e.put(t, fmt.Sprintf("p%d", term))))
		}
		waitIDs(t, n.js, want...)
		expire(t, e.cli, "a")
		d := a.clock.nextTimer(t)
		waits = append(waits, d)
		a.clock.Step(d)
		_, next = a.leads(t, next)
	}
	if want := []time.Duration{50 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond}; !slices.Equal(waits, want) {
		t.Fatalf("waits before campaigning again %v, want %v", waits, want)
	}
}

// TestElectionPartitionedLeader: the leader is cut off from etcd (not from
// NATS), so its lease really runs out on etcd's clock: the follower leads
// and resumes right after the stream's last revision; the old leader, whose
// keepalives get no answer, ends its term on its own, appends nothing more,
// and once the link is back campaigns again as a follower.
func TestElectionPartitionedLeader(t *testing.T) {
	n := startNATS(t)
	e := newTestEtcd(t)
	e.start(t)
	link := newLink(t, e.client)
	a := startReplica(t, "http://"+link.addr(), n.url, "a")
	a.leads(t, 0)
	start := e.revision(t)
	waitIDs(t, n.js, progressID(start))
	b := startReplica(t, e.url(), n.url, "b")
	waitCandidates(t, e.cli, "a", "b")
	first := e.puts(t, "p1")
	want := ids([]string{progressID(start)}, revs(first...))
	waitIDs(t, n.js, want...)
	a.waitAppended(t, 2)

	link.cut(true)
	resume, _ := b.leads(t, 0)
	if w := fmt.Sprintf("revision=%d skipParts=0 lastSequence=2", first[0]+1); resume != w {
		t.Fatalf("the new leader resumes at %q, want %q", resume, w)
	}
	a.log.wait(t, 0, "leader lease lost")
	a.log.wait(t, 0, "leadership term ended; campaigning again")
	backoff := a.clock.nextTimer(t)
	second := e.puts(t, "p2", "p3")
	want = ids(want, revs(second...))
	waitIDs(t, n.js, want...)
	b.waitAppended(t, len(second))
	if a.appended() != 2 {
		t.Fatalf("the partitioned leader appended %d records after it was cut off", a.appended()-2)
	}

	link.cut(false)
	a.clock.Step(backoff)
	// Its etcd client may still be reconnecting through the restored
	// link: a term that fails to reach etcd waits another backoff.
	a.clock.stepUntil(t, "a campaigns again", func() bool { return slices.Equal(candidates(t, e.cli), []string{"b", "a"}) })
	third := e.puts(t, "p4")
	waitIDs(t, n.js, ids(want, revs(third...))...)
	b.waitAppended(t, len(second)+len(third))
	if a.appended() != 2 {
		t.Fatalf("the old leader, following again, appended %d records", a.appended()-2)
	}
}

// link is a TCP proxy to one server that a test can cut (every connection
// through it closed, new ones refused) and restore: a network partition
// between one process and that server.
type link struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	down   bool
	conns  map[net.Conn]bool
}

func newLink(t *testing.T, target string) *link {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &link{ln: ln, target: target, conns: map[net.Conn]bool{}}
	t.Cleanup(func() { ln.Close(); l.cut(true) })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go l.carry(c)
		}
	}()
	return l
}

func (l *link) addr() string { return l.ln.Addr().String() }

// carry copies between c and a new connection to the target until either
// closes or the link is cut.
func (l *link) carry(c net.Conn) {
	s, err := net.Dial("tcp", l.target)
	if err != nil {
		c.Close()
		return
	}
	l.mu.Lock()
	if l.down {
		l.mu.Unlock()
		c.Close()
		s.Close()
		return
	}
	l.conns[c], l.conns[s] = true, true
	l.mu.Unlock()
	go func() { io.Copy(s, c); s.Close() }()
	io.Copy(c, s)
	c.Close()
}

// cut cuts the link (down) or restores it.
func (l *link) cut(down bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.down = down
	if down {
		for c := range l.conns {
			c.Close()
		}
		clear(l.conns)
	}
}
