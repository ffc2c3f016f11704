package ingest

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"

	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/stream"
)

// Resuming on real etcd and NATS: a new term starts right after the
// stream's last record (inside it, for a revision split into parts whose
// last part is missing), with no gap and no duplicate; where what follows
// the stream is gone (compacted in etcd, the stream emptied) it says so
// with a resync marker. Compaction past the stream's end while ingest is
// away is a new generation (TestGeneration*); these are the cases next to
// it.

// TestResumeAfterRestart: a replica that stops and starts again resumes
// after the last revision it appended, appends what was written meanwhile
// (puts and a delete) once each, and appends no second start marker.
func TestResumeAfterRestart(t *testing.T) {
	n := startNATS(t)
	e := newTestEtcd(t)
	e.start(t)
	a := startReplica(t, e.url(), n.url, "a")
	a.leads(t, 0)
	start := e.revision(t)
	first := e.puts(t, "p1", "p2", "p3")
	want := ids([]string{progressID(start)}, revs(first...))
	waitIDs(t, n.js, want...)
	a.stop()

	meanwhile := e.puts(t, "p4", "p5")
	del, err := e.cli.Delete(t.Context(), "/registry/pods/default/p1")
	if err != nil {
		t.Fatal(err)
	}
	meanwhile = append(meanwhile, del.Header.Revision)
	last := first[len(first)-1]
	for restart := range 2 {
		a := startReplica(t, e.url(), n.url, "a")
		resume, _ := a.leads(t, 0)
		if w := fmt.Sprintf("revision=%d skipParts=0 lastSequence=%d", last+1, len(want)); resume != w {
			t.Fatalf("after restart %d, the leader resumes at %q, want %q", restart+1, resume, w)
		}
		want = ids(want, revs(meanwhile...))
		waitIDs(t, n.js, want...)
		a.stop()
		last = meanwhile[len(meanwhile)-1]
		if restart == 0 {
			meanwhile = e.puts(t, "p6")
		}
	}
	recs := records(t, n.js)
	if last := recs[len(recs)-2]; len(last.Changes) != 1 || last.Changes[0].Kind != heraldv1.Change_DELETE || !bytes.Contains(last.Changes[0].PrevValue, []byte(`"p1"`)) {
		t.Fatalf("the delete appended as %v", last)
	}
}

// TestResumeAfterProgressMarker: an idle leader appends a progress marker
// when a cache asks, or when its clock reaches the progress interval and
// etcd's revision moved (not when it did not); a restart resumes right
// after the marker.
func TestResumeAfterProgressMarker(t *testing.T) {
	n := startNATS(t)
	e := newTestEtcd(t)
	e.start(t)
	a := startReplica(t, e.url(), n.url, "a")
	a.leads(t, 0)
	start := e.revision(t)
	interval := a.clock.nextTicker(t)

	other := func() int64 {
		resp, err := e.cli.Put(t.Context(), "/other/x", "outside the prefix")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}

	// A cache's request: no need to wait for the interval.
	moved := other()
	if err := a.nc.Publish(stream.SubjectProgressRequest, nil); err != nil {
		t.Fatal(err)
	}
	want := []string{progressID(start), progressID(moved)}
	waitIDs(t, n.js, want...)

	// Nothing moved: a tick appends nothing (a second marker at the same
	// revision would be refused as a duplicate and end the term, which
	// the end checks). Then etcd moves, and the next tick appends.
	a.clock.Step(interval)
	moved = other()
	a.clock.Step(interval)
	want = append(want, progressID(moved))
	waitIDs(t, n.js, want...)
	a.stop()

	pod := e.put(t, "p1")
	a = startReplica(t, e.url(), n.url, "a")
	resume, _ := a.leads(t, 0)
	if w := fmt.Sprintf("revision=%d skipParts=0 lastSequence=3", moved+1); resume != w {
		t.Fatalf("after a progress marker, the leader resumes at %q, want %q", resume, w)
	}
	waitIDs(t, n.js, append(want, revs(pod)...)...)
	if got := a.log.count("leadership term ended"); got != 0 {
		t.Fatalf("%d terms ended: %s", got, a.log)
	}
}

// splitRevision writes one revision too large for one stream message of
// 64 KiB: a 40 KiB value, a 150 KiB one (cut into fragments) and a small
// one. It returns the revision and the values by key.
func splitRevision(t *testing.T, e *testEtcd) (int64, map[string][]byte) {
	t.Helper()
	values := map[string][]byte{
		"/registry/pods/default/big-a": counted("a", 40<<10),
		"/registry/pods/default/big-b": counted("b", 150<<10),
		"/registry/pods/default/small": []byte(`{"kind":"Pod"}`),
	}
	var ops []clientv3.Op
	for _, k := range []string{"/registry/pods/default/big-a", "/registry/pods/default/big-b", "/registry/pods/default/small"} {
		ops = append(ops, clientv3.OpPut(k, string(values[k])))
	}
	resp, err := e.cli.Txn(t.Context()).Then(ops...).Commit()
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision, values
}

