package fanout

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"k8s.io/utils/clock"

	"herald.dev/libs/kube/request"
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// BenchmarkReceiveKubelets is what fanout does with each pod event a cache
// sends under a kubelet-like load: decode the WatchResponse as received,
// then dispatch its event to 5,000 watchers that each select their own
// node's pods (the index finds the one). The event is a pod status update
// with a pod's usual labels and every selectable field: "unchanged" as the
// cache sends most of them (prev_unchanged, no previous state), "prev" a
// phase change, which carries the previous state's labels and fields too.
func BenchmarkReceiveKubelets(b *testing.B) {
	pods := podsResource(b)
	const nodes = 5000
	for _, mode := range []string{"unchanged", "prev"} {
		b.Run(mode, func(b *testing.B) {
			h := newHub(pods, nil, ringLimits{events: 1024, bytes: 1 << 30}, slog.New(slog.NewTextHandler(io.Discard, nil)), newMetrics(prometheus.NewRegistry()), clock.RealClock{})
			ws := make([]*watcher, nodes)
			wire := make([][]byte, nodes)
			for i := range nodes {
				sel, err := request.ParseSelector(pods, "", "", fmt.Sprintf("spec.nodeName=node-%d", i))
				if err != nil {
					b.Fatal(err)
				}
				ws[i] = newWatcher(sel, 4, 1<<20)
				h.watchers.add(ws[i])
				wire[i] = podUpdateResponse(fmt.Sprintf("node-%d", i), mode == "prev")
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				var resp heraldv1.WatchResponse
				if err := proto.Unmarshal(wire[i%nodes], &resp); err != nil {
					b.Fatal(err)
				}
				ev := resp.Events[0]
				ev.Revision = int64(i + 1)
				h.mu.Lock()
				if n := h.dispatch(newItem(ev)); n != 1 {
					b.Fatalf("queued to %d watchers, want 1", n)
				}
				h.mu.Unlock()
				if got := ws[i%nodes].take(nil); len(got) != 1 {
					b.Fatalf("watcher has %d queued", len(got))
				}
			}
		})
	}
}

// podUpdateResponse is a WatchResponse carrying one MODIFIED event of a
// pod on node, encoded field by field as the cache writes it (labels and
// fields as key/value entries: the wire form of both a map and a list of
// pairs).
func podUpdateResponse(node string, withPrev bool) []byte {
	labels := [][2]string{{"app", "web"}, {"pod-template-hash", "7d4b9c8f6d"}, {"team", "payments"}, {"tier", "frontend"}}
	fields := func(phase string) [][2]string {
		return [][2]string{{"metadata.name", "web-7d4b9c8f6d-x2x9k"}, {"metadata.namespace", "default"}, {"spec.hostNetwork", "false"},
			{"spec.nodeName", node}, {"spec.restartPolicy", "Always"}, {"spec.schedulerName", "default-scheduler"},
			{"spec.serviceAccountName", "default"}, {"status.nominatedNodeName", ""}, {"status.phase", phase},
			{"status.podIP", "10.244.3.17"}, {"status.podIPs", "10.244.3.17"}}
	}
	object := []byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"web-7d4b9c8f6d-x2x9k"},"status":"` + strings.Repeat("x", 2500) + `"}`)
	var ev []byte
	ev = protowire.AppendTag(ev, 1, protowire.VarintType)
	ev = protowire.AppendVarint(ev, uint64(heraldv1.EventType_MODIFIED))
	ev = protowire.AppendTag(ev, 2, protowire.VarintType)
	ev = protowire.AppendVarint(ev, 12345)
	ev = appendString(ev, 3, "default")
	ev = appendString(ev, 4, "web-7d4b9c8f6d-x2x9k")
	ev = protowire.AppendTag(ev, 5, protowire.BytesType)
	ev = protowire.AppendBytes(ev, object)
	ev = appendEntries(ev, 6, labels)
	ev = appendEntries(ev, 7, fields("Running"))
	if withPrev {
		ev = protowire.AppendTag(ev, 8, protowire.BytesType)
		ev = protowire.AppendBytes(ev, object)
		ev = appendEntries(ev, 9, labels)
		ev = appendEntries(ev, 10, fields("Pending"))
	} else {
		ev = protowire.AppendTag(ev, 14, protowire.VarintType)
		ev = protowire.AppendVarint(ev, 1)
	}
	resp := protowire.AppendTag(nil, 1, protowire.BytesType)
	return protowire.AppendBytes(resp, ev)
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

// appendEntries appends kvs as field num's key/value entries (key = 1,
// value = 2).
func appendEntries(b []byte, num protowire.Number, kvs [][2]string) []byte {
	for _, kv := range kvs {
		e := appendString(appendString(nil, 1, kv[0]), 2, kv[1])
		b = protowire.AppendTag(b, num, protowire.BytesType)
		b = protowire.AppendBytes(b, e)
	}
	return b
}
