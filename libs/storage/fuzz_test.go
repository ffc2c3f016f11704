package storage

import (
	"context"
	"errors"
	"testing"
)

// FuzzDecode feeds arbitrary stored values (seeds in testdata/fuzz/FuzzDecode:
// protobuf envelopes, JSON, encrypted values, their truncations) to the
// decoder of a few resources, with aesgcm encryption configured for secrets.
// Invariants: no panic (not even one recovered inside Decode), exactly one
// of object and error, errors are *DecodeError, and a decoded object encodes.
func FuzzDecode(f *testing.F) {
	es := newEncryptedSecret(f, "aesgcm")
	c := es.c
	table := NewBuiltinTable()
	resources := []*Resource{
		table.Lookup(gvr("", "v1", "pods")),
		table.Lookup(gvr("", "v1", "secrets")),
		table.Lookup(gvr("apps", "v1", "deployments")),
		{Group: "example.com", Version: "v1", Resource: "widgets", Kind: "Widget", StorageGroup: "example.com",
			StorageVersion: "v1", StorageKind: "Widget", Namespaced: true, KeyPrefix: "example.com/widgets"},
	}
	_, _, plain := secretFixture(f, c)
	f.Add(uint8(1), es.stored)
	f.Add(uint8(1), plain)
	f.Add(uint8(0), storeProtobuf(f, c, samplePod(), table.Lookup(gvr("", "v1", "pods")).StorageGVK()))

	f.Fuzz(func(t *testing.T, which uint8, value []byte) {
		r := resources[int(which)%len(resources)]
		k := []byte(r.Key("/registry", "prod", "db"))
		obj, err := c.Decode(context.Background(), r, k, value, 3)
		if (obj == nil) == (err == nil) {
			t.Fatalf("object %v and error %v", obj, err)
		}
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("not a DecodeError: %v", err)
			}
			if errors.Is(err, errDecoderPanicked) {
				t.Fatalf("decoder panicked on %q", value)
			}
			return
		}
		if _, err := obj.JSON(); err != nil {
			t.Fatalf("decoded object does not encode as JSON: %v", err)
		}
		if c.Typed(obj.GroupVersionKind()) {
			if _, err := obj.Protobuf(); err != nil {
				t.Fatalf("decoded object does not encode as protobuf: %v", err)
			}
		}
		if obj.PartialObjectMetadata() == nil {
			t.Fatal("no metadata")
		}
	})
}