// counted is n bytes that differ wherever they are cut: tag and a count,
// over and over.
func counted(tag string, n int) []byte {
	var b []byte
	for c := 0; len(b) < n; c++ {
		b = fmt.Appendf(b, "%s%07d,", tag, c)
	}
	return b[:n]
}

// readBack reads the stream as a cache does (an Assembler) and returns the
// changes of revision rev, if it reads back complete.
func readBack(t *testing.T, js jetstream.JetStream, rev int64) ([]*heraldv1.Change, bool) {
	t.Helper()
	var asm stream.Assembler
	for _, rec := range records(t, js) {
		if changes, ok := asm.Add(rec); ok && rec.Revision == rev {
			return changes, true
		}
	}
	return nil, false
}

// crashInside appends the first parts of revision rev, as a leader that
// died before appending the rest would have, and returns how many parts the
// revision has.
func crashInside(t *testing.T, e *testEtcd, n *testNATS, rev int64, parts int, flags ...string) int {
	t.Helper()
	in := connectIngest(t, e.url(), n.url, flags...)
	wctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	resp := <-in.etcd.Watch(wctx, "/registry/", clientv3.WithPrefix(), clientv3.WithRev(rev), clientv3.WithPrevKV())
	var changes []*heraldv1.Change
	for _, ev := range resp.Events {
		if ev.Kv.ModRevision == rev {
			changes = append(changes, in.change(ev))
		}
	}
	recs := stream.Frame(rev, changes, in.cfg.MaxMessageBytes, in.clock.Now().UnixNano())
	if parts >= len(recs) {
		t.Fatalf("revision %d has %d parts, not more than %d", rev, len(recs), parts)
	}
	p := resumed(t, in)
	for _, rec := range recs[:parts] {
		if err := p.publish(t.Context(), stream.SubjectOf(in.reg, changes), rec, nil); err != nil {
			t.Fatal(err)
		}
	}
	return len(recs)
}

// partIDs are the message ids of parts from..to-1 of rev.
func partIDs(rev int64, from, to int) []string {
	var ids []string
	for part := from; part < to; part++ {
		ids = append(ids, stream.MsgID(&heraldv1.Record{Revision: rev, Part: uint32(part), Parts: uint32(to)}))
	}
	return ids
}

// TestResumeInsideSplitRevision: a leader died after appending some parts
// of a revision split into parts; the next resumes at the first missing
// part and appends only the rest, framed as the first parts were, so the
// revision reads back whole, each value as etcd holds it.
func TestResumeInsideSplitRevision(t *testing.T) {
	const maxMessage = "--stream.max-message-bytes=65536"
	for _, written := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d parts written", written), func(t *testing.T) {
			n := startNATS(t)
			e := newTestEtcd(t)
			e.start(t)
			a := startReplica(t, e.url(), n.url, "a", maxMessage)
			a.leads(t, 0)
			start := e.revision(t)
			first := e.put(t, "p1")
			want := ids([]string{progressID(start)}, revs(first))
			waitIDs(t, n.js, want...)
			a.stop()

			split, values := splitRevision(t, e)
			parts := crashInside(t, e, n, split, written, maxMessage)
			if parts != 4 {
				t.Fatalf("the revision is framed in %d parts, want 4", parts)
			}
			waitIDs(t, n.js, ids(want, partIDs(split, 0, written))...)

			a = startReplica(t, e.url(), n.url, "a", maxMessage)
			resume, _ := a.leads(t, 0)
			if w := fmt.Sprintf("revision=%d skipParts=%d lastSequence=%d", split, written, len(want)+written); resume != w {
				t.Fatalf("the leader resumes at %q, want %q", resume, w)
			}
			next := e.put(t, "p2")
			want = ids(want, partIDs(split, 0, parts), revs(next))
			waitIDs(t, n.js, want...)
			a.waitAppended(t, parts-written+1)

			for _, rec := range records(t, n.js) {
				if rec.Revision == split && rec.Parts != uint32(parts) {
					t.Fatalf("part %d of %d says the revision has %d parts", rec.Part, split, rec.Parts)
				}
			}
			whole, _ := readBack(t, n.js, split)
			if len(whole) != len(values) {
				t.Fatalf("revision %d reads back with %d changes, want %d", split, len(whole), len(values))
			}
			for _, c := range whole {
				if c.Kind != heraldv1.Change_PUT || !bytes.Equal(c.Value, values[c.Key]) {
					t.Fatalf("%s reads back as %s with %d bytes, want PUT with %d", c.Key, c.Kind, len(c.Value), len(values[c.Key]))
				}
			}
		})
	}
}

