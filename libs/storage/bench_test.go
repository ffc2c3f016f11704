package storage

import (
	"context"
	"testing"
)

// The cache's per-event work: one Decode per stored value, then each
// encoding a watcher asks for, once per event.

func benchPod(b *testing.B) (*Codec, *Resource, []byte, []byte) {
	c := newTestCodec(b, nil)
	res := NewBuiltinTable().Lookup(gvr("", "v1", "pods"))
	return c, res, []byte("/registry/pods/default/web-0"), storeProtobuf(b, c, samplePod(), res.StorageGVK())
}

func BenchmarkDecodePodProtobuf(b *testing.B) {
	c, res, key, stored := benchPod(b)
	b.ReportAllocs()
	b.SetBytes(int64(len(stored)))
	for b.Loop() {
		if _, err := c.Decode(context.Background(), res, key, stored, 1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodePodJSON reads the pod as kube-apiserver stores it with
// --storage-media-type=application/json.
func BenchmarkDecodePodJSON(b *testing.B) {
	c, res, key, _ := benchPod(b)
	pod := samplePod()
	pod.SetGroupVersionKind(res.StorageGVK())
	stored, err := c.EncodeJSON(pod)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(stored)))
	for b.Loop() {
		if _, err := c.Decode(context.Background(), res, key, stored, 1); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodePod(b *testing.B) {
	c, res, key, stored := benchPod(b)
	obj, err := c.Decode(context.Background(), res, key, stored, 1)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := obj.JSON(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("protobuf", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := obj.Protobuf(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("metadata-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.EncodeJSON(obj.PartialObjectMetadata()); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkDecodeSecretAESGCM(b *testing.B) {
	es := newEncryptedSecret(b, "aesgcm")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := es.c.Decode(context.Background(), es.res, es.key, es.stored, 1); err != nil {
			b.Fatal(err)
		}
	}
}
