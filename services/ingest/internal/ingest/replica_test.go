package ingest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/stream"
)

// What the election, fencing and resume tests share: replicas on a fake
// clock with their log recorded, on the real etcd and NATS that
// generation_test.go starts, and the stream read back message by message
// with its message ids.

// testClock is a fake clock that reports every timer and ticker a replica
// arms, so that a test steps it once the replica waits on it, never before.
type testClock struct {
	*clocktesting.FakeClock
	timers  chan time.Duration
	tickers chan time.Duration
}

func newTestClock() *testClock {
	return &testClock{
		FakeClock: clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0)),
		timers:    make(chan time.Duration, 64),
		tickers:   make(chan time.Duration, 64),
	}
}

func (c *testClock) NewTimer(d time.Duration) clock.Timer {
	t := c.FakeClock.NewTimer(d)
	c.timers <- d
	return t
}

func (c *testClock) NewTicker(d time.Duration) clock.Ticker {
	t := c.FakeClock.NewTicker(d)
	c.tickers <- d
	return t
}

// nextTimer waits until the replica arms its next timer (a backoff) and
// returns its duration.
func (c *testClock) nextTimer(t *testing.T) time.Duration {
	t.Helper()
	select {
	case d := <-c.timers:
		return d
	case <-time.After(20 * time.Second):
		t.Fatal("after 20s, no timer armed")
		return 0
	}
}

// nextTicker waits until the replica arms its progress ticker (a term
// starts watching etcd).
func (c *testClock) nextTicker(t *testing.T) time.Duration {
	t.Helper()
	select {
	case d := <-c.tickers:
		return d
	case <-time.After(20 * time.Second):
		t.Fatal("after 20s, no ticker armed")
		return 0
	}
}

// stepUntil steps the clock through every timer the replica arms (its
// backoffs) until cond holds, for up to 20 s.
func (c *testClock) stepUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for !cond() {
		select {
		case d := <-c.timers:
			c.Step(d)
		case <-time.After(20 * time.Millisecond): // cond is polled; nothing to wait on
		case <-deadline:
			t.Fatalf("after 20s, not yet: %s", what)
		}
	}
}

// logRecorder keeps a replica's log lines (the message and its attributes,
// "msg k=v k=v") so that a test waits for one.
type logRecorder struct {
	mu    sync.Mutex
	lines []string
	added chan struct{} // closed (and replaced) when a line is added
}

func newLogRecorder() *logRecorder { return &logRecorder{added: make(chan struct{})} }

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecorder) WithGroup(string) slog.Handler            { return l }

func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%s", a.Key, a.Value)
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, b.String())
	close(l.added)
	l.added = make(chan struct{})
	return nil
}

// mark is the position of the next line: wait(mark, ...) finds only lines
// logged from then on.
func (l *logRecorder) mark() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.lines)
}

// wait returns the first line from position from on that contains every
// one of parts, waiting up to 20 s for it, and the position after it.
func (l *logRecorder) wait(t *testing.T, from int, parts ...string) (string, int) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		l.mu.Lock()
		for n := from; n < len(l.lines); n++ {
			if containsAll(l.lines[n], parts) {
				line := l.lines[n]
				l.mu.Unlock()
				return line, n + 1
			}
		}
		added := l.added
		l.mu.Unlock()
		select {
		case <-added:
		case <-deadline:
			t.Fatalf("after 20s, no log line with %q; the log:\n%s", parts, l.String())
		}
	}
}

// count is how many lines contain every one of parts.
func (l *logRecorder) count(parts ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if containsAll(line, parts) {
			n++
		}
	}
	return n
}

