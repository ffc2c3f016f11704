package ingest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"

	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/stream"
)

// The generation rules on real etcd and NATS: ingest runs on one etcd, then
// on an etcd that holds another history, and the stream must end up with
// that etcd's history only, opened by a resync marker.

func freePort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// testEtcd is an embedded single-member etcd in dir, on fixed addresses
// so that it can be stopped and started again (or started on a copy of
// its data: a restore from a backup).
type testEtcd struct {
	dir, client, peer string
	e                 *embed.Etcd
	cli               *clientv3.Client
}

func newTestEtcd(t *testing.T) *testEtcd {
	return &testEtcd{dir: filepath.Join(t.TempDir(), "etcd"), client: freePort(t), peer: freePort(t)}
}

func (te *testEtcd) url() string { return "http://" + te.client }

func (te *testEtcd) start(t *testing.T) {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = "ingest-test", te.dir
	cu, _ := url.Parse(te.url())
	pu, _ := url.Parse("http://" + te.peer)
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	cfg.LogLevel, cfg.LogOutputs, cfg.ListenMetricsUrls = "error", []string{filepath.Join(filepath.Dir(te.dir), "etcd.log")}, nil
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		t.Fatal("etcd did not become ready")
	}
	te.e = e
	te.cli, err = clientv3.New(clientv3.Config{Endpoints: []string{te.url()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(te.stop)
}

func (te *testEtcd) stop() {
	if te.e == nil {
		return
	}
	te.cli.Close()
	te.e.Close()
	te.e = nil
}

// put writes pod ns/name and returns the revision.
func (te *testEtcd) put(t *testing.T, name string) int64 {
	t.Helper()
	resp, err := te.cli.Put(t.Context(), "/registry/pods/default/"+name, fmt.Sprintf(`{"kind":"Pod","metadata":{"name":%q}}`, name))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

func (te *testEtcd) clusterID(t *testing.T) uint64 {
	t.Helper()
	resp, err := te.cli.Get(t.Context(), "/x")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.ClusterId
}

type testNATS struct {
	url string
	js  jetstream.JetStream
}

func startNATS(t testing.TB) *testNATS {
	t.Helper()
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: filepath.Join(t.TempDir(), "nats"), NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats did not become ready")
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &testNATS{url: ns.ClientURL(), js: js}
}

// runIngest runs one ingest replica on etcd and NATS until the returned
// stop is called.
func runIngest(t *testing.T, etcdURL, natsURL string) (stop func()) {
	t.Helper()
	var cfg Config
	fs := flag.NewFlagSet("ingest", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	if err := fs.Parse([]string{"--etcd.endpoints=" + etcdURL, "--nats.url=" + natsURL, "--progress-interval=100ms",
		"--election.lease-ttl=1s", "--retry-backoff=50ms"}); err != nil {
		t.Fatal(err)
	}
	in, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); in.Run(ctx) }()
	var once bool
	stop = func() {
		if !once {
			once = true
			cancel()
			<-done
		}
	}
	t.Cleanup(stop)
	return stop
}

// leading waits until the stream holds a record (a leader appended its
// start marker), so that what is written next is in the stream's history.
func leading(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	waitStream(t, js, "a record", func(recs []*heraldv1.Record, _ stream.Generation) bool { return len(recs) > 0 })
}

// records reads every record the stream holds, in order.
func records(t *testing.T, js jetstream.JetStream) []*heraldv1.Record {
	t.Helper()
	st, err := js.Stream(t.Context(), "HERALD")
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil // not created yet
	}
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var out []*heraldv1.Record
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		rec, err := stream.ReadAt(t.Context(), st, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, rec)
	}
	return out
}

// waitStream waits until cond holds for the stream's records and
// generation (up to 20 s), and fails with what the stream holds otherwise.
func waitStream(t *testing.T, js jetstream.JetStream, what string, cond func([]*heraldv1.Record, stream.Generation) bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		recs := records(t, js)
		var gen stream.Generation
		if st, err := js.Stream(t.Context(), "HERALD"); err == nil {
			gen, _ = stream.GenerationOf(st.CachedInfo().Config.Metadata)
		} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Fatal(err)
		}
		if cond(recs, gen) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 20s, the stream does not hold %s: generation %+v, records %s", what, gen, describe(recs))
		}
		time.Sleep(50 * time.Millisecond) // polling the stream's state; nothing to wait on
	}
}

func describe(recs []*heraldv1.Record) string {
	s := ""
	for _, r := range recs {
		switch {
		case r.Resync:
			s += fmt.Sprintf(" resync@%d", r.Revision)
		case r.Progress:
			s += fmt.Sprintf(" progress@%d", r.Revision)
		default:
			s += fmt.Sprintf(" %d", r.Revision)
		}
	}
	return "[" + s + " ]"
}

// hasRevision: the stream holds the changes of revision rev.
func hasRevision(recs []*heraldv1.Record, rev int64) bool {
	for _, r := range recs {
		if !stream.IsMarker(r) && r.Revision == rev {
			return true
		}
	}
	return false
}

