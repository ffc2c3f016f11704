package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"herald.dev/integration/stack"
	"herald.dev/libs/kube"
	"herald.dev/libs/storage"
	"herald.dev/libs/storage/storagetest"
)

// kubeStorage writes values into etcd as kube-apiserver stores them and
// says what kube-apiserver serves for them (storagetest), for objects at
// etcd keys of the built-in registry.
type kubeStorage struct {
	t   *testing.T
	reg *kube.Registry
	k   *storagetest.KubeAPIServer
}

func (k *kubeStorage) resource(key string) *storage.Resource {
	k.t.Helper()
	r, _, _, ok := k.reg.ParseKey(key)
	if !ok {
		k.t.Fatalf("%s is outside every layout", key)
	}
	return r.Stored()
}

// value is obj as kube-apiserver stores it at key, encrypted or not.
func (k *kubeStorage) value(key string, obj runtime.Object, encrypt bool) []byte {
	return k.k.Store(k.t, k.resource(key), key, obj, encrypt)
}

// serves is kube-apiserver's JSON of obj, stored at key, at revision rev.
func (k *kubeStorage) serves(key string, obj runtime.Object, rev int64) string {
	return k.k.Serves(k.t, k.resource(key), obj, rev)
}

// clusterTLS is a client configuration for the etcd StartClusterEtcd runs.
func clusterTLS(t testing.TB, c stack.ClusterEtcd) *tls.Config {
	t.Helper()
	crt, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(c.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	return &tls.Config{Certificates: []tls.Certificate{crt}, RootCAs: pool, MinVersion: tls.VersionTLS12}
}

// nextEvents reads n events (bookmarks skipped) from a watch.
func nextEvents(t *testing.T, ctx context.Context, ch <-chan watchEvent, n int) []watchEvent {
	t.Helper()
	var out []watchEvent
	for len(out) < n {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out after %d of %d events", len(out), n)
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("watch ended after %d of %d events", len(out), n)
			}
			if ev.Type != "BOOKMARK" {
				out = append(out, ev)
			}
		}
	}
	return out
}

