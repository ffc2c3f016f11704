package cache

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"

	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/stream"
)

// A restarted shard on real etcd and NATS: the test writes to etcd and
// appends every revision to the stream as ingest does.

// history is etcd and the stream, kept in step by put.
type history struct {
	etcd    *clientv3.Client
	js      jetstream.JetStream
	st      jetstream.Stream
	etcdURL string
	natsURL string
	revs    []int64 // every revision put wrote, in order
	gen     int64   // the generation message ids name (recreate)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func startHistory(t *testing.T) *history {
	t.Helper()
	dir := t.TempDir()
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = "cache-test", filepath.Join(dir, "etcd")
	cu, _ := url.Parse("http://" + freeAddr(t))
	pu, _ := url.Parse("http://" + freeAddr(t))
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	cfg.LogLevel, cfg.LogOutputs, cfg.ListenMetricsUrls = "error", []string{filepath.Join(dir, "etcd.log")}, nil
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		t.Fatal("etcd did not become ready")
	}
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: filepath.Join(dir, "nats"), NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats did not become ready")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{cu.String()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "HERALD", Subjects: stream.Subjects(), Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	return &history{etcd: cli, js: js, st: st, etcdURL: cu.String(), natsURL: ns.ClientURL()}
}

// put writes pod ns/name (generation gen) to etcd and appends its revision
// to the stream.
func (h *history) put(t *testing.T, ns, name string, gen int) int64 {
	t.Helper()
	key := "/registry/pods/" + ns + "/" + name
	v := fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":%q,"namespace":%q},"spec":{"nodeName":"n1"},"status":{"observedGeneration":%d}}`, name, ns, gen)
	resp, err := h.etcd.Put(t.Context(), key, v, clientv3.WithPrevKV())
	if err != nil {
		t.Fatal(err)
	}
	rev := resp.Header.Revision
	created := rev
	if resp.PrevKv != nil {
		created = resp.PrevKv.CreateRevision
	}
	changes := []*heraldv1.Change{{Kind: heraldv1.Change_PUT, Key: key, Value: []byte(v), CreateRevision: created}}
	for _, rec := range stream.Frame(rev, changes, 1<<20, 0) {
		h.publish(t, stream.SubjectOf(registry(t), changes), rec)
	}
	h.revs = append(h.revs, rev)
	return rev
}