// newGeneration: the stream starts with a resync marker, holds no changes
// of the discarded revisions and records generation 2 of etcd clusterID.
func newGeneration(clusterID uint64, discarded []int64) func([]*heraldv1.Record, stream.Generation) bool {
	return func(recs []*heraldv1.Record, gen stream.Generation) bool {
		if len(recs) == 0 || !recs[0].Resync || gen.Number != 2 || gen.ClusterID != clusterID {
			return false
		}
		for _, rev := range discarded {
			if hasRevision(recs, rev) {
				return false
			}
		}
		return true
	}
}

// TestGenerationClusterIDChanged: the stream holds etcd A's history and
// ingest is pointed at etcd B (a further revision than A's last, so only
// the cluster ID tells): a new generation, none of A's changes left.
func TestGenerationClusterIDChanged(t *testing.T) {
	n := startNATS(t)
	a := newTestEtcd(t)
	a.start(t)
	var aRevs []int64
	stop := runIngest(t, a.url(), n.url)
	leading(t, n.js)
	for i := range 3 {
		aRevs = append(aRevs, a.put(t, fmt.Sprintf("a%d", i)))
	}
	waitStream(t, n.js, "etcd A's changes", func(recs []*heraldv1.Record, _ stream.Generation) bool { return hasRevision(recs, aRevs[2]) })
	stop()

	b := newTestEtcd(t)
	b.start(t)
	var bRev int64
	for i := range 20 {
		bRev = b.put(t, fmt.Sprintf("b%d", i))
	}
	if bRev <= aRevs[2] {
		t.Fatalf("etcd B at %d, not past A's %d", bRev, aRevs[2])
	}
	runIngest(t, b.url(), n.url)
	waitStream(t, n.js, "only etcd B's history (generation 2, a resync marker first)", newGeneration(b.clusterID(t), aRevs))
	bNext := b.put(t, "b-after")
	waitStream(t, n.js, "B's next change", func(recs []*heraldv1.Record, _ stream.Generation) bool { return hasRevision(recs, bNext) })
}

// TestGenerationRevisionRegression: etcd is restored from a backup of its
// data taken earlier (same cluster, an older revision): a new generation
// whose floor is the discarded history's last revision.
func TestGenerationRevisionRegression(t *testing.T) {
	n := startNATS(t)
	e := newTestEtcd(t)
	e.start(t)
	stop := runIngest(t, e.url(), n.url)
	leading(t, n.js)
	for i := range 3 {
		e.put(t, fmt.Sprintf("p%d", i))
	}
	e.stop()
	stop()
	backup := e.dir + ".backup"
	if err := os.CopyFS(backup, os.DirFS(e.dir)); err != nil {
		t.Fatal(err)
	}
	e.start(t)
	stop = runIngest(t, e.url(), n.url)
	var discarded []int64
	for i := range 20 {
		discarded = append(discarded, e.put(t, fmt.Sprintf("q%d", i)))
	}
	last := discarded[len(discarded)-1]
	waitStream(t, n.js, "the history to be discarded", func(recs []*heraldv1.Record, _ stream.Generation) bool { return hasRevision(recs, last) })
	stop()
	e.stop()

	e.dir = backup // the restore
	e.start(t)
	runIngest(t, e.url(), n.url)
	waitStream(t, n.js, "only the restored history (generation 2, a resync marker first)", newGeneration(e.clusterID(t), discarded))
	next := e.put(t, "after-restore")
	if next > last {
		t.Fatalf("the restored etcd is at %d, not behind the discarded history's %d", next, last)
	}
	waitStream(t, n.js, "the restored etcd's next change", func(recs []*heraldv1.Record, _ stream.Generation) bool { return hasRevision(recs, next) })
	st, _ := n.js.Stream(t.Context(), "HERALD")
	if gen, _ := stream.GenerationOf(st.CachedInfo().Config.Metadata); gen.Floor < last {
		t.Errorf("generation %+v: floor below the discarded history's last revision %d", gen, last)
	}
}

// TestGenerationCompactedStart: etcd compacted past the stream's last
// revision while ingest was away (or was restored with --mark-compacted):
// the stream's history does not connect to etcd's, a new generation.
func TestGenerationCompactedStart(t *testing.T) {
	n := startNATS(t)
	e := newTestEtcd(t)
	e.start(t)
	stop := runIngest(t, e.url(), n.url)
	leading(t, n.js)
	var old []int64
	for i := range 3 {
		old = append(old, e.put(t, fmt.Sprintf("p%d", i)))
	}
	waitStream(t, n.js, "the first changes", func(recs []*heraldv1.Record, _ stream.Generation) bool { return hasRevision(recs, old[2]) })
	stop()
	var rev int64
	for i := range 10 {
		rev = e.put(t, fmt.Sprintf("q%d", i))
	}
	if _, err := e.cli.Compact(t.Context(), rev, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	runIngest(t, e.url(), n.url)
	waitStream(t, n.js, "a new generation after the compaction", newGeneration(e.clusterID(t), old))
	next := e.put(t, "after-compaction")
	waitStream(t, n.js, "the next change", func(recs []*heraldv1.Record, _ stream.Generation) bool { return hasRevision(recs, next) })
}