// TestResumeInsideReframedSplitRevision: the replica that resumes inside a
// split revision frames it differently from the one that died (its
// stream.max-message-bytes changed, or the framing rules did in an
// upgrade): the parts it would append do not continue the ones in the
// stream, and appended after them would read back as a revision with
// values cut wrong. It appends a resync marker instead (readers drop the
// incomplete revision and rebuild), and the next term resumes after it.
func TestResumeInsideReframedSplitRevision(t *testing.T) {
	n := startNATS(t)
	e := newTestEtcd(t)
	e.start(t)
	a := startReplica(t, e.url(), n.url, "a", "--stream.max-message-bytes=65536")
	a.leads(t, 0)
	start := e.revision(t)
	first := e.put(t, "p1")
	want := ids([]string{progressID(start)}, revs(first))
	waitIDs(t, n.js, want...)
	a.stop()
	split, _ := splitRevision(t, e)
	crashInside(t, e, n, split, 2, "--stream.max-message-bytes=65536")

	a = startReplica(t, e.url(), n.url, "a", "--stream.max-message-bytes=131072")
	resume, next := a.leads(t, 0)
	if w := fmt.Sprintf("revision=%d skipParts=2 lastSequence=4", split); resume != w {
		t.Fatalf("the leader resumes at %q, want %q", resume, w)
	}
	line, next := a.log.wait(t, next, "appending a resync marker")
	_, after, _ := strings.Cut(line, "resyncRevision=")
	resync, err := strconv.ParseInt(after, 10, 64)
	if err != nil || resync < split {
		t.Fatalf("resync marker at %q, want a revision from %d on", after, split)
	}
	want = ids(want, partIDs(split, 0, 2), []string{resyncID(resync)})
	waitIDs(t, n.js, want...)
	a.clock.Step(a.clock.nextTimer(t))
	a.leads(t, next)
	last := e.put(t, "p2")
	waitIDs(t, n.js, ids(want, revs(last))...)
	if changes, ok := readBack(t, n.js, split); ok {
		t.Fatalf("the incomplete revision %d reads back, with %d changes", split, len(changes))
	}
	if got := testutil.ToFloat64(a.m.failures.WithLabelValues("reframed")); got != 1 {
		t.Fatalf("herald_ingest_failures_total{cause=reframed} = %v, want 1", got)
	}
}

// TestResumeInsideCompactedSplitRevision: the missing parts of a split
// revision are gone from etcd (compacted up to the revision after it, which
// the generation check still finds, so the stream's history is kept): the
// leader appends a resync marker at etcd's revision instead, its term ends,
// and the next term resumes right after the marker without a new
// generation. The incomplete revision stays incomplete (readers drop it)
// and nothing else of it is appended.
func TestResumeInsideCompactedSplitRevision(t *testing.T) {
	const maxMessage = "--stream.max-message-bytes=65536"
	n := startNATS(t)
	e := newTestEtcd(t)
	e.start(t)
	a := startReplica(t, e.url(), n.url, "a", maxMessage)
	a.leads(t, 0)
	start := e.revision(t)
	first := e.put(t, "p1")
	want := ids([]string{progressID(start)}, revs(first))
	waitIDs(t, n.js, want...)
	a.stop()
	split, _ := splitRevision(t, e)
	crashInside(t, e, n, split, 1, maxMessage)
	lost := e.put(t, "p2")
	if _, err := e.cli.Compact(t.Context(), lost, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}

	a = startReplica(t, e.url(), n.url, "a", maxMessage)
	resume, next := a.leads(t, 0)
	if w := fmt.Sprintf("revision=%d skipParts=1 lastSequence=3", split); resume != w {
		t.Fatalf("the leader resumes at %q, want %q", resume, w)
	}
	line, next := a.log.wait(t, next, "resume revision was compacted; appending a resync marker")
	_, after, _ := strings.Cut(line, "resyncRevision=")
	resync, err := strconv.ParseInt(after, 10, 64)
	if err != nil || resync < lost {
		t.Fatalf("resync marker at %q, want a revision from %d on", after, lost)
	}
	a.log.wait(t, next, "leadership term ended; campaigning again", "resuming after the resync marker")
	want = ids(want, partIDs(split, 0, 1), []string{resyncID(resync)})
	waitIDs(t, n.js, want...)

	a.clock.Step(a.clock.nextTimer(t))
	resume, _ = a.leads(t, next)
	if w := fmt.Sprintf("revision=%d skipParts=0 lastSequence=%d", resync+1, len(want)); resume != w {
		t.Fatalf("after the resync marker, the leader resumes at %q, want %q", resume, w)
	}
	last := e.put(t, "p3")
	waitIDs(t, n.js, ids(want, revs(last))...)
	if got := testutil.ToFloat64(a.m.resyncs); got != 1 {
		t.Fatalf("herald_ingest_resyncs_total = %v, want 1", got)
	}
	if got := testutil.ToFloat64(a.m.generation); got != 1 {
		t.Fatalf("herald_stream_generation = %v, want 1 (the stream's history kept)", got)
	}
}

