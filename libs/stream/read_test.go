package stream

import (
	"context"
	"errors"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// testStream starts an in-process NATS server with JetStream and returns an
// empty stream configured as ingest configures it, and a way to append to
// it.
func testStream(t *testing.T) (jetstream.Stream, func(subject string, data []byte) uint64) {
	t.Helper()
	ns, err := natsserver.NewServer(&natsserver.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true,
	})
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
	ctx := t.Context()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "HERALD", Subjects: Subjects(), Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	return st, func(subject string, data []byte) uint64 {
		t.Helper()
		ack, err := js.Publish(ctx, subject, data)
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
}

func appendRecord(t *testing.T, pub func(string, []byte) uint64, rec *heraldv1.Record) uint64 {
	t.Helper()
	subject := SubjectMulti
	if IsMarker(rec) {
		subject = SubjectProgress
	}
	return pub(subject, encode(t, rec))
}

func TestReadEmptyStream(t *testing.T) {
	st, _ := testStream(t)
	ctx := t.Context()
	if seq, rec, err := Last(ctx, st); seq != 0 || rec != nil || err != nil {
		t.Errorf("Last = %d, %v, %v; want 0, nil, nil", seq, rec, err)
	}
	if seq, err := SeqAfter(ctx, st, 10); seq != 1 || err != nil {
		t.Errorf("SeqAfter = %d, %v; want 1", seq, err)
	}
	if _, err := HistoryStart(ctx, st); !errors.Is(err, ErrEmpty) {
		t.Errorf("HistoryStart = %v, want ErrEmpty", err)
	}
	if _, err := ReadAt(ctx, st, 1); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("ReadAt(1) = %v, want ErrMsgNotFound", err)
	}
}

func TestRead(t *testing.T) {
	st, pub := testStream(t)
	ctx := t.Context()
	recs := []*heraldv1.Record{
		Progress(10),   // 1
		part(12, 0, 1), // 2
		part(15, 0, 3), // 3
		part(15, 1, 3), // 4
		part(15, 2, 3), // 5
		Progress(16),   // 6
		part(20, 0, 2), // 7
		part(20, 1, 2), // 8
	}
	for i, rec := range recs {
		if seq := appendRecord(t, pub, rec); seq != uint64(i+1) {
			t.Fatalf("record %d appended at %d", i, seq)
		}
	}
	for i, want := range recs {
		got, err := ReadAt(ctx, st, uint64(i+1))
		if err != nil || !proto.Equal(got, want) {
			t.Errorf("ReadAt(%d) = %v, %v; want %v", i+1, got, err, want)
		}
	}
	if seq, rec, err := Last(ctx, st); seq != 8 || err != nil || !proto.Equal(rec, recs[7]) {
		t.Errorf("Last = %d, %v, %v", seq, rec, err)
	}
	for _, tc := range []struct {
		rev int64
		seq uint64
	}{
		{0, 1}, {9, 1}, {10, 2}, {11, 2}, {12, 3}, {14, 3}, {15, 6}, {16, 7}, {19, 7}, {20, 9}, {100, 9},
	} {
		if seq, err := SeqAfter(ctx, st, tc.rev); seq != tc.seq || err != nil {
			t.Errorf("SeqAfter(%d) = %d, %v; want %d", tc.rev, seq, err, tc.seq)
		}
	}

	// Where the history read from a sequence on is complete.
	for seq, want := range map[uint64]int64{1: 10, 2: 11, 3: 14, 4: 15, 5: 15, 6: 16, 7: 19, 8: 20} {
		if got, err := RevisionBefore(ctx, st, seq); got != want || err != nil {
			t.Errorf("RevisionBefore(%d) = %d, %v; want %d", seq, got, err, want)
		}
	}

	// Where the complete history starts, as old messages age out.
	for _, tc := range []struct {
		keepFrom uint64
		want     int64
	}{
		{1, 10}, // a progress marker: complete after it
		{2, 11}, // a revision's part 0: complete from it on
		{4, 15}, // a later part: its revision is incomplete
		{6, 16},
		{7, 19},
		{8, 20},
	} {
		if err := st.Purge(ctx, jetstream.WithPurgeSequence(tc.keepFrom)); err != nil {
			t.Fatal(err)
		}
		if got, err := HistoryStart(ctx, st); got != tc.want || err != nil {
			t.Errorf("history from sequence %d: HistoryStart = %d, %v; want %d", tc.keepFrom, got, err, tc.want)
		}
	}
	if _, err := ReadAt(ctx, st, 3); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("ReadAt of a purged sequence = %v, want ErrMsgNotFound", err)
	}
	// Binary search over a stream whose head aged out.
	if seq, err := SeqAfter(ctx, st, 0); seq != 8 || err != nil {
		t.Errorf("SeqAfter(0) after the purge = %d, %v; want 8", seq, err)
	}
}

func TestReadNotARecord(t *testing.T) {
	st, pub := testStream(t)
	seq := pub(SubjectOther, []byte("\xff\xff not a record"))
	_, err := ReadAt(t.Context(), st, seq)
	if err == nil || errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("ReadAt of bad bytes = %v, want a decoding error", err)
	}
	if _, _, err := Last(t.Context(), st); err == nil {
		t.Error("Last of bad bytes: no error")
	}
}

// probeKV answers Get with a fixed revision and records the key read.
type probeKV struct {
	clientv3.KV
	rev int64
	key string
	err error
}

func (p *probeKV) Get(_ context.Context, key string, _ ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	p.key = key
	if p.err != nil {
		return nil, p.err
	}
	return &clientv3.GetResponse{Header: &etcdserverpb.ResponseHeader{Revision: p.rev}}, nil
}

func TestCurrentRevision(t *testing.T) {
	kv := &probeKV{rev: 77}
	if rev, err := CurrentRevision(t.Context(), kv); rev != 77 || err != nil || kv.key != RevProbeKey {
		t.Errorf("CurrentRevision = %d, %v (key %q)", rev, err, kv.key)
	}
	down := errors.New("down")
	if _, err := CurrentRevision(t.Context(), &probeKV{err: down}); !errors.Is(err, down) {
		t.Errorf("CurrentRevision error = %v, want it to wrap %v", err, down)
	}
}
