package ingest

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"

	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/stream"
)

// The fence on real JetStream: every append names the stream sequence it
// expects to follow, so a writer that read the stream's end before another
// appended (a deposed or paused leader) is refused whatever it appends, and
// a message id names one record, so a record is never in the stream twice.

// connectIngest is a replica connected as Run connects it (the stream
// created, its generation checked) that neither campaigns nor leads: the
// test appends through its publishers.
func connectIngest(t *testing.T, etcdURL, natsURL string, flags ...string) *Ingest {
	t.Helper()
	in, err := New(testConfig(t, etcdURL, natsURL, flags...), slog.New(slog.DiscardHandler), prometheus.NewRegistry(), WithClock(newTestClock()))
	if err != nil {
		t.Fatal(err)
	}
	in.etcd, err = clientv3.New(clientv3.Config{Endpoints: in.cfg.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.etcd.Close() })
	if err := in.connectNATS(nil, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(in.nc.Close)
	if in.stream, err = in.js.CreateOrUpdateStream(t.Context(), in.streamConfig(t.Context())); err != nil {
		t.Fatal(err)
	}
	if _, err := in.checkGeneration(t.Context()); err != nil {
		t.Fatal(err)
	}
	return in
}

// resumed is a publisher that read the stream's end, as a leader does when
// its term starts.
func resumed(t *testing.T, in *Ingest) *publisher {
	t.Helper()
	lastSeq, startRev, _, err := in.resumePoint(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return in.newPublisher(lastSeq, startRev-1)
}

// appendRev appends revision rev (one small change) through p.
func appendRev(t *testing.T, p *publisher, rev int64) error {
	t.Helper()
	changes := []*heraldv1.Change{{Kind: heraldv1.Change_PUT, Key: fmt.Sprintf("/registry/pods/default/p%d", rev), Value: []byte(`{}`), CreateRevision: rev}}
	recs := stream.Frame(rev, changes, p.i.cfg.MaxMessageBytes, 0)
	if len(recs) != 1 {
		t.Fatalf("revision %d framed in %d parts", rev, len(recs))
	}
	return p.publish(t.Context(), stream.SubjectOf(p.i.reg, changes), recs[0], nil)
}

// TestFenceRefusesAStaleWriter: two writers read the stream's end; once one
// appends, the other is refused whatever it appends (the same revision, the
// next, an earlier one, a marker) and stays where it was; the stream holds
// the first writer's record once.
func TestFenceRefusesAStaleWriter(t *testing.T) {
	n := startNATS(t)
	e := newTestEtcd(t)
	e.start(t)
	in := connectIngest(t, e.url(), n.url)
	winner, stale := resumed(t, in), resumed(t, in)
	if winner.lastSeq != 0 || stale.lastSeq != 0 {
		t.Fatalf("writers of a new stream expect sequences %d and %d, want 0", winner.lastSeq, stale.lastSeq)
	}
	if err := appendRev(t, winner, 10); err != nil {
		t.Fatal(err)
	}
	if winner.lastSeq != 1 || winner.lastRev != 10 {
		t.Fatalf("after appending 10, the writer is at sequence %d, revision %d", winner.lastSeq, winner.lastRev)
	}

	for _, attempt := range []struct {
		what string
		rec  func() error
	}{
		{"the same revision", func() error { return appendRev(t, stale, 10) }},
		{"the next revision", func() error { return appendRev(t, stale, 11) }},
		{"an earlier revision", func() error { return appendRev(t, stale, 9) }},
		{"a progress marker", func() error { return stale.publishMarker(t.Context(), stream.Progress(12)) }},
		{"a resync marker", func() error { return stale.publishMarker(t.Context(), stream.Resync(12)) }},
	} {
		err := attempt.rec()
		if !errors.Is(err, errFenced) || !strings.Contains(err.Error(), "expected last sequence 0") {
			t.Fatalf("the stale writer appending %s: %v, want fenced at sequence 0", attempt.what, err)
		}
		if stale.lastSeq != 0 || stale.lastRev != -1 {
			t.Fatalf("after a refused append, the stale writer is at sequence %d, revision %d", stale.lastSeq, stale.lastRev)
		}
	}
	if got := testutil.ToFloat64(in.m.failures.WithLabelValues("fenced")); got != 5 {
		t.Fatalf("herald_ingest_failures_total{cause=fenced} = %v, want 5", got)
	}
	waitIDs(t, n.js, revs(10)...)

	// The winner goes on; a writer that reads the stream's end again
	// (the next term) follows it.
	if err := appendRev(t, winner, 11); err != nil {
		t.Fatal(err)
	}
	next := resumed(t, in)
	if next.lastSeq != 2 || next.lastRev != 11 {
		t.Fatalf("a writer resuming after 11 expects sequence %d, revision %d; want 2, 11", next.lastSeq, next.lastRev)
	}
	if err := appendRev(t, next, 12); err != nil {
		t.Fatal(err)
	}
	if err := appendRev(t, winner, 12); !errors.Is(err, errFenced) {
		t.Fatalf("the first writer, now stale, appending 12: %v, want fenced", err)
	}
	waitIDs(t, n.js, revs(10, 11, 12)...)
	if got := testutil.ToFloat64(in.m.records.WithLabelValues("revision")); got != 3 {
		t.Fatalf("herald_ingest_records_published_total{kind=revision} = %v, want 3", got)
	}
}

// TestFenceRefusesADuplicateID: a record whose message id the stream has
// seen is refused even when the writer's expected sequence is right (the
// stream was purged: its last sequence stays, its de-duplication window
// too), so the stream never holds a record twice; a new id is appended.
func TestFenceRefusesADuplicateID(t *testing.T) {
	n := startNATS(t)
	e := newTestEtcd(t)
	e.start(t)
	in := connectIngest(t, e.url(), n.url)
	p := resumed(t, in)
	for _, rev := range []int64{10, 11} {
		if err := appendRev(t, p, rev); err != nil {
			t.Fatal(err)
		}
	}
	if err := in.stream.Purge(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitIDs(t, n.js)
	p = resumed(t, in)
	if p.lastSeq != 2 {
		t.Fatalf("a writer of the purged stream expects sequence %d, want 2", p.lastSeq)
	}
	err := appendRev(t, p, 11)
	if !errors.Is(err, errFenced) || !strings.Contains(err.Error(), "message 11.0 already in the stream") {
		t.Fatalf("appending 11 again: %v, want refused as a duplicate", err)
	}
	if p.lastSeq != 2 {
		t.Fatalf("after the refused append, the writer expects sequence %d, want 2", p.lastSeq)
	}
	if err := appendRev(t, p, 12); err != nil {
		t.Fatal(err)
	}
	waitIDs(t, n.js, revs(12)...)
}

// TestFencePausedLeader: a leader frozen in the middle of an append (a long
// GC pause) loses its lease; the follower leads, appends the frozen revision
// and the next; when the old leader wakes its append is refused by the fence
// (the stream moved past the sequence it expected), its term ends and it
// campaigns again as a follower. Every revision is in the stream once, in
// order, appended by one replica or the other.
func TestFencePausedLeader(t *testing.T) {
	n := startNATS(t)
	e := newTestEtcd(t)
	e.start(t)
	a, b, start := twoReplicas(t, e, n)
	first := e.puts(t, "p1")
	want := ids([]string{progressID(start)}, revs(first...))
	waitIDs(t, n.js, want...)

	faults := a.FaultHandlers()
	faults["/debug/fault/pause-publish"].ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", "/debug/fault/pause-publish", nil))
	frozen := e.put(t, "frozen")
	// The gauge is set right before the revision's append, with nothing
	// between that could end the term: once it reads frozen, a is (or is
	// about to be) frozen in that append.
	waitGauge(t, "a's herald_ingest_etcd_revision", func() float64 { return testutil.ToFloat64(a.m.etcdRev) }, float64(frozen))

	mark := a.log.mark()
	expire(t, e.cli, "a")
	resume, _ := b.leads(t, 0)
	if want := fmt.Sprintf("revision=%d skipParts=0 lastSequence=2", frozen); resume != want {
		t.Fatalf("the new leader resumes at %q, want %q", resume, want)
	}
	after := e.puts(t, "p2")
	want = ids(want, revs(frozen), revs(after...))
	waitIDs(t, n.js, want...)
	if got := a.log.count("leadership term ended"); got != 0 {
		t.Fatalf("the frozen leader's term ended before it woke: %s", a.log)
	}

	faults["/debug/fault/resume-publish"].ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", "/debug/fault/resume-publish", nil))
	line, _ := a.log.wait(t, mark, "leadership term ended; campaigning again")
	if !strings.Contains(line, "stream was appended to by another writer: expected last sequence 2") {
		t.Fatalf("the woken leader's term ended with %q, want fenced at sequence 2", line)
	}
	// Its term is over: its counts are final (the start marker and p1).
	if a.fenced() != 1 || a.appended() != 2 {
		t.Fatalf("the woken leader: %d appends refused, %d appended in all; want 1 and 2", a.fenced(), a.appended())
	}
	a.clock.Step(a.clock.nextTimer(t))
	waitCandidates(t, e.cli, "b", "a")
	last := e.puts(t, "p3")
	want = ids(want, revs(last...))
	waitIDs(t, n.js, want...)
	b.waitAppended(t, len(want)-2) // every record by one of them
	if got := testutil.ToFloat64(a.m.leaderChanges); got != 1 {
		t.Fatalf("a won %v terms, want 1", got)
	}
}

// waitGauge waits until get returns want (up to 20 s).
func waitGauge(t *testing.T, what string, get func() float64, want float64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for got := get(); got != want; got = get() {
		if time.Now().After(deadline) {
			t.Fatalf("after 20s, %s is %v, want %v", what, got, want)
		}
		time.Sleep(10 * time.Millisecond) // polling a metric; nothing to wait on
	}
}
