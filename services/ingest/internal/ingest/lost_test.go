package ingest

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"herald.dev/libs/stream"
)

// TestStreamLostWhileLeading: the stream is deleted under the leader (an
// operator's mistake, or NATS restarted with memory storage or a wiped
// store). The leader says so once, is not ready, and then creates the
// stream again as a new generation that starts with a resync marker: what
// the lost stream held, and the changes nobody appended meanwhile, reach
// caches only through their rebuild from etcd.
func TestStreamLostWhileLeading(t *testing.T) {
	n := startNATS(t)
	e := newTestEtcd(t)
	e.start(t)
	a := startReplica(t, e.url(), n.url, "a")
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(a.log)
		}
	})
	a.leads(t, 0)
	start := e.revision(t)
	first := e.puts(t, "p1", "p2")
	waitIDs(t, n.js, ids([]string{progressID(start)}, revs(first...))...)
	if err := a.Ready(); err != nil {
		t.Fatalf("the leader is not ready: %v", err)
	}

	mark := a.log.mark()
	if err := n.js.DeleteStream(t.Context(), "HERALD"); err != nil {
		t.Fatal(err)
	}
	lost := e.put(t, "p3") // its append finds no stream
	a.log.wait(t, mark, "the stream is gone (deleted", "generation=1")
	backoff := a.clock.nextTimer(t) // the term ended; the replica waits its backoff
	if err := a.Ready(); err == nil {
		t.Fatal("the replica is ready while its stream is gone")
	}
	if got := testutil.ToFloat64(a.m.failures.WithLabelValues("stream_lost")); got != 1 {
		t.Fatalf(`herald_ingest_failures_total{cause="stream_lost"} = %v, want 1`, got)
	}

	a.clock.Step(backoff)
	a.clock.stepUntil(t, "the stream created again", func() bool { return a.log.count("the stream was created again") > 0 })
	line, _ := a.log.wait(t, mark, "the stream was created again")
	_, after, _ := strings.Cut(line, "resyncRevision=")
	resync, err := strconv.ParseInt(after, 10, 64)
	if err != nil {
		t.Fatalf("%q: %v", line, err)
	}
	if resync < lost {
		t.Fatalf("resync marker at %d, before the change %d nobody appended", resync, lost)
	}
	next := e.put(t, "p4")
	waitIDs(t, n.js, ids([]string{resyncID(resync)}, revs(next))...)
	st, err := n.js.Stream(t.Context(), "HERALD")
	if err != nil {
		t.Fatal(err)
	}
	gen, ok := stream.GenerationOf(st.CachedInfo().Config.Metadata)
	want := stream.Generation{Number: 2, ClusterID: e.clusterID(t), FirstRevision: gen.FirstRevision, Floor: resync - 1}
	if !ok || gen != want || gen.FirstRevision < lost || gen.FirstRevision > resync {
		t.Fatalf("the stream records generation %+v (recorded: %v), want %+v with a first revision in [%d, %d]", gen, ok, want, lost, resync)
	}
	if err := a.Ready(); err != nil {
		t.Fatalf("the replica is not ready with its stream back: %v", err)
	}
	if got := a.log.count("the stream is gone (deleted"); got != 1 {
		t.Fatalf("the loss logged %d times, want once:\n%s", got, a.log)
	}
	if got := testutil.ToFloat64(a.m.generation); got != 2 {
		t.Fatalf("herald_stream_generation = %v, want 2", got)
	}
}

// TestStreamLostInNATSRestart: NATS restarts with its store wiped; the
// replica that led is gone too, and the one that starts then never saw the
// stream (it creates it, with no generation, before it leads). It counts on
// from the generation the leader kept in etcd: generation 2 with a resync
// marker, not generation 1 with a progress marker, under which caches would
// take the new stream for the history they followed.
func TestStreamLostInNATSRestart(t *testing.T) {
	n := newRestartableNATS(t, true)
	n.start(t)
	e := newTestEtcd(t)
	e.start(t)
	a := startReplica(t, e.url(), n.url(), "a")
	a.leads(t, 0)
	start := e.revision(t)
	first := e.put(t, "p1")
	waitIDs(t, n.reader(t).js, ids([]string{progressID(start)}, revs(first))...)
	a.stop()

	n.stop()
	if err := os.RemoveAll(n.opts.StoreDir); err != nil {
		t.Fatal(err)
	}
	lost := e.put(t, "p2") // appended by nobody
	n.start(t)
	r := n.reader(t)
	b := startReplica(t, e.url(), n.url(), "b")
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(b.log)
		}
	})
	line, _ := b.log.wait(t, 0, "the stream was created again", "generation=2")
	_, after, _ := strings.Cut(line, "resyncRevision=")
	resync, err := strconv.ParseInt(after, 10, 64)
	if err != nil || resync < lost {
		t.Fatalf("%q: resync marker not after the change %d nobody appended (%v)", line, lost, err)
	}
	later := e.put(t, "p3")
	waitIDs(t, r.js, ids([]string{resyncID(resync)}, revs(later))...)
	st, err := r.js.Stream(t.Context(), "HERALD")
	if err != nil {
		t.Fatal(err)
	}
	if gen, _ := stream.GenerationOf(st.CachedInfo().Config.Metadata); gen.Number != 2 || gen.Floor < first {
		t.Fatalf("the stream records generation %+v, want 2 with a floor from %d", gen, first)
	}
	if got := testutil.ToFloat64(b.m.failures.WithLabelValues("stream_lost")); got != 1 {
		t.Fatalf(`herald_ingest_failures_total{cause="stream_lost"} = %v, want 1`, got)
	}
	waitReady(t, b, "")
}
