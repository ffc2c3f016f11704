// Package storagetest plays kube-apiserver's part in tests of what reads its
// etcd: it makes the values kube-apiserver writes for an object (its
// protobuf serializer's envelope, encrypted by an EncryptionConfiguration's
// provider) and the JSON kube-apiserver serves for it, with libs/storage's
// codecs (k8s.io/apimachinery's serializers), so that a reader's output can
// be compared byte for byte.
//
// It is test support only: no service imports it. The keys in it are test
// keys.
package storagetest

import (
	"context"
	"strconv"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/storage/value"

	"herald.dev/libs/storage"
)

// EncryptionConfig encrypts Secrets with aescbc under the key "key1" and
// still reads plaintext ones (identity), as kube-apiserver's
// --encryption-provider-config does while a cluster turns encryption on.
const EncryptionConfig = `apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
- resources: ["secrets"]
  providers:
  - aescbc:
      keys:
      - name: key1
        secret: MTIzNDU2Nzg5MDEyMzQ1Njc4OTAxMjM0NTY3ODkwMTI=
  - identity: {}
`

// KeyPrefix is what starts a value EncryptionConfig encrypts.
const KeyPrefix = "k8s:enc:aescbc:v1:key1:"

// KubeAPIServer writes and serves like kube-apiserver configured with an
// EncryptionConfiguration.
type KubeAPIServer struct {
	codec *storage.Codec
	enc   *storage.Encryption
}

// New is a kube-apiserver with encryptionConfig (empty: no encryption).
func New(t testing.TB, encryptionConfig string) *KubeAPIServer {
	t.Helper()
	k := &KubeAPIServer{}
	if encryptionConfig != "" {
		var err error
		if k.enc, err = storage.ParseEncryptionConfig([]byte(encryptionConfig)); err != nil {
			t.Fatal(err)
		}
	}
	var err error
	if k.codec, err = storage.NewCodec(nil); err != nil {
		t.Fatal(err)
	}
	return k
}

// Store is what kube-apiserver writes at key for obj of res: the protobuf
// envelope of obj in res's storage version, encrypted with res's provider
// when encrypt is set.
func (k *KubeAPIServer) Store(t testing.TB, res *storage.Resource, key string, obj runtime.Object, encrypt bool) []byte {
	t.Helper()
	obj = obj.DeepCopyObject()
	obj.GetObjectKind().SetGroupVersionKind(res.StorageGVK())
	b, err := k.codec.EncodeProtobuf(obj)
	if err != nil {
		t.Fatal(err)
	}
	if !encrypt {
		return b
	}
	if b, err = k.enc.Transformer(res.GroupResource()).TransformToStorage(context.Background(), b, value.DefaultContext(key)); err != nil {
		t.Fatal(err)
	}
	return b
}

// Serves is kube-apiserver's JSON of obj of res at revision rev, without
// the serializer's trailing newline.
func (k *KubeAPIServer) Serves(t testing.TB, res *storage.Resource, obj runtime.Object, rev int64) string {
	t.Helper()
	obj = obj.DeepCopyObject()
	obj.GetObjectKind().SetGroupVersionKind(res.ServedGVK())
	obj.(metav1.Object).SetResourceVersion(strconv.FormatInt(rev, 10))
	b, err := k.codec.EncodeJSON(obj)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSuffix(string(b), "\n")
}

// ServesProtobuf is kube-apiserver's protobuf of obj of res at revision
// rev (the envelope a protobuf client reads as a watch event's object).
func (k *KubeAPIServer) ServesProtobuf(t testing.TB, res *storage.Resource, obj runtime.Object, rev int64) []byte {
	t.Helper()
	obj = obj.DeepCopyObject()
	obj.GetObjectKind().SetGroupVersionKind(res.ServedGVK())
	obj.(metav1.Object).SetResourceVersion(strconv.FormatInt(rev, 10))
	b, err := k.codec.EncodeProtobuf(obj)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// UnknownKind is a well-formed protobuf envelope of a kind no scheme knows
// (example.com/v1 Gadget).
func UnknownKind(t testing.TB) []byte {
	t.Helper()
	u := runtime.Unknown{TypeMeta: runtime.TypeMeta{APIVersion: "example.com/v1", Kind: "Gadget"}, Raw: []byte{0x0a, 0x00}}
	b, err := u.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte("k8s\x00"), b...)
}
