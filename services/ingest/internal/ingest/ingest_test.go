package ingest

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// TestChangeKeepsValuesAsEtcdHoldsThem: ingest appends every value byte for
// byte, whatever it is (protobuf, JSON, encrypted, garbage): only caches
// decode values, and they skip what they cannot read.
func TestChangeKeepsValuesAsEtcdHoldsThem(t *testing.T) {
	reg, err := kube.NewRegistry(kube.DefaultPrefix, kube.DefaultResources())
	if err != nil {
		t.Fatal(err)
	}
	i := &Ingest{cfg: Config{MaxMessageBytes: 1 << 20}, log: slog.New(slog.DiscardHandler), reg: reg, m: newMetrics(prometheus.NewRegistry())}
	for _, v := range [][]byte{
		[]byte(`{"kind":"Pod","metadata":{"name":"a"}}`),
		[]byte("k8s\x00\n\x09\n\x02v1\x12\x03Pod\x12\x00"),
		[]byte("k8s:enc:aescbc:v1:key1:\xde\xad\xbe\xef"),
		[]byte("k8s:enc:kms:v2:plugin:\x00"),
		[]byte(`[1]`),
		[]byte("\x00\x01binary"),
	} {
		for _, key := range []string{"/registry/secrets/prod/db", "/registry/ranges/serviceips"} {
			put := &clientv3.Event{Type: clientv3.EventTypePut, Kv: &mvccpb.KeyValue{Key: []byte(key), Value: v, ModRevision: 5, CreateRevision: 4}}
			if c := i.change(put); c.Kind != heraldv1.Change_PUT || c.Key != key || !bytes.Equal(c.Value, v) || c.CreateRevision != 4 {
				t.Errorf("PUT %q at %s appended as %v", v, key, c)
			}
			del := &clientv3.Event{Type: clientv3.EventTypeDelete, Kv: &mvccpb.KeyValue{Key: []byte(key), ModRevision: 6},
				PrevKv: &mvccpb.KeyValue{Key: []byte(key), Value: v}}
			if c := i.change(del); c.Kind != heraldv1.Change_DELETE || !bytes.Equal(c.PrevValue, v) {
				t.Errorf("DELETE with previous value %q at %s appended as %v", v, key, c)
			}
		}
	}
}