func (l *logRecorder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

func containsAll(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// testConfig is a replica's configuration on etcdURL and natsURL: the
// defaults, a short lease and backoff, then flags.
func testConfig(t testing.TB, etcdURL, natsURL string, flags ...string) Config {
	t.Helper()
	var cfg Config
	fs := flag.NewFlagSet("ingest", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	args := append([]string{"--etcd.endpoints=" + etcdURL, "--nats.url=" + natsURL,
		"--progress-interval=100ms", "--election.lease-ttl=1s", "--retry-backoff=50ms"}, flags...)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// replica is one ingest replica running on a fake clock, its log recorded.
type replica struct {
	*Ingest
	clock *testClock
	log   *logRecorder
	stop  func() // cancels Run and waits for it to return
}

// startReplica runs a replica named name (its election value) until stop.
func startReplica(t *testing.T, etcdURL, natsURL, name string, flags ...string) *replica {
	t.Helper()
	return startReplicaWith(t, etcdURL, natsURL, name, nil, flags...)
}

// startReplicaWith is startReplica with options opts.
func startReplicaWith(t *testing.T, etcdURL, natsURL, name string, opts []Option, flags ...string) *replica {
	t.Helper()
	r := &replica{clock: newTestClock(), log: newLogRecorder()}
	opts = append([]Option{WithClock(r.clock)}, opts...)
	in, err := New(testConfig(t, etcdURL, natsURL, flags...), slog.New(r.log), prometheus.NewRegistry(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	in.id = name
	r.Ingest = in
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); in.Run(ctx) }()
	var once sync.Once
	r.stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(r.stop)
	return r
}

// leads waits until r wins an election (from log position from on) and
// resumes from the stream, and returns the revision and part it resumes at
// and the position after that line.
func (r *replica) leads(t *testing.T, from int) (resume string, next int) {
	t.Helper()
	_, next = r.log.wait(t, from, "became ingest leader", "id="+r.id)
	line, next := r.log.wait(t, next, "resuming from the stream")
	return strings.TrimPrefix(line, "resuming from the stream "), next
}

// appended is how many stream messages r appended (revisions' parts and
// markers).
func (r *replica) appended() int {
	return int(testutil.ToFloat64(r.m.records.WithLabelValues("revision")) + testutil.ToFloat64(r.m.records.WithLabelValues("progress")))
}

// waitAppended waits until r's count of appended records is n: the
// stream may show a record before its writer has its acknowledgement.
func (r *replica) waitAppended(t *testing.T, n int) {
	t.Helper()
	waitGauge(t, r.id+"'s appended records", func() float64 { return float64(r.appended()) }, float64(n))
}

// fenced is how many of r's appends the stream refused.
func (r *replica) fenced() int {
	return int(testutil.ToFloat64(r.m.failures.WithLabelValues("fenced")))
}

// electionKeys are the keys of the ingest election, oldest first: the
// first is the leader's, each holds its replica's name.
func electionKeys(t *testing.T, cli *clientv3.Client) []*mvccpb.KeyValue {
	t.Helper()
	resp, err := cli.Get(t.Context(), "/herald/ingest/leader/", clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Kvs
}

// candidates are the names of the replicas campaigning, the leader first.
func candidates(t *testing.T, cli *clientv3.Client) []string {
	t.Helper()
	var names []string
	for _, kv := range electionKeys(t, cli) {
		names = append(names, string(kv.Value))
	}
	return names
}

// waitCandidates waits until the election's candidates are names, in
// order.
func waitCandidates(t *testing.T, cli *clientv3.Client, names ...string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for got := candidates(t, cli); !slices.Equal(got, names); got = candidates(t, cli) {
		if time.Now().After(deadline) {
			t.Fatalf("after 20s, the election's candidates are %q, want %q", got, names)
		}
		time.Sleep(20 * time.Millisecond) // polling etcd's keys; nothing to wait on
	}
}

// expire ends the leader's lease as etcd does when its TTL runs out: its
// election key goes, and the next candidate leads.
func expire(t *testing.T, cli *clientv3.Client, name string) {
	t.Helper()
	keys := electionKeys(t, cli)
	if len(keys) == 0 || string(keys[0].Value) != name {
		t.Fatalf("%s is not the leader: candidates %q", name, candidates(t, cli))
	}
	if _, err := cli.Revoke(t.Context(), clientv3.LeaseID(keys[0].Lease)); err != nil {
		t.Fatal(err)
	}
}

// msgIDs reads every message of the stream, in order, checks that each
// carries its record's message id (in the stream's generation) and that no
// id appears twice, and returns the ids: "<rev>.<part>", "p<rev>",
// "r<rev>".
func msgIDs(t *testing.T, js jetstream.JetStream) []string {
	t.Helper()
	st, err := js.Stream(t.Context(), "HERALD")
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	gen, _ := stream.GenerationOf(info.Config.Metadata)
	var ids []string
	seen := map[string]bool{}
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		msg, err := st.GetMsg(t.Context(), seq)
		if err != nil {
			t.Fatalf("stream message %d: %v", seq, err)
		}
		rec, err := stream.Decode(msg.Data)
		if err != nil {
			t.Fatal(err)
		}
		id := msg.Header.Get(jetstream.MsgIDHeader)
		if want := stream.GenerationMsgID(gen.Number, rec); id != want {
			t.Fatalf("stream message %d holds %s under message id %q", seq, want, id)
		}
		if seen[id] {
			t.Fatalf("stream message %d: %s appended twice: %q", seq, id, ids)
		}
		seen[id] = true
		ids = append(ids, stream.MsgID(rec))
	}
	return ids
}

// waitIDs waits until the stream's message ids are want, and fails as soon
// as they are not a prefix of want (a record out of order, twice, or one
// that should not be there).
func waitIDs(t *testing.T, js jetstream.JetStream, want ...string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := msgIDs(t, js)
		if len(got) > len(want) || !slices.Equal(got, want[:len(got)]) {
			t.Fatalf("the stream holds %q, want %q", got, want)
		}
		if len(got) == len(want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 20s, the stream holds %q, want %q", got, want)
		}
		time.Sleep(20 * time.Millisecond) // polling the stream's state; nothing to wait on
	}
}

// revs are the message ids of whole revisions (one part each).
func revs(revisions ...int64) []string {
	ids := make([]string, len(revisions))
	for n, rev := range revisions {
		ids[n] = stream.MsgID(&heraldv1.Record{Revision: rev, Parts: 1})
	}
	return ids
}

func progressID(rev int64) string { return stream.MsgID(stream.Progress(rev)) }
func resyncID(rev int64) string   { return stream.MsgID(stream.Resync(rev)) }

// ids concatenates message id lists.
func ids(lists ...[]string) []string { return slices.Concat(lists...) }

// puts writes pods names in order and returns their revisions.
func (te *testEtcd) puts(t *testing.T, names ...string) []int64 {
	t.Helper()
	revs := make([]int64, len(names))
	for n, name := range names {
		revs[n] = te.put(t, name)
	}
	return revs
}

// revision is etcd's current revision.
func (te *testEtcd) revision(t *testing.T) int64 {
	t.Helper()
	rev, err := stream.CurrentRevision(t.Context(), te.cli)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}
