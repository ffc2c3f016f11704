package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes/scheme"
)

// Pods is the fixed set of pods the writer changes: pod i lives in
// namespace ns-<i%20>, on node node-<i%Nodes>. Each is about 1.4 KB of JSON,
// a small real pod; with Protobuf, the same pod as kube-apiserver stores it
// by default (its protobuf serializer's "k8s\x00" envelope of a v1 Pod,
// about 0.7 KB), at the same key.
type Pods struct {
	N, Nodes int
	Protobuf bool
	keys     []string
	// Each value is head + write time + tail; the time sits in the
	// WrittenAtAnnotation, always writtenAtLen digits, so that the
	// protobuf value's length prefixes hold for every write.
	head, tail []string
}

// writtenAtMark stands for the write time in a pod's template: as long as
// the time's digits (writtenAtLen).
const (
	writtenAtMark = "@@WRITTEN_AT_NANO@@"
	writtenAtLen  = len(writtenAtMark)
)

// NewPods lays out n pods over nodes nodes, stored as JSON.
func NewPods(n, nodes int) *Pods { return newPods(n, nodes, false) }

// NewProtobufPods lays out the same pods, stored as kube-apiserver's
// protobuf.
func NewProtobufPods(n, nodes int) *Pods { return newPods(n, nodes, true) }

func newPods(n, nodes int, proto bool) *Pods {
	p := &Pods{N: n, Nodes: nodes, Protobuf: proto, keys: make([]string, n), head: make([]string, n), tail: make([]string, n)}
	const mark = writtenAtMark
	var pb runtime.Serializer
	if proto {
		pb = protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)
	}
	for i := range n {
		ns, name := fmt.Sprintf("ns-%d", i%20), fmt.Sprintf("pod-%05d", i)
		podIP := fmt.Sprintf("10.1.%d.%d", i>>8&255, i&255)
		b, _ := json.Marshal(map[string]any{
			"apiVersion": "v1", "kind": "Pod",
			"metadata": map[string]any{"name": name, "namespace": ns, "uid": fmt.Sprintf("6b1f1c1e-0000-4000-8000-%012d", i),
				"creationTimestamp": "2026-01-01T00:00:00Z",
				"labels":            map[string]string{"app": fmt.Sprintf("app-%d", i%50), "tier": "web", "pod-template-hash": "5d8f7c9b6"},
				"annotations":       map[string]string{WrittenAtAnnotation: mark},
				"ownerReferences": []map[string]any{{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": fmt.Sprintf("app-%d-5d8f7c9b6", i%50),
					"uid": "0b7e2d8c-0000-4000-8000-000000000001", "controller": true, "blockOwnerDeletion": true}}},
			// With the defaults kube-apiserver fills in before it stores a
			// pod (and again when it reads one), so that both systems
			// serve the object etcd holds.
			"spec": map[string]any{"nodeName": p.Node(i), "schedulerName": "default-scheduler", "restartPolicy": "Always",
				"terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst", "securityContext": map[string]any{}, "enableServiceLinks": true,
				"containers": []map[string]any{{"name": "app", "image": "registry.example/app:1.2.3",
					"ports":                    []map[string]any{{"containerPort": 8080, "protocol": "TCP"}},
					"resources":                map[string]any{"requests": map[string]string{"cpu": "100m", "memory": "128Mi"}},
					"env":                      []map[string]string{{"name": "MODE", "value": "production"}},
					"terminationMessagePath":   "/dev/termination-log",
					"terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"}}},
			"status": map[string]any{"phase": "Running", "podIP": podIP, "podIPs": []map[string]string{{"ip": podIP}}, "hostIP": "192.168.0.1",
				"conditions":        []map[string]string{{"type": "Ready", "status": "True"}, {"type": "ContainersReady", "status": "True"}},
				"containerStatuses": []map[string]any{{"name": "app", "ready": true, "restartCount": 0, "image": "registry.example/app:1.2.3", "started": true}}},
		})
		p.keys[i] = "/registry/pods/" + ns + "/" + name
		if proto {
			b = protobufPod(pb, b)
		}
		var ok bool
		if p.head[i], p.tail[i], ok = strings.Cut(string(b), mark); !ok {
			panic("pod template without its write-time mark")
		}
	}
	return p
}

