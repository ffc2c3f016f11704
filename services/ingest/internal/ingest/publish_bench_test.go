//go:build unix

package ingest

import (
	"bytes"
	"fmt"
	"log/slog"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// BenchmarkPublish appends b.N one-change revisions (a 1 KiB value, a small
// pod) through publishEvents to real JetStream (file storage, the server in
// this process), in watch responses of 100 revisions as when ingest catches
// up, and waits for the last ack. It reports records/s and the CPU per
// record of the whole process: ingest's side and the NATS server's.
func BenchmarkPublish(b *testing.B) {
	for _, maxInFlight := range []int{1, 256} {
		b.Run(fmt.Sprintf("max-in-flight=%d", maxInFlight), func(b *testing.B) {
			in := benchIngest(b, maxInFlight)
			p := in.newPublisher(0, 0)
			value := bytes.Repeat([]byte("x"), 1024)
			const batch = 100
			events := make([]*clientv3.Event, 0, batch)
			b.ResetTimer()
			cpu, start := cpuTime(b), time.Now()
			for rev := int64(1); rev <= int64(b.N); {
				events = events[:0]
				for ; len(events) < batch && rev <= int64(b.N); rev++ {
					key := fmt.Appendf(nil, "/registry/pods/default/p%d", rev%1000)
					events = append(events, &clientv3.Event{Type: clientv3.EventTypePut,
						Kv: &mvccpb.KeyValue{Key: key, Value: value, ModRevision: rev, CreateRevision: rev}})
				}
				if err := in.publishEvents(b.Context(), p, events, 0, 0); err != nil {
					b.Fatal(err)
				}
			}
			if err := p.flush(b.Context()); err != nil {
				b.Fatal(err)
			}
			elapsed, used := time.Since(start), cpuTime(b)-cpu
			b.StopTimer()
			if p.lastRev != int64(b.N) {
				b.Fatalf("the last revision acknowledged is %d, want %d", p.lastRev, b.N)
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "records/s")
			b.ReportMetric(float64(used.Microseconds())/float64(b.N), "cpu-us/record")
		})
	}
}

// benchIngest is a replica connected to a new NATS server with its stream
// created, publishing with maxInFlight records in flight; it needs no etcd.
func benchIngest(b *testing.B, maxInFlight int) *Ingest {
	b.Helper()
	n := startNATS(b)
	cfg := testConfig(b, "http://127.0.0.1:2379", n.url, fmt.Sprintf("--publish.max-in-flight=%d", maxInFlight))
	in, err := New(cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	if err := in.connectNATS(nil, nil); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(in.nc.Close)
	if in.stream, err = in.js.CreateOrUpdateStream(b.Context(), in.cfg.StreamConfig()); err != nil {
		b.Fatal(err)
	}
	return in
}

// cpuTime is the CPU time (user and system) the process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
