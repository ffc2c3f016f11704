package cache

import (
	"context"
	"fmt"
	"log/slog"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/storage"
)

// benchPod is a pod as kube-apiserver stores it (protobuf), its
// container's restart count being what each update changes.
func benchPod(b *testing.B, codec *storage.Codec, restarts string) []byte {
	b.Helper()
	js := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web-0","namespace":"default","uid":"6b8c1f0e-2b1c-4a57-9a53-1d2f3c4b5a69",` +
		`"labels":{"app":"web","pod-template-hash":"5d9c7b8f6"},"annotations":{"kubernetes.io/psp":"restricted"},` +
		`"ownerReferences":[{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"web-5d9c7b8f6","uid":"0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0","controller":true}]},` +
		`"spec":{"nodeName":"node-7","serviceAccountName":"default","containers":[{"name":"web","image":"registry.k8s.io/nginx:1.27",` +
		`"ports":[{"containerPort":8080,"protocol":"TCP"}],"resources":{"requests":{"cpu":"100m","memory":"128Mi"}},` +
		`"env":[{"name":"MODE","value":"production"},{"name":"LOG","value":"info"}]}]},` +
		`"status":{"phase":"Running","hostIP":"10.0.0.7","podIP":"10.244.7.12","startTime":"2026-12-07T10:00:00Z",` +
		`"conditions":[{"type":"Ready","status":"True","lastTransitionTime":"2026-12-07T10:00:05Z"},{"type":"PodScheduled","status":"True","lastTransitionTime":"2026-12-07T10:00:00Z"}],` +
		`"containerStatuses":[{"name":"web","ready":true,"restartCount":` + restarts + `,"image":"registry.k8s.io/nginx:1.27","imageID":"sha256:0123456789abcdef","containerID":"containerd://abcdef0123456789"}]}}`
	gvk := pods(b).GroupVersionKind()
	obj, err := codec.DecodeServed(gvk, []byte(js))
	if err != nil {
		b.Fatal(err)
	}
	v, err := codec.EncodeProtobuf(obj)
	if err != nil {
		b.Fatal(err)
	}
	return v
}

// BenchmarkStatusUpdate is the cache's work for one status update of a pod
// (labels and selectable fields unchanged: the most common change), from
// the stream's record to the bytes a following stream sends: decode,
// prepare the event, queue it, send it (marshalled as gRPC does; wire-B/op
// is its size). cpu-ns/op is the process's CPU time per update, which the
// machine's other load inflates less than the wall time. The streams: a
// fanout hub's (omit_unchanged_prev), one that also asks for protobuf, and
// an older client's (neither).
func BenchmarkStatusUpdate(b *testing.B) {
	for _, tc := range benchStreams {
		b.Run(tc.name, func(b *testing.B) {
			rs := newWindow(b, 1000)
			s := &Shard{cfg: Config{SubscriberBuffer: 1024, WaitTimeout: time.Second}, reg: registry(b), m: newMetrics(prometheus.NewRegistry()),
				advanced: make(chan struct{}), firstUp: make(chan struct{}), log: slog.New(slog.DiscardHandler)}
			s.states.Store(&map[string]*resourceState{rs.res.ID(): rs})
			s.ready.Store(true)
			s.head.Store(snapRev)
			dec, err := testDecoder()
			if err != nil {
				b.Fatal(err)
			}
			s.dec = dec
			codec, err := storage.NewCodec(nil)
			if err != nil {
				b.Fatal(err)
			}
			values := [][]byte{benchPod(b, codec, "0"), benchPod(b, codec, "1")}
			key := rs.res.ObjectKey("default", "web-0")
			rev := int64(snapRev + 1)
			record := func(i int) *heraldv1.Record {
				return &heraldv1.Record{Revision: rev, Parts: 1, Changes: []*heraldv1.Change{{Kind: heraldv1.Change_PUT, Key: key, Value: values[i%2], CreateRevision: snapRev + 1}}}
			}
			s.apply(record(0))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			st := &watchStream{ctx: ctx, sent: make(chan *heraldv1.WatchResponse, 16)}
			req := proto.Clone(tc.req).(*heraldv1.WatchRequest)
			req.AfterRevision = rev
			go v(s).Watch(req, st)
			<-st.sent // the start
			var wire int64
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cpuTime()
			for i := range b.N {
				rev++
				s.apply(record(i + 1))
				resp := <-st.sent
				data, err := proto.Marshal(resp)
				if err != nil || len(resp.Events) != 1 || resp.Events[0].Type != heraldv1.EventType_MODIFIED {
					b.Fatal(fmt.Sprint(resp, err))
				}
				wire += int64(len(data))
			}
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
			b.ReportMetric(float64(wire)/float64(b.N), "wire-B/op")
		})
	}
}

func v(s *Shard) *Server { return NewServer(s) }

// cpuTime is the CPU time (user and system) the process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