// protobufPod is what kube-apiserver stores for the pod of JSON j: its
// protobuf serializer's envelope of the v1 Pod (apimachinery's own
// encoder, as kube-apiserver's storage codec uses it).
func protobufPod(s runtime.Serializer, j []byte) []byte {
	var pod corev1.Pod
	if err := json.Unmarshal(j, &pod); err != nil {
		panic(err)
	}
	var buf bytes.Buffer
	if err := s.Encode(&pod, &buf); err != nil {
		panic(err)
	}
	return buf.Bytes()
}

// Encoding is how the pods are stored: "JSON" or "protobuf".
func (p *Pods) Encoding() string {
	if p.Protobuf {
		return "protobuf"
	}
	return "JSON"
}

// Node is the spec.nodeName of pod i.
func (p *Pods) Node(i int) string { return "node-" + strconv.Itoa(i%p.Nodes) }

func (p *Pods) value(i int, at time.Time) string {
	return p.head[i] + writtenAt(at) + p.tail[i]
}

// writtenAt is at in Unix nanoseconds, zero-padded to writtenAtLen digits.
func writtenAt(at time.Time) string {
	s := strconv.FormatInt(at.UnixNano(), 10)
	if len(s) < writtenAtLen {
		s = strings.Repeat("0", writtenAtLen-len(s)) + s
	}
	return s
}

// Load writes every pod once, 100 per transaction, and returns the revision
// of the last write.
func (p *Pods) Load(ctx context.Context, cli *clientv3.Client) (int64, error) {
	var rev int64
	for i := 0; i < p.N; i += 100 {
		var ops []clientv3.Op
		for j := i; j < min(i+100, p.N); j++ {
			ops = append(ops, clientv3.OpPut(p.keys[j], p.value(j, time.Now())))
		}
		resp, err := cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return 0, err
		}
		rev = resp.Header.Revision
	}
	return rev, nil
}

// Write is one pod write: the revision etcd gave it and the pod.
type Write struct {
	Rev int64
	Pod int32
	// Took is the Put's round trip: etcd's commit, which every delivery's
	// latency includes.
	Took time.Duration
}

// writeSlack is the commit time WriteFor's writers absorb at any rate: they
// keep the offered rate while etcd's Puts take up to this long.
const writeSlack = 250 * time.Millisecond

// writers is how many Puts WriteFor keeps in flight at perSec: enough for
// writeSlack of commits, at least 4.
func writers(perSec int) int {
	return max(4, int(time.Duration(perSec)*writeSlack/time.Second))
}

// WriteFor puts pods into etcd at perSec writes per second for d, cycling
// through the pods from first, and returns every write. The rate is
// offered whatever the commits take (up to writeSlack each): a cluster's
// writes come from many clients, none waiting for another's, so a server
// that slows etcd down (the machine saturated) must not be offered fewer
// events than one that does not. Each write carries the time just before
// its Put.
func (p *Pods) WriteFor(ctx context.Context, cli *clientv3.Client, perSec int, d time.Duration, first int) ([]Write, error) {
	total := int(d.Seconds() * float64(perSec))
	interval := time.Second / time.Duration(perSec)
	start := time.Now()
	var (
		next   atomic.Int64
		mu     sync.Mutex
		writes = make([]Write, 0, total)
		errs   []error
		wg     sync.WaitGroup
	)
	for range writers(perSec) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k := int(next.Add(1) - 1)
				if k >= total || ctx.Err() != nil {
					return
				}
				if wait := time.Until(start.Add(time.Duration(k) * interval)); wait > 0 {
					time.Sleep(wait)
				}
				pod := (first + k) % p.N
				at := time.Now()
				resp, err := cli.Put(ctx, p.keys[pod], p.value(pod, at))
				took := time.Since(at)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					writes = append(writes, Write{Rev: resp.Header.Revision, Pod: int32(pod), Took: took})
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return writes, fmt.Errorf("%d of %d writes failed, first: %w", len(errs), total, errs[0])
	}
	return writes, nil
}
