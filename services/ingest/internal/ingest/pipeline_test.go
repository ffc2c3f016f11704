package ingest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/stream"
)

// Pipelined appends on real etcd and JetStream: a burst of revisions goes
// out with many records in flight, never more than publish.max-in-flight,
// and lands in etcd's order, each once; a writer that appends in the middle
// of the burst ends the term as fenced, and nothing of the burst lands after
// its message. publish.max-in-flight=1 appends one record at a time, as a
// synchronous publish did.

// withSent calls f on the replica's goroutine after each record it sends,
// with the number in flight.
func withSent(f func(inFlight int)) Option { return func(i *Ingest) { i.sent = f } }

// burstWhileAway has replica a lead (its start marker at etcd's revision
// then, returned) and stop, then writes a burst of count revisions. The
// next leader catches up with them in one watch response (etcd sends a
// watcher that starts behind up to 1,000 revisions at once), so it sends
// them one after the other whatever the timing of their acks.
func burstWhileAway(t *testing.T, e *testEtcd, n *testNATS, count int) (start int64, burst []int64) {
	t.Helper()
	a := startReplica(t, e.url(), n.url, "a")
	a.leads(t, 0)
	start = e.revision(t)
	waitIDs(t, n.js, progressID(start))
	a.stop()
	names := make([]string, count)
	for k := range names {
		names[k] = fmt.Sprintf("burst-%d", k)
	}
	return start, e.puts(t, names...)
}

// TestPublishPipelinedBurst: the leader appends a burst of 300 revisions
// with up to publish.max-in-flight records in flight (all of them once the
// burst is longer), one at a time with publish.max-in-flight=1; the stream
// holds each revision once, in etcd's order, and once every ack is consumed
// nothing is in flight.
func TestPublishPipelinedBurst(t *testing.T) {
	for _, maxInFlight := range []int{256, 1} {
		t.Run(fmt.Sprintf("max-in-flight=%d", maxInFlight), func(t *testing.T) {
			n := startNATS(t)
			e := newTestEtcd(t)
			e.start(t)
			start, burst := burstWhileAway(t, e, n, 300)

			var peak atomic.Int64
			sent := withSent(func(inFlight int) {
				if int64(inFlight) > peak.Load() {
					peak.Store(int64(inFlight))
				}
			})
			a := startReplicaWith(t, e.url(), n.url, "a", []Option{sent}, fmt.Sprintf("--publish.max-in-flight=%d", maxInFlight))
			resume, _ := a.leads(t, 0)
			if want := fmt.Sprintf("revision=%d skipParts=0 lastSequence=1", start+1); resume != want {
				t.Fatalf("the leader resumes at %q, want %q", resume, want)
			}
			waitIDs(t, n.js, ids([]string{progressID(start)}, revs(burst...))...)
			a.waitAppended(t, len(burst))
			if got := peak.Load(); got != int64(maxInFlight) {
				t.Fatalf("at most %d records in flight, want %d", got, maxInFlight)
			}
			if got := testutil.ToFloat64(a.m.inFlight); got != 0 {
				t.Fatalf("herald_ingest_records_in_flight = %v once every ack is consumed", got)
			}
			if got := testutil.ToFloat64(a.m.lastRev); got != float64(burst[len(burst)-1]) {
				t.Fatalf("herald_ingest_last_published_revision = %v, want %d", got, burst[len(burst)-1])
			}
			if got := a.log.count("leadership term ended"); got != 0 {
				t.Fatalf("%d terms ended: %s", got, a.log)
			}
		})
	}
}

// TestPublishFencedMidBurst: another writer appends a progress marker while
// the leader has a burst in flight (from the leader's goroutine, right after
// it sent the burst's 8th record, so before the rest). The stream keeps a
// prefix of the burst (what JetStream took before the stranger's message),
// that message, and nothing after: the leader's next record is refused for
// the sequence it expects, each later one for the message it must follow,
// even where its sequence matches the stream's end. The term ends fenced,
// counted once, with every record it appended counted; the next term
// resumes after the stranger's message.
func TestPublishFencedMidBurst(t *testing.T) {
	const at = 8
	for _, maxInFlight := range []int{256, 1} {
		t.Run(fmt.Sprintf("max-in-flight=%d", maxInFlight), func(t *testing.T) {
			n := startNATS(t)
			e := newTestEtcd(t)
			e.start(t)
			start, burst := burstWhileAway(t, e, n, 100)
			stranger := strangerMsg(t, n.js, stream.Progress(burst[len(burst)-1]))

			var sends atomic.Int64
			appended := make(chan error, 1)
			sent := withSent(func(int) {
				if sends.Add(1) == at {
					_, err := n.js.PublishMsg(context.Background(), stranger)
					appended <- err
				}
			})
			a := startReplicaWith(t, e.url(), n.url, "a", []Option{sent}, fmt.Sprintf("--publish.max-in-flight=%d", maxInFlight))
			_, next := a.leads(t, 0)
			line, next := a.log.wait(t, next, "leadership term ended; campaigning again")
			if err := <-appended; err != nil {
				t.Fatalf("the other writer's append: %v", err)
			}
			if !strings.Contains(line, "stream was appended to by another writer") {
				t.Fatalf("the term ended with %q, want fenced", line)
			}
			got := msgIDs(t, n.js)
			kept := len(got) - 2 // the start marker and the stranger's
			lowest := 0
			if maxInFlight == 1 {
				lowest = at - 1 // only the 8th was in flight
			}
			if kept < lowest || kept > at {
				t.Fatalf("the stream holds %q: %d records of the burst, want %d to %d", got, kept, lowest, at)
			}
			strangerID := stream.MsgID(stream.Progress(burst[len(burst)-1]))
			if want := ids([]string{progressID(start)}, revs(burst[:kept]...), []string{strangerID}); !slices.Equal(got, want) {
				t.Fatalf("the stream holds %q, want %q", got, want)
			}
			if a.fenced() != 1 || a.appended() != kept {
				t.Fatalf("the fenced leader: %d failures counted fenced, %d records appended; want 1 and %d", a.fenced(), a.appended(), kept)
			}
			if got := testutil.ToFloat64(a.m.failures.WithLabelValues("nats")); got != 0 {
				t.Fatalf("herald_ingest_failures_total{cause=nats} = %v", got)
			}

			a.clock.Step(a.clock.nextTimer(t))
			resume, _ := a.leads(t, next)
			if want := fmt.Sprintf("revision=%d skipParts=0 lastSequence=%d", burst[len(burst)-1]+1, len(got)); resume != want {
				t.Fatalf("the next term resumes at %q, want %q", resume, want)
			}
			after := e.put(t, "after")
			waitIDs(t, n.js, ids(got, revs(after))...)
		})
	}
}

// strangerMsg is rec as another writer appends it: its message id in the
// stream's generation, no expectation.
func strangerMsg(t *testing.T, js jetstream.JetStream, rec *heraldv1.Record) *nats.Msg {
	t.Helper()
	st, err := js.Stream(t.Context(), "HERALD")
	if err != nil {
		t.Fatal(err)
	}
	gen, _ := stream.GenerationOf(st.CachedInfo().Config.Metadata)
	data, err := stream.Encode(rec)
	if err != nil {
		t.Fatal(err)
	}
	return &nats.Msg{Subject: stream.SubjectProgress, Data: data,
		Header: nats.Header{jetstream.MsgIDHeader: []string{stream.GenerationMsgID(gen.Number, rec)}}}
}
