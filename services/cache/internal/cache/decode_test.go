package cache

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/storage/storagetest"
)

// TestApplyDecodesWhatKubeAPIServerStores: a shard configured with
// kube-apiserver's EncryptionConfiguration applies protobuf values (under
// historical keys too) and an aescbc-encrypted Secret as the objects
// kube-apiserver serves; every value it cannot serve is skipped, counted by
// resource and reason, and logged once with its resource, key and revision,
// and the values after it in the same revision are applied.
func TestApplyDecodesWhatKubeAPIServerStores(t *testing.T) {
	dir := t.TempDir()
	encFile := filepath.Join(dir, "encryption.yaml")
	if err := os.WriteFile(encFile, []byte(storagetest.EncryptionConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	promReg := prometheus.NewRegistry()
	cfg := Config{DefaultWindowSize: 10, WaitTimeout: 1, CatchUpTimeout: 1, SubscriberBuffer: 1, DeepReplays: 1, EncryptionConfig: encFile}
	cfg.EtcdEndpoints = "http://127.0.0.1:1"
	cfg.Prefix = kube.DefaultPrefix
	s, err := New(cfg, slog.New(slog.NewTextHandler(&logs, nil)), promReg)
	if err != nil {
		t.Fatal(err)
	}
	k := storagetest.New(t, storagetest.EncryptionConfig)
	// store is what kube-apiserver writes for obj at key.
	store := func(key string, obj runtime.Object, encrypt bool) []byte {
		r, _, _, ok := s.reg.ParseKey(key)
		if !ok {
			t.Fatalf("no resource at %s", key)
		}
		return k.Store(t, r.Stored(), key, obj, encrypt)
	}
	om := func(ns, name string) metav1.ObjectMeta { return metav1.ObjectMeta{Name: name, Namespace: ns, UID: "u"} }
	good := map[string]runtime.Object{
		"/registry/pods/default/web-0":         &corev1.Pod{ObjectMeta: om("default", "web-0"), Spec: corev1.PodSpec{NodeName: "n1"}},
		"/registry/services/specs/default/web": &corev1.Service{ObjectMeta: om("default", "web"), Spec: corev1.ServiceSpec{ClusterIP: "10.0.0.1"}},
		"/registry/minions/n1":                 &corev1.Node{ObjectMeta: om("", "n1")},
		"/registry/secrets/prod/db":            &corev1.Secret{ObjectMeta: om("prod", "db"), Data: map[string][]byte{"password": []byte("hunter2")}},
	}
	secret := store("/registry/secrets/prod/db", good["/registry/secrets/prod/db"], true)
	bad := []struct {
		key, resource, reason string
		value                 []byte
	}{
		{"/registry/pods/default/corrupt", "pods", kube.ReasonCorrupt, []byte("k8s\x00\x0a\x03abc")},
		{"/registry/pods/default/array", "pods", kube.ReasonNotObject, []byte(`[1]`)},
		{"/registry/pods/default/gadget", "pods", kube.ReasonUnknownKind, storagetest.UnknownKind(t)},
		{"/registry/pods/default/liar", "pods", kube.ReasonKeyMismatch, store("/registry/pods/default/web-0", good["/registry/pods/default/web-0"], false)},
		{"/registry/pods/default", "pods", kube.ReasonUnknownKey, []byte(`{}`)},
		{"/registry/pods/default/stripped", "pods", kube.ReasonEmpty, nil},
		{"/registry/secrets/prod/moved", "secrets", kube.ReasonDecrypt, append([]byte("k8s:enc:aescbc:v1:nokey:"), secret[len(storagetest.KeyPrefix):]...)},
		{"/registry/secrets/prod/kms", "secrets", kube.ReasonUnsupportedProvider, []byte("k8s:enc:kms:v2:plugin:\x01\x02")},
		{"/registry/configmaps/default/wrong", "configmaps", kube.ReasonWrongKind, store("/registry/pods/default/web-0", good["/registry/pods/default/web-0"], false)},
	}
	var changes []*heraldv1.Change
	for _, b := range bad {
		changes = append(changes, &heraldv1.Change{Kind: heraldv1.Change_PUT, Key: b.key, Value: b.value, CreateRevision: 7})
	}
	for key, obj := range good {
		changes = append(changes, &heraldv1.Change{Kind: heraldv1.Change_PUT, Key: key, Value: store(key, obj, strings.HasPrefix(key, "/registry/secrets/")), CreateRevision: 7})
	}
	s.apply(&heraldv1.Record{Revision: 7, Changes: changes})

	if s.Head() != 7 {
		t.Fatalf("head %d after applying revision 7", s.Head())
	}
	for key, obj := range good {
		r, _, _, _ := s.reg.ParseKey(key)
		got := s.resourceStates()[r.ID()].get(key)
		if got == nil {
			t.Errorf("%s was not applied", key)
			continue
		}
		if want := k.Serves(t, r.Stored(), obj, 7); string(got.JSON) != want {
			t.Errorf("%s served as\n%s\nwant\n%s", key, got.JSON, want)
		}
	}
	for _, b := range bad {
		r, _, _, _ := s.reg.ParseKey(b.key)
		if r == nil || s.resourceStates()[r.ID()].get(b.key) != nil {
			t.Errorf("%s (%s) was applied", b.key, b.reason)
		}
		if n := testutil.ToFloat64(s.m.skipped.WithLabelValues(b.resource, b.reason)); n != 1 {
			t.Errorf("herald_cache_undecodable_values_total{resource=%q,reason=%q} = %v, want 1", b.resource, b.reason, n)
		}
		line := fmt.Sprintf("resource=%s key=%s revision=7 reason=%s", b.resource, b.key, b.reason)
		if n := strings.Count(logs.String(), line); n != 1 {
			t.Errorf("log has %d lines with %q, want 1:\n%s", n, line, logs.String())
		}
	}
	if n := testutil.CollectAndCount(promReg, "herald_cache_undecodable_values_total"); n != len(bad) {
		t.Errorf("%d undecodable series, want %d", n, len(bad))
	}
	if strings.Contains(logs.String(), "hunter2") {
		t.Error("the log quotes a decrypted secret")
	}
}

// TestNewRefusesABadEncryptionConfig: an unreadable or invalid
// EncryptionConfiguration stops the shard at start, never later.
func TestNewRefusesABadEncryptionConfig(t *testing.T) {
	dir := t.TempDir()
	invalid := filepath.Join(dir, "invalid.yaml")
	if err := os.WriteFile(invalid, []byte("kind: EncryptionConfiguration\nresources: 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{filepath.Join(dir, "missing.yaml"), invalid} {
		cfg := Config{DefaultWindowSize: 10, WaitTimeout: 1, CatchUpTimeout: 1, SubscriberBuffer: 1, DeepReplays: 1, EncryptionConfig: file}
		cfg.EtcdEndpoints = "http://127.0.0.1:1"
		cfg.Prefix = kube.DefaultPrefix
		if _, err := New(cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry()); err == nil || !strings.Contains(err.Error(), "encryption-config") {
			t.Errorf("%s: %v", file, err)
		}
	}
}