// TestKubeAPIServerStorage runs Herald in cluster mode on an etcd that
// requires client certificates and holds what kube-apiserver stores:
// protobuf values, under the historical keys too (services/specs,
// services/endpoints, minions, ingress), Secrets encrypted with aescbc and
// one in plaintext (read through the identity provider). GET, LIST and WATCH,
// live and replayed from the stream's history, serve exactly kube-apiserver's
// JSON of each object. Every value Herald cannot read, in the snapshot or in
// the stream, is skipped, counted by reason and logged once; nothing else
// stops.
func TestKubeAPIServerStorage(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	dir := t.TempDir()
	pki, err := stack.EnsurePKI(filepath.Join(dir, "cluster-pki"))
	if err != nil {
		t.Fatal(err)
	}
	etcd, cluster, err := stack.StartClusterEtcd(filepath.Join(dir, "cluster"), pki)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(etcd.Close)
	cluster.EncryptionConfig = filepath.Join(dir, "encryption.yaml")
	if err := os.WriteFile(cluster.EncryptionConfig, []byte(storagetest.EncryptionConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	reg, err := kube.NewRegistry(kube.DefaultPrefix, kube.DefaultResources())
	if err != nil {
		t.Fatal(err)
	}
	k := &kubeStorage{t: t, reg: reg, k: storagetest.New(t, storagetest.EncryptionConfig)}
	cli := newEtcdClient(t, cluster, cluster.Endpoints)
	put := func(key string, v []byte) int64 {
		t.Helper()
		resp, err := cli.Put(ctx, key, string(v))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	om := func(ns, name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + name), Labels: map[string]string{"app": "web"},
			CreationTimestamp: metav1.Unix(1700000000, 0)}
	}
	type object struct {
		key, path string // etcd key; GET path
		obj       runtime.Object
		encrypt   bool
		rev       int64
	}
	type badValue struct {
		key, resource, reason string
		value                 []byte
		rev                   int64
	}

	// Before Herald starts: read from the snapshot.
	service := &object{key: "/registry/services/specs/default/web", path: "/api/v1/namespaces/default/services/web",
		obj: &corev1.Service{ObjectMeta: om("default", "web"), Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10",
			Type: corev1.ServiceTypeClusterIP, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}}
	node := &object{key: "/registry/minions/n1", path: "/api/v1/nodes/n1",
		obj: &corev1.Node{ObjectMeta: om("", "n1"), Spec: corev1.NodeSpec{PodCIDR: "10.0.1.0/24"}}}
	secret := &object{key: "/registry/secrets/prod/db", path: "/api/v1/namespaces/prod/secrets/db", encrypt: true,
		obj: &corev1.Secret{ObjectMeta: om("prod", "db"), Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"password": []byte("hunter2")}}}
	for _, o := range []*object{service, node, secret} {
		o.rev = put(o.key, k.value(o.key, o.obj, o.encrypt))
	}
	bads := []*badValue{
		{key: "/registry/secrets/prod/kms", resource: "secrets", reason: kube.ReasonUnsupportedProvider, value: []byte("k8s:enc:kms:v2:plugin:\x01\x02")},
		{key: "/registry/pods/default/truncated", resource: "pods", reason: kube.ReasonCorrupt, value: []byte("k8s\x00\x0a\x05v1")},
		{key: "/registry/pods/default", resource: "pods", reason: kube.ReasonUnknownKey, value: []byte("k8s\x00")},
	}
	for _, b := range bads {
		b.rev = put(b.key, b.value)
	}

	e := startStack(t, stack.Options{Cluster: cluster, Flags: map[string][]string{"cache": {"--watch-cache-sizes=secrets#1"}}})
	var list podList
	if code := e.get(t, "/api/v1/namespaces/prod/secrets", &list); code != 200 {
		t.Fatalf("LIST secrets: %d", code)
	}
	rv0 := list.Metadata.ResourceVersion
	_, podEvents := e.openWatch(t, ctx, "/api/v1/pods?watch=true&resourceVersion="+rv0)
	_, secretEvents := e.openWatch(t, ctx, "/api/v1/namespaces/prod/secrets?watch=true&resourceVersion="+rv0)

	// While Herald runs: read from the stream.
	pod := &object{key: "/registry/pods/default/web-0", path: "/api/v1/namespaces/default/pods/web-0",
		obj: &corev1.Pod{ObjectMeta: om("default", "web-0"), Spec: corev1.PodSpec{NodeName: "n1",
			Containers: []corev1.Container{{Name: "c", Image: "registry.example/app:1"}}}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}}
	endpoints := &object{key: "/registry/services/endpoints/default/web", path: "/api/v1/namespaces/default/endpoints/web",
		obj: &corev1.Endpoints{ObjectMeta: om("default", "web"), Subsets: []corev1.EndpointSubset{{Addresses: []corev1.EndpointAddress{{IP: "10.0.1.5"}}}}}}
	ingress := &object{key: "/registry/ingress/default/web", path: "/apis/networking.k8s.io/v1/namespaces/default/ingresses/web",
		obj: &networkingv1.Ingress{ObjectMeta: om("default", "web"), Spec: networkingv1.IngressSpec{DefaultBackend: &networkingv1.IngressBackend{
			Service: &networkingv1.IngressServiceBackend{Name: "web", Port: networkingv1.ServiceBackendPort{Number: 80}}}}}}
	secret2 := &object{key: secret.key, path: secret.path, encrypt: true,
		obj: &corev1.Secret{ObjectMeta: om("prod", "db"), Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"password": []byte("hunter3")}}}
	plain := &object{key: "/registry/secrets/prod/plain", path: "/api/v1/namespaces/prod/secrets/plain",
		obj: &corev1.Secret{ObjectMeta: om("prod", "plain"), Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"k": []byte("v")}}}
	for _, o := range []*object{pod, endpoints, ingress, secret2, plain} {
		o.rev = put(o.key, k.value(o.key, o.obj, o.encrypt))
	}
	encrypted := k.value("/registry/secrets/prod/other", &corev1.Secret{ObjectMeta: om("prod", "other")}, true)
	liar := k.value("/registry/configmaps/default/liar", &corev1.ConfigMap{ObjectMeta: om("default", "someone-else")}, false)
	streamBads := []*badValue{
		{key: "/registry/secrets/prod/other", resource: "secrets", reason: kube.ReasonDecrypt,
			value: append([]byte("k8s:enc:aescbc:v1:key9:"), encrypted[len(storagetest.KeyPrefix):]...)},
		{key: "/registry/secrets/prod/kms2", resource: "secrets", reason: kube.ReasonUnsupportedProvider, value: []byte("k8s:enc:kms:v2:plugin:\x03")},
		{key: "/registry/pods/default/gadget", resource: "pods", reason: kube.ReasonUnknownKind, value: storagetest.UnknownKind(t)},
		{key: "/registry/pods/default/array", resource: "pods", reason: kube.ReasonNotObject, value: []byte(`[1]`)},
		{key: "/registry/configmaps/default/liar", resource: "configmaps", reason: kube.ReasonKeyMismatch, value: liar},
	}
	for _, b := range streamBads {
		b.rev = put(b.key, b.value)
	}
	bads = append(bads, streamBads...)
	del, err := cli.Delete(ctx, pod.key)
	if err != nil {
		t.Fatal(err)
	}
	deleted := del.Header.Revision

	// WATCH: the stream's objects, then the pod's deletion (its last state
	// at the deletion's revision); the bad values in between make no event.
	checkEvents := func(what string, got []watchEvent, want []string) {
		t.Helper()
		for i, ev := range got {
			if w := want[i]; ev.Type+" "+string(ev.Object) != w {
				t.Errorf("%s event %d:\n%s %s\nwant\n%s", what, i, ev.Type, ev.Object, w)
			}
		}
	}
	checkEvents("pods", nextEvents(t, ctx, podEvents, 2), []string{
		"ADDED " + k.serves(pod.key, pod.obj, pod.rev),
		"DELETED " + k.serves(pod.key, pod.obj, deleted),
	})
	wantSecrets := []string{
		"MODIFIED " + k.serves(secret2.key, secret2.obj, secret2.rev),
		"ADDED " + k.serves(plain.key, plain.obj, plain.rev),
	}
	checkEvents("secrets", nextEvents(t, ctx, secretEvents, 2), wantSecrets)
	// Replayed from the stream's history (the secrets window holds one
	// event), decrypting the values the same way.
	_, replay := e.openWatch(t, ctx, "/api/v1/namespaces/prod/secrets?watch=true&resourceVersion="+rv0)
	checkEvents("replayed secrets", nextEvents(t, ctx, replay, 2), wantSecrets)

	// GET and LIST: every object as kube-apiserver serves it; nothing of
	// the bad values.
	for _, o := range []*object{service, node, secret2, plain, endpoints, ingress} {
		want := k.serves(o.key, o.obj, o.rev)
		if code, body := e.getRaw(t, o.path); code != 200 || body != want {
			t.Errorf("GET %s: %d\n%s\nwant\n%s", o.path, code, body, want)
		}
		collection := o.path[:strings.LastIndex(o.path, "/")]
		if code := e.get(t, collection, &list); code != 200 || !slices.ContainsFunc(list.Items, func(it json.RawMessage) bool { return string(it) == asListItem(want) }) {
			t.Errorf("LIST %s: %d, %d items, none is\n%s", collection, code, len(list.Items), want)
		}
	}
	for collection, n := range map[string]int{"/api/v1/namespaces/prod/secrets": 2, "/api/v1/pods": 0, "/api/v1/configmaps": 0, "/api/v1/nodes": 1} {
		if e.get(t, collection, &list); len(list.Items) != n {
			t.Errorf("LIST %s has %d items, want %d", collection, len(list.Items), n)
		}
	}
	if code, _ := e.getRaw(t, pod.path); code != 404 {
		t.Errorf("GET of the deleted pod: %d", code)
	}

	// Each bad value: counted by resource and reason, one log line naming
	// resource, key and revision, and no second line from k8s.io/apiserver.
	cache := e.Proc("cache-0")
	wantCounts := map[[2]string]int{}
	for _, b := range bads {
		wantCounts[[2]string{b.resource, b.reason}]++
	}
	for rr, n := range wantCounts {
		labels := fmt.Sprintf(`resource=%q,reason=%q`, rr[0], rr[1])
		if got := metricLabeled(t, cache, "herald_cache_undecodable_values_total", labels); got != float64(n) {
			t.Errorf("herald_cache_undecodable_values_total{%s} = %v, want %d", labels, got, n)
		}
	}
	if got, want := metric(t, cache, "herald_cache_undecodable_values_total"), float64(len(bads)); got != want {
		t.Errorf("herald_cache_undecodable_values_total = %v, want %v", got, want)
	}
	logs, _ := os.ReadFile(e.logs)
	for _, b := range bads {
		line := fmt.Sprintf(`msg="skipping a stored value that cannot be decoded" component=cache resource=%s key=%s revision=%d reason=%s`, b.resource, b.key, b.rev, b.reason)
		if n := strings.Count(string(logs), line); n != 1 {
			t.Errorf("cache logged %q %d times, want once", line, n)
		}
	}
	for _, line := range strings.Split(string(logs), "\n") {
		// k8s.io/apiserver's transformers log each failed decryption
		// through klog: only at debug level, under the cache's own line.
		if strings.Contains(line, "logger=klog") && !strings.Contains(line, "level=DEBUG") {
			t.Errorf("klog line above debug level: %s", line)
		}
		if strings.Contains(line, "hunter2") || strings.Contains(line, "hunter3") {
			t.Errorf("the services' log quotes a decrypted secret: %s", line)
		}
	}
}