// publish appends rec on subject, under its message id in h's generation.
func (h *history) publish(t *testing.T, subject string, rec *heraldv1.Record) {
	t.Helper()
	data, err := stream.Encode(rec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.js.Publish(t.Context(), subject, data, jetstream.WithMsgID(stream.GenerationMsgID(h.gen, rec))); err != nil {
		t.Fatal(err)
	}
}

// startShard runs a shard on h (windows of 100 events, rebuilt from up to
// rebuild messages, then flags) until the test ends, and returns it, its
// server and its metrics once it is ready.
func startShard(t *testing.T, h *history, rebuild int, flags ...string) (*Shard, *Server, *prometheus.Registry) {
	t.Helper()
	var cfg Config
	fs := flag.NewFlagSet("cache", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	if err := fs.Parse(append([]string{"--etcd.endpoints=" + h.etcdURL, "--nats.url=" + h.natsURL, "--default-watch-cache-size=100",
		fmt.Sprintf("--window.rebuild-messages=%d", rebuild)}, flags...)); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-s.FirstReady():
	case err := <-done:
		t.Fatalf("shard stopped: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("shard not ready after 30s")
	}
	return s, NewServer(s), reg
}

// TestRestartRebuildsTheWindow: a shard that starts on a stream with
// history rebuilds its windows from the stream's last messages, so a watch
// resuming from a revision among them (every client of a replica that was
// just restarted) is served from memory, with no deep replay; one older
// than that is still replayed from the stream. The shard is ready only
// once it has applied what the stream held when it started.
func TestRestartRebuildsTheWindow(t *testing.T) {
	h := startHistory(t)
	for i := range 40 {
		h.put(t, []string{"a", "b"}[i%2], fmt.Sprintf("p%d", i%5), i)
	}
	last := h.revs[len(h.revs)-1]

	s, v, _ := startShard(t, h, 20)
	if s.Head() != last {
		t.Fatalf("ready at revision %d, want the stream's head %d", s.Head(), last)
	}
	// The last 20 messages are the last 20 revisions: the window starts
	// at the revision before them.
	from := h.revs[len(h.revs)-20] - 1
	var want []string
	for _, rev := range h.revs[len(h.revs)-20:] {
		want = append(want, fmt.Sprint(rev))
	}
	got, _, err := watch(t, v, &heraldv1.WatchRequest{Resource: "pods", AfterRevision: from})
	if err != nil {
		t.Fatal(err)
	}
	if revisions := eventRevs(got); !slices.Equal(revisions, want) {
		t.Errorf("resume after %d: revisions %v, want %v", from, revisions, want)
	}
	if n := testutil.ToFloat64(s.m.deepReplays); n != 0 {
		t.Errorf("%v deep replays for a resume within the rebuilt window, want 0", n)
	}
	if n := testutil.ToFloat64(s.m.rebuilt); n != 20 {
		t.Errorf("%v revisions rebuilt into the window, want 20", n)
	}
	// A LIST at a revision inside the rebuilt window is served too.
	if _, err := v.List(t.Context(), &heraldv1.ListRequest{Resource: "pods", ResourceVersion: fmt.Sprint(from + 1), ResourceVersionMatch: "Exact"}); err != nil {
		t.Errorf("LIST at %d (inside the rebuilt window): %v", from+1, err)
	}

	// Older than the rebuilt window: replayed from the stream, once.
	older := h.revs[5]
	got, _, err = watch(t, v, &heraldv1.WatchRequest{Resource: "pods", AfterRevision: older})
	if err != nil {
		t.Fatal(err)
	}
	if revisions := eventRevs(got); len(revisions) != len(h.revs)-6 {
		t.Errorf("deep resume after %d: %d events, want %d", older, len(revisions), len(h.revs)-6)
	}
	if n := testutil.ToFloat64(s.m.deepReplays); n != 1 {
		t.Errorf("%v deep replays for a resume older than the window, want 1", n)
	}
	// Neither the rebuild nor the replay left a consumer behind: only the
	// shard's own follows the stream.
	eventually(t, "one consumer on the stream", func() string {
		info, err := h.st.Info(t.Context())
		if err != nil {
			return err.Error()
		}
		if info.State.Consumers != 1 {
			return fmt.Sprintf("%d consumers", info.State.Consumers)
		}
		return ""
	})
}

// TestRestartAfterCompaction: when etcd no longer holds the revision the
// windows would be rebuilt from, the shard starts at etcd's current
// revision with empty windows (resumes before it are deep replays).
func TestRestartAfterCompaction(t *testing.T) {
	h := startHistory(t)
	for i := range 10 {
		h.put(t, "a", fmt.Sprintf("p%d", i%3), i)
	}
	last := h.revs[len(h.revs)-1]
	if _, err := h.etcd.Compact(t.Context(), last); err != nil {
		t.Fatal(err)
	}
	s, v, _ := startShard(t, h, 5)
	if s.Head() != last || testutil.ToFloat64(s.m.rebuilt) != 0 {
		t.Fatalf("head %d, %v revisions rebuilt; want %d, 0", s.Head(), testutil.ToFloat64(s.m.rebuilt), last)
	}
	if _, err := v.List(t.Context(), &heraldv1.ListRequest{Resource: "pods", ResourceVersion: fmt.Sprint(last - 1), ResourceVersionMatch: "Exact"}); err == nil {
		t.Error("LIST before the start of an empty window: no error")
	}
}

// eventRevs are the revisions of the events in watch's flattened output
// ("rev:name"), bookmarks ("rev:") left out.
func eventRevs(flat []string) []string {
	var out []string
	for _, f := range flat {
		if rev, name, _ := strings.Cut(f, ":"); name != "" {
			out = append(out, rev)
		}
	}
	return out
}

// eventually polls cond (a description of what is still wrong, "" when
// done) until it holds or 10s pass.
func eventually(t *testing.T, what string, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		msg := cond()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %s", what, msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