// TestResumeCompactedUpToTheHead: etcd compacted everything the stream
// already holds, once while the leader runs and once while it is away up
// to the revision right after the stream's last one: nothing is lost, so
// the leader goes on (resumes) right after the stream's last revision, with
// no resync marker and no new generation. One revision further is
// TestGenerationCompactedStart's new generation: etcd can no longer tell
// whether the compacted revisions changed anything under the prefix.
func TestResumeCompactedUpToTheHead(t *testing.T) {
	n := startNATS(t)
	e := newTestEtcd(t)
	e.start(t)
	a := startReplica(t, e.url(), n.url, "a")
	a.leads(t, 0)
	start := e.revision(t)
	first := e.puts(t, "p1", "p2", "p3")
	want := ids([]string{progressID(start)}, revs(first...))
	waitIDs(t, n.js, want...)
	if _, err := e.cli.Compact(t.Context(), first[2], clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	second := e.puts(t, "p4")
	want = ids(want, revs(second...))
	waitIDs(t, n.js, want...)
	a.stop()

	away := e.puts(t, "p5", "p6")
	// second[0]+1: the stopped leader's resignation, outside the prefix.
	if _, err := e.cli.Compact(t.Context(), second[0]+1, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	a = startReplica(t, e.url(), n.url, "a")
	resume, _ := a.leads(t, 0)
	if w := fmt.Sprintf("revision=%d skipParts=0 lastSequence=%d", second[0]+1, len(want)); resume != w {
		t.Fatalf("the leader resumes at %q, want %q", resume, w)
	}
	waitIDs(t, n.js, ids(want, revs(away...))...)
	if got := testutil.ToFloat64(a.m.resyncs) + testutil.ToFloat64(a.m.failures.WithLabelValues("compacted")); got != 0 {
		t.Fatalf("%v resyncs or compaction failures", got)
	}
	if got := testutil.ToFloat64(a.m.generation); got != 1 {
		t.Fatalf("herald_stream_generation = %v, want 1", got)
	}
}

// TestResumeEmptiedStream: the stream was emptied (purged, aged out) while
// ingest was away, so what it last held, and where to resume, is lost: the
// leader appends a resync marker at etcd's revision (not a progress marker,
// which would hide the revisions nobody appended) and goes on from there.
func TestResumeEmptiedStream(t *testing.T) {
	n := startNATS(t)
	e := newTestEtcd(t)
	e.start(t)
	a := startReplica(t, e.url(), n.url, "a")
	a.leads(t, 0)
	start := e.revision(t)
	first := e.puts(t, "p1", "p2")
	waitIDs(t, n.js, ids([]string{progressID(start)}, revs(first...))...)
	a.stop()
	st, err := n.js.Stream(t.Context(), "HERALD")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(t.Context()); err != nil {
		t.Fatal(err)
	}
	e.put(t, "p3") // never appended: the resync marker covers it

	a = startReplica(t, e.url(), n.url, "a")
	line, _ := a.log.wait(t, 0, "the stream is empty but was appended to; appending a resync marker", "lastSequence=3")
	_, after, _ := strings.Cut(line, "resyncRevision=")
	resync, err := strconv.ParseInt(after, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	resume, _ := a.leads(t, 0)
	if w := fmt.Sprintf("revision=%d skipParts=0 lastSequence=4", resync+1); resume != w {
		t.Fatalf("the leader resumes at %q, want %q", resume, w)
	}
	next := e.put(t, "p4")
	waitIDs(t, n.js, ids([]string{resyncID(resync)}, revs(next))...)
	if got := testutil.ToFloat64(a.m.resyncs); got != 1 {
		t.Fatalf("herald_ingest_resyncs_total = %v, want 1", got)
	}
}
