package storage

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// unknownEnvelope is a well-formed storage envelope of a kind no scheme has.
func unknownEnvelope(t testing.TB, apiVersion, kind string) []byte {
	t.Helper()
	u := runtime.Unknown{TypeMeta: runtime.TypeMeta{APIVersion: apiVersion, Kind: kind}, Raw: []byte{0x0a, 0x00}}
	b, err := u.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte("k8s\x00"), b...)
}

func TestDecodeBadInput(t *testing.T) {
	c := newTestCodec(t, nil)
	table := NewBuiltinTable()
	pods := table.Lookup(gvr("", "v1", "pods"))
	key := []byte("/registry/pods/default/web-0")
	pod := storeProtobuf(t, c, samplePod(), pods.StorageGVK())
	secret := storeProtobuf(t, c, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "default"}}, corev1.SchemeGroupVersion.WithKind("Secret"))

	tests := []struct {
		name  string
		value []byte
		want  error
	}{
		{"unknown kind in envelope", unknownEnvelope(t, "example.com/v1", "Widget"), ErrUnknownKind},
		{"envelope without kind", unknownEnvelope(t, "v1", ""), ErrUnknownKind},
		{"another kind in envelope", secret, ErrWrongKind},
		{"truncated envelope", pod[:len(pod)/2], ErrCorrupt},
		{"envelope cut in its header", pod[:6], ErrCorrupt},
		{"magic only", []byte("k8s\x00"), ErrCorrupt},
		{"garbage after magic", append([]byte("k8s\x00"), bytes.Repeat([]byte{0xff}, 20)...), ErrCorrupt},
		{"empty", nil, ErrCorrupt},
		{"whitespace", []byte(" \n"), ErrCorrupt},
		{"binary", []byte{0x00, 0x01, 0x02}, ErrCorrupt},
		{"JSON array", []byte(`[1,2]`), ErrNotObject},
		{"JSON string", []byte(`"pod"`), ErrNotObject},
		{"JSON null", []byte(`null`), ErrNotObject},
		{"JSON number", []byte(` 42`), ErrNotObject},
		{"truncated JSON", []byte(`{"kind":"Pod","metadata":{"name":`), ErrCorrupt},
		{"JSON with wrong types", []byte(`{"kind":"Pod","apiVersion":"v1","spec":{"containers":7}}`), ErrCorrupt},
		{"JSON of another kind", []byte(`{"kind":"Secret","apiVersion":"v1","metadata":{"name":"s"}}`), ErrWrongKind},
		{"JSON of an unknown version", []byte(`{"kind":"Pod","apiVersion":"v0","metadata":{"name":"s"}}`), ErrUnknownKind},
		{"KMS v2 value", []byte("k8s:enc:kms:v2:plugin:\x01\x02\x03"), ErrUnsupportedProvider},
		{"KMS v1 value", []byte("k8s:enc:kms:v1:plugin:\x01\x02\x03"), ErrUnsupportedProvider},
		{"unknown provider", []byte("k8s:enc:rot13:v1:key:abc"), ErrUnsupportedProvider},
		{"aescbc value, no encryption configured", []byte("k8s:enc:aescbc:v1:key1:0123456789abcdef0123456789abcdef"), ErrDecrypt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obj, err := c.Decode(context.Background(), pods, key, tt.value, 11)
			if obj != nil || !errors.Is(err, tt.want) {
				t.Fatalf("got %v, %v; want %v", obj, err, tt.want)
			}
			var de *DecodeError
			if !errors.As(err, &de) || de.Key != string(key) || de.Revision != 11 || de.Resource.Resource != "pods" {
				t.Fatalf("not a DecodeError naming the value: %#v", err)
			}
			if !strings.Contains(err.Error(), "/registry/pods/default/web-0") || !strings.Contains(err.Error(), "11") {
				t.Errorf("message does not name key and revision: %s", err)
			}
		})
	}
}
