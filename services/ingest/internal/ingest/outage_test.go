package ingest

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"herald.dev/libs/stream"
)

// NATS unavailable, on a real server: the replica retries on its clock
// and, once NATS is back, resumes from what the stream holds, not from what
// it believes it appended.

// restartableNATS is a NATS server on a fixed port and store, so that it
// can be stopped and started again with its streams.
type restartableNATS struct {
	opts natsserver.Options
	ns   *natsserver.Server
}

func newRestartableNATS(t *testing.T, jetStream bool) *restartableNATS {
	t.Helper()
	_, port, _ := strings.Cut(freePort(t), ":")
	p, _ := strconv.Atoi(port)
	return &restartableNATS{opts: natsserver.Options{Host: "127.0.0.1", Port: p, JetStream: jetStream,
		StoreDir: filepath.Join(t.TempDir(), "nats"), NoSigs: true, NoLog: true}}
}

func (r *restartableNATS) url() string { return fmt.Sprintf("nats://%s:%d", r.opts.Host, r.opts.Port) }

func (r *restartableNATS) start(t *testing.T) {
	t.Helper()
	opts := r.opts
	ns, err := natsserver.NewServer(&opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats did not become ready")
	}
	r.ns = ns
	t.Cleanup(r.stop)
}

func (r *restartableNATS) stop() {
	if r.ns != nil {
		r.ns.Shutdown()
		r.ns.WaitForShutdown()
		r.ns = nil
	}
}

// reader is a connection that reads the stream across restarts.
func (r *restartableNATS) reader(t *testing.T) *testNATS {
	t.Helper()
	nc, js, err := stream.Connect(r.url(), "ingest-test-reader", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return &testNATS{url: r.url(), js: js}
}

// waitReady waits until r.Ready() returns nil (want "") or an error
// containing want.
func waitReady(t *testing.T, r *replica, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := r.Ready()
		if (want == "" && err == nil) || (want != "" && err != nil && strings.Contains(err.Error(), want)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 20s, %s's readiness is %v, want %q", r.id, err, want)
		}
		time.Sleep(10 * time.Millisecond) // polling readiness; nothing to wait on
	}
}

// TestStreamCreationRetries: without JetStream the replica cannot create
// the stream; it is not ready and retries on its clock, the backoff
// doubling, and leads as soon as JetStream is there.
func TestStreamCreationRetries(t *testing.T) {
	n := newRestartableNATS(t, false)
	n.start(t)
	e := newTestEtcd(t)
	e.start(t)
	a := startReplica(t, e.url(), n.url(), "a")
	var waits []time.Duration
	for attempt := range 4 {
		d := a.clock.nextTimer(t)
		waits = append(waits, d)
		if err := a.Ready(); err == nil || !strings.Contains(err.Error(), "the stream is not set up yet") {
			t.Fatalf("without its stream, the replica's readiness is %v", err)
		}
		if attempt < 3 {
			a.clock.Step(d)
		}
	}
	if want := []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond}; !slices.Equal(waits, want) {
		t.Fatalf("waits before creating the stream again %v, want %v", waits, want)
	}
	if got := a.log.count("cannot create or update the stream; retrying"); got != 4 {
		t.Fatalf("%d failed attempts logged, want 4", got)
	}
	// The replica waits out its fourth backoff: JetStream is there when it
	// tries again.
	if err := n.ns.EnableJetStream(&natsserver.JetStreamConfig{StoreDir: n.opts.StoreDir}); err != nil {
		t.Fatal(err)
	}
	a.clock.Step(waits[3])
	a.leads(t, 0)
	waitIDs(t, n.reader(t).js, progressID(e.revision(t)))
	waitReady(t, a, "")
}

// TestNATSOutage: NATS stops while the leader appends a revision; the
// append times out and the term ends, but the message, buffered by the
// client, lands when NATS is back (it still follows the sequence it
// expected). The next term resumes after it, from what the stream holds,
// and appends it no second time.
func TestNATSOutage(t *testing.T) {
	n := newRestartableNATS(t, true)
	n.start(t)
	e := newTestEtcd(t)
	e.start(t)
	a := startReplica(t, e.url(), n.url(), "a")
	_, next := a.leads(t, 0)
	start := e.revision(t)
	r := n.reader(t)
	first := e.put(t, "p1")
	want := ids([]string{progressID(start)}, revs(first))
	waitIDs(t, r.js, want...)

	n.stop()
	waitReady(t, a, "not connected to NATS")
	lost := e.put(t, "p2")
	line, _ := a.log.wait(t, next, "leadership term ended; campaigning again")
	if !strings.Contains(line, fmt.Sprintf("publishing %d.0", lost)) {
		t.Fatalf("the term ended with %q, want the append of %d failed", line, lost)
	}
	if got := testutil.ToFloat64(a.m.failures.WithLabelValues("nats")); got != 1 {
		t.Fatalf("herald_ingest_failures_total{cause=nats} = %v, want 1", got)
	}
	n.start(t)
	waitReady(t, a, "")
	want = ids(want, revs(lost))
	waitIDs(t, r.js, want...)

	a.clock.Step(a.clock.nextTimer(t))
	resume, _ := a.leads(t, next)
	if w := fmt.Sprintf("revision=%d skipParts=0 lastSequence=3", lost+1); resume != w {
		t.Fatalf("after the outage, the leader resumes at %q, want %q", resume, w)
	}
	after := e.put(t, "p3")
	waitIDs(t, r.js, ids(want, revs(after))...)
}
