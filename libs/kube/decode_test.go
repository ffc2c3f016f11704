package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"herald.dev/libs/storage"
	"herald.dev/libs/storage/storagetest"
)

// testDecoder is a decoder configured with encConfig ("" for none) and
// kube-apiserver configured alike.
func testDecoder(t testing.TB, encConfig string) (*Decoder, *storagetest.KubeAPIServer) {
	t.Helper()
	var enc *storage.Encryption
	if encConfig != "" {
		var err error
		if enc, err = storage.ParseEncryptionConfig([]byte(encConfig)); err != nil {
			t.Fatal(err)
		}
	}
	d, err := NewDecoder(enc)
	if err != nil {
		t.Fatal(err)
	}
	return d, storagetest.New(t, encConfig)
}

func mustResource(t testing.TB, g *Registry, id string) *Resource {
	t.Helper()
	r, ok := g.ByID(id)
	if !ok {
		t.Fatalf("no resource %s", id)
	}
	return r
}

// TestDecodeAsKubeAPIServer: protobuf values (under the historical keys of
// services and nodes too) and an aescbc-encrypted Secret decode to exactly
// the JSON kube-apiserver serves, with labels and selectable fields, and
// re-serve under another revision byte for byte.
func TestDecodeAsKubeAPIServer(t *testing.T) {
	g := defaultRegistry(t)
	d, k := testDecoder(t, storagetest.EncryptionConfig)
	meta := func(ns, name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("u-" + name), Labels: map[string]string{"app": name},
			Annotations: map[string]string{"note": `"resourceVersion":"41"`}, CreationTimestamp: metav1.Unix(1700000000, 0)}
	}
	tests := []struct {
		id, key, ns, name string
		obj               runtime.Object
		fields            map[string]string
	}{
		{"pods", "/registry/pods/default/web-0", "default", "web-0", &corev1.Pod{ObjectMeta: meta("default", "web-0"),
			Spec:   corev1.PodSpec{NodeName: "n1", HostNetwork: true, Containers: []corev1.Container{{Name: "c", Image: "img"}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: "10.0.0.7"}}}},
			map[string]string{"spec.nodeName": "n1", "spec.host": "n1", "spec.hostNetwork": "true", "status.phase": "Running",
				"status.podIP": "10.0.0.7", "metadata.namespace": "default", "metadata.name": "web-0"}},
		{"services", "/registry/services/specs/default/web", "default", "web", &corev1.Service{ObjectMeta: meta("default", "web"),
			Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", Type: corev1.ServiceTypeClusterIP}},
			map[string]string{"spec.clusterIP": "10.96.0.10", "spec.type": "ClusterIP"}},
		{"nodes", "/registry/minions/n1", "", "n1", &corev1.Node{ObjectMeta: meta("", "n1"), Spec: corev1.NodeSpec{Unschedulable: true}},
			map[string]string{"spec.unschedulable": "true", "metadata.name": "n1"}},
		{"events", "/registry/events/default/e1", "default", "e1", &corev1.Event{ObjectMeta: meta("default", "e1"),
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: "web-0", ResourceVersion: "41"}, Reason: "Started", Type: "Normal"},
			map[string]string{"involvedObject.resourceVersion": "41", "involvedObject.name": "web-0", "reason": "Started"}},
		{"secrets", "/registry/secrets/prod/db", "prod", "db", &corev1.Secret{ObjectMeta: meta("prod", "db"),
			Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"password": []byte("hunter2")}},
			map[string]string{"type": "Opaque"}},
	}
	for _, tt := range tests {
		r := mustResource(t, g, tt.id)
		if r2, ns, name, ok := g.ParseKey(tt.key); !ok || r2 != r || ns != tt.ns || name != tt.name {
			t.Fatalf("%s: ParseKey = %v %q %q %v", tt.key, r2, ns, name, ok)
		}
		stored := k.Store(t, r.Stored(), tt.key, tt.obj, tt.id == "secrets")
		if tt.id == "secrets" && (!bytes.HasPrefix(stored, []byte(storagetest.KeyPrefix)) || bytes.Contains(stored, []byte("hunter2"))) {
			t.Fatalf("secret not stored encrypted: %q", stored)
		}
		o, err := d.Decode(context.Background(), r, tt.key, tt.ns, tt.name, stored, 41)
		if err != nil {
			t.Fatalf("%s: %v", tt.key, err)
		}
		if want := k.Serves(t, r.Stored(), tt.obj, 41); string(o.JSON) != want {
			t.Errorf("%s: JSON\n%s\nwant kube-apiserver's\n%s", tt.key, o.JSON, want)
		}
		if want := k.Serves(t, r.Stored(), tt.obj, 1234567); string(o.WithRev(1234567)) != want {
			t.Errorf("%s: WithRev\n%s\nwant\n%s", tt.key, o.WithRev(1234567), want)
		}
		if o.Rev != 41 || o.Namespace != tt.ns || o.Name != tt.name || o.Labels["app"] != tt.name {
			t.Errorf("%s: object %d %s/%s labels %v", tt.key, o.Rev, o.Namespace, o.Name, o.Labels)
		}
		for f, want := range tt.fields {
			if got, ok := o.Fields[f]; !ok || got != want {
				t.Errorf("%s: field %s = %q (present %v), want %q", tt.key, f, got, ok, want)
			}
		}
		for _, f := range r.Fields {
			if _, ok := o.Fields[f.Name]; !ok {
				t.Errorf("%s: selectable field %s missing from %v", tt.key, f.Name, o.Fields)
			}
		}
		checkProtobuf(t, d, r, tt.key, tt.ns, tt.name, stored, 41, k.ServesProtobuf(t, r.Stored(), tt.obj, 41))
	}
}

// checkProtobuf: DecodeWithProtobuf gives Decode's object and the
// protobuf want, which is also what fanout makes from the JSON alone
// (decode it as the served kind, encode that): a protobuf watcher gets the
// same bytes whichever way its event was made.
func checkProtobuf(t *testing.T, d *Decoder, r *Resource, key, ns, name string, stored []byte, rev int64, want []byte) {
	t.Helper()
	o, err := d.Decode(context.Background(), r, key, ns, name, stored, rev)
	if err != nil {
		t.Fatal(err)
	}
	o2, pb, err := d.DecodeWithProtobuf(context.Background(), r, key, ns, name, stored, rev)
	if err != nil {
		t.Fatal(err)
	}
	if string(o2.JSON) != string(o.JSON) || o2.Rev != o.Rev {
		t.Errorf("%s: DecodeWithProtobuf's object %s, Decode's %s", key, o2.JSON, o.JSON)
	}
	if !bytes.Equal(pb, want) {
		t.Errorf("%s: protobuf %q, want %q", key, pb, want)
	}
	served, err := d.codec.DecodeServed(r.GroupVersionKind(), o.JSON)
	if err != nil {
		t.Fatal(err)
	}
	fromJSON, err := d.codec.Encode(storage.MediaProtobuf, false, served)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(pb, fromJSON) {
		t.Errorf("%s: protobuf %q, made from the JSON %q", key, pb, fromJSON)
	}
}

// TestDecodeHandWrittenJSON: the JSON values of the seed and the tests'
// writers (apiVersion and kind may be missing, resourceVersion stale) read
// as kube-apiserver reads them.
func TestDecodeHandWrittenJSON(t *testing.T) {
	g := defaultRegistry(t)
	d, _ := testDecoder(t, "")
	pods := mustResource(t, g, "pods")
	in := `{"metadata":{"name":"web-0","namespace":"default","resourceVersion":"3","labels":{"app":"web"}},"spec":{"nodeName":"n1","hostNetwork":true},"status":{"phase":"Running"}}`
	o, err := d.Decode(context.Background(), pods, "/registry/pods/default/web-0", "default", "web-0", []byte(in), 17)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"kind":"Pod","apiVersion":"v1","metadata":{"name":"web-0","namespace":"default","resourceVersion":"17","labels":{"app":"web"}},"spec":{"containers":null,"nodeName":"n1","hostNetwork":true},"status":{"phase":"Running"}}`
	if string(o.JSON) != want {
		t.Fatalf("JSON\n%s\nwant\n%s", o.JSON, want)
	}
	if o.Labels["app"] != "web" || o.Fields["spec.nodeName"] != "n1" || o.Fields["status.phase"] != "Running" ||
		o.Fields["spec.hostNetwork"] != "true" || o.Fields["metadata.namespace"] != "default" {
		t.Fatalf("labels %v fields %v", o.Labels, o.Fields)
	}
	// A JSON value's protobuf is the served object's (kube-apiserver's
	// serializer writes "containers":null, protobuf nothing).
	served, err := d.codec.DecodeServed(pods.GroupVersionKind(), o.JSON)
	if err != nil {
		t.Fatal(err)
	}
	wantPB, err := d.codec.EncodeProtobuf(served)
	if err != nil {
		t.Fatal(err)
	}
	checkProtobuf(t, d, pods, "/registry/pods/default/web-0", "default", "web-0", []byte(in), 17, wantPB)
	del := o.WithRev(20)
	if !strings.Contains(string(del), `"resourceVersion":"20"`) || !strings.Contains(string(o.JSON), `"resourceVersion":"17"`) {
		t.Fatalf("WithRev: %s / %s", del, o.JSON)
	}
}

// TestDecodeCustomResource: a resource outside the built-in table (from a
// registry file) decodes as unstructured JSON; its fields come from JSON
// paths, integers keep their digits, and a "resourceVersion" outside
// metadata is never taken for the object's.
func TestDecodeCustomResource(t *testing.T) {
	g, err := NewRegistry(DefaultPrefix, []Resource{{Group: "example.com", Version: "v1", Kind: "Widget", Plural: "widgets",
		Namespaced: true, Key: "example.com/widgets", Fields: []Field{{Name: "spec.size"}, {Name: "spec.count"}, {Name: "spec.on"}}}})
	if err != nil {
		t.Fatal(err)
	}
	d, _ := testDecoder(t, "")
	w := mustResource(t, g, "widgets.example.com")
	in := `{"apiVersion":"example.com/v1","kind":"Widget","data":{"resourceVersion":"9"},"metadata":{"name":"w","namespace":"shop"},"spec":{"size":"large","count":1234567890123456789,"on":true}}`
	o, err := d.Decode(context.Background(), w, "/registry/example.com/widgets/shop/w", "shop", "w", []byte(in), 9)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"apiVersion":"example.com/v1","data":{"resourceVersion":"9"},"kind":"Widget","metadata":{"name":"w","namespace":"shop","resourceVersion":"9"},"spec":{"count":1234567890123456789,"on":true,"size":"large"}}`
	if string(o.JSON) != want {
		t.Fatalf("JSON\n%s\nwant\n%s", o.JSON, want)
	}
	if got := string(o.WithRev(10)); got != strings.Replace(want, `"shop","resourceVersion":"9"`, `"shop","resourceVersion":"10"`, 1) {
		t.Fatalf("WithRev spliced the wrong resourceVersion: %s", got)
	}
	if o.Fields["spec.size"] != "large" || o.Fields["spec.count"] != "1234567890123456789" || o.Fields["spec.on"] != "true" {
		t.Fatalf("fields %v", o.Fields)
	}
	// A custom resource has no protobuf: protobuf watches are not
	// offered for it.
	if o2, pb, err := d.DecodeWithProtobuf(context.Background(), w, "/registry/example.com/widgets/shop/w", "shop", "w", []byte(in), 9); err != nil || pb != nil || string(o2.JSON) != want {
		t.Fatalf("DecodeWithProtobuf = %s, %q, %v", o2.JSON, pb, err)
	}
}

// TestDecodeBadValues: every value Herald cannot serve is refused with its
// reason, wrapping ErrInvalidObject, and no object.
func TestDecodeBadValues(t *testing.T) {
	g := defaultRegistry(t)
	d, k := testDecoder(t, storagetest.EncryptionConfig)
	plain, _ := testDecoder(t, "")
	pods, secrets := mustResource(t, g, "pods"), mustResource(t, g, "secrets")
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "prod"}, Data: map[string][]byte{"k": []byte("v")}}
	encrypted := k.Store(t, secrets.Stored(), "/registry/secrets/prod/db", secret, true)
	pod := k.Store(t, pods.Stored(), "/registry/pods/default/web-0", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: "default"}}, false)
	// Cut short: aescbc is not authenticated, so a flipped byte could still
	// unpad (about 1 in 256); a length that is not a whole number of blocks
	// never decrypts.
	tampered := bytes.Clone(encrypted[:len(encrypted)-1])
	tests := []struct {
		name  string
		d     *Decoder
		r     *Resource
		value []byte
		want  string
	}{
		{"not JSON", d, pods, []byte(`not json`), ReasonCorrupt},
		{"invalid JSON object", d, pods, []byte(`{not json`), ReasonCorrupt},
		{"JSON array", d, pods, []byte(`[]`), ReasonNotObject},
		{"JSON null", d, pods, []byte(`null`), ReasonNotObject},
		{"JSON string", d, pods, []byte(`"pod"`), ReasonNotObject},
		{"name differs from the key", d, pods, []byte(`{"metadata":{"name":"other","namespace":"default"}}`), ReasonKeyMismatch},
		{"namespace differs from the key", d, pods, []byte(`{"metadata":{"name":"web-0","namespace":"x"}}`), ReasonKeyMismatch},
		{"no metadata", d, pods, []byte(`{"spec":{}}`), ReasonKeyMismatch},
		{"label of the wrong type", d, pods, []byte(`{"metadata":{"name":"web-0","namespace":"default","labels":{"a":1}}}`), ReasonCorrupt},
		{"JSON of another kind", d, pods, []byte(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"web-0","namespace":"default"}}`), ReasonWrongKind},
		{"protobuf of another kind", d, pods, k.Store(t, secrets.Stored(), "/registry/pods/default/web-0",
			&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: "default"}}, false), ReasonWrongKind},
		{"protobuf of an unknown kind", d, pods, storagetest.UnknownKind(t), ReasonUnknownKind},
		{"truncated protobuf envelope", d, pods, pod[:len(pod)/2], ReasonCorrupt},
		{"protobuf magic only", d, pods, []byte("k8s\x00"), ReasonCorrupt},
		{"empty value", d, pods, nil, ReasonEmpty},
		{"encrypted, no encryption configured", plain, secrets, encrypted, ReasonDecrypt},
		{"encrypted, tampered", d, secrets, tampered, ReasonDecrypt},
		{"encrypted with an unknown key", d, secrets, append([]byte("k8s:enc:aescbc:v1:key9:"), encrypted[len(storagetest.KeyPrefix):]...), ReasonDecrypt},
		{"KMS", d, secrets, []byte("k8s:enc:kms:v2:plugin:\x00\x01\x02"), ReasonUnsupportedProvider},
		{"unknown provider", d, secrets, []byte("k8s:enc:rot13:v1:k:abc"), ReasonUnsupportedProvider},
	}
	for _, tt := range tests {
		ns, name := "default", "web-0"
		key := tt.r.ObjectKey(ns, name)
		if tt.r == secrets {
			ns, name, key = "prod", "db", "/registry/secrets/prod/db"
		}
		o, err := tt.d.Decode(context.Background(), tt.r, key, ns, name, tt.value, 5)
		if o != nil || !errors.Is(err, ErrInvalidObject) || Reason(err) != tt.want {
			t.Errorf("%s: object %v, error %v (reason %q), want reason %q", tt.name, o, err, Reason(err), tt.want)
			continue
		}
		if !strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), "5") {
			t.Errorf("%s: error %q does not name the key and revision", tt.name, err)
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: error quotes plaintext: %v", tt.name, err)
		}
	}
}

func TestLocateResourceVersion(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // "" for not found
	}{
		{`{"metadata":{"resourceVersion":"12"}}`, "12"},
		{` { "kind" : "X" , "metadata" : { "name" : "a\"b" , "resourceVersion" : "7" } } `, "7"},
		{`{"a":{"metadata":{"resourceVersion":"1"}},"metadata":{"resourceVersion":"2"}}`, "2"},
		{`{"a":["{\"metadata\":",{"x":[1,2,{"y":"]}"}]}],"metadata":{"b":null,"resourceVersion":"3"}}`, "3"},
		{`{"metadata":{"name":"x"}}`, ""},
		{`{"metadata":{"resourceVersion":12}}`, ""},
		{`{"metadata":{"resourceVersion":"1\u0032"}}`, ""},
		{`{"metadata":"resourceVersion"}`, ""},
		{`{"metadata":{"resourceVersion":"1"`, ""},
		{`{"metadata":{"resourceVersion"`, ""},
		{`["metadata",{"resourceVersion":"1"}]`, ""},
		{`{}`, ""},
		{``, ""},
	} {
		s, e, ok := locateResourceVersion([]byte(tc.in))
		got := ""
		if ok {
			got = tc.in[s:e]
		}
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("locateResourceVersion(%s) = %q %v, want %q", tc.in, got, ok, tc.want)
		}
	}
}

// FuzzLocateResourceVersion: any input, no panic; what it finds is inside
// the input and is the resourceVersion encoding/json sees.
func FuzzLocateResourceVersion(f *testing.F) {
	f.Add([]byte(`{"kind":"Pod","metadata":{"name":"a","resourceVersion":"12"},"spec":{}}`))
	f.Add([]byte(`{"a":{"resourceVersion":"1"},"metadata":{"resourceVersion":"2"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, e, ok := locateResourceVersion(b)
		if !ok {
			return
		}
		if s < 0 || e < s || e > len(b) || s == 0 || b[s-1] != '"' || e >= len(b) || b[e] != '"' {
			t.Fatalf("bad span %d:%d of %q", s, e, b)
		}
		var top struct {
			Metadata struct {
				ResourceVersion string `json:"resourceVersion"`
			} `json:"metadata"`
		}
		if !json.Valid(b) || json.Unmarshal(b, &top) != nil {
			return // not JSON: nothing to compare with
		}
		if bytes.Count(b, []byte(`"metadata"`)) == 1 && bytes.Count(b, []byte(`"resourceVersion"`)) == 1 && top.Metadata.ResourceVersion != string(b[s:e]) {
			t.Fatalf("found %q, encoding/json sees %q in %q", b[s:e], top.Metadata.ResourceVersion, b)
		}
	})
}

// FuzzDecode feeds arbitrary stored values to the decoder of a built-in, an
// encrypted and a custom resource: no panic, exactly one of object and
// error, a refused value has a reason, and a decoded object's JSON is valid
// and re-serves under another revision.
func FuzzDecode(f *testing.F) {
	g, err := NewRegistry(DefaultPrefix, append(DefaultResources(), Resource{Group: "example.com", Version: "v1", Kind: "Widget",
		Plural: "widgets", Namespaced: true, Key: "example.com/widgets", Fields: []Field{{Name: "spec.size"}}}))
	if err != nil {
		f.Fatal(err)
	}
	d, k := testDecoder(f, storagetest.EncryptionConfig)
	resources := []*Resource{mustResource(f, g, "pods"), mustResource(f, g, "secrets"), mustResource(f, g, "widgets.example.com")}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "prod"}, Data: map[string][]byte{"k": []byte("v")}}
	f.Add(uint8(1), k.Store(f, resources[1].Stored(), resources[1].ObjectKey("prod", "db"), secret, true))
	f.Add(uint8(0), k.Store(f, resources[0].Stored(), resources[0].ObjectKey("prod", "db"),
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "prod", Labels: map[string]string{"a": "b"}}}, false))
	f.Add(uint8(0), []byte(`{"metadata":{"name":"db","namespace":"prod"},"spec":{"nodeName":"n"}}`))
	f.Add(uint8(2), []byte(`{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"db","namespace":"prod"},"spec":{"size":"l"}}`))
	f.Fuzz(func(t *testing.T, which uint8, value []byte) {
		r := resources[int(which)%len(resources)]
		o, err := d.Decode(context.Background(), r, r.ObjectKey("prod", "db"), "prod", "db", value, 3)
		if (o == nil) == (err == nil) {
			t.Fatalf("object %v and error %v", o, err)
		}
		if err != nil {
			if Reason(err) == "" || !errors.Is(err, ErrInvalidObject) {
				t.Fatalf("error without a reason: %v", err)
			}
			return
		}
		var top struct {
			Metadata struct {
				Name            string `json:"name"`
				ResourceVersion string `json:"resourceVersion"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(o.JSON, &top); err != nil || top.Metadata.ResourceVersion != "3" || top.Metadata.Name != "db" {
			t.Fatalf("decoded JSON %s: %v", o.JSON, err)
		}
		if err := json.Unmarshal(o.WithRev(40), &top); err != nil || top.Metadata.ResourceVersion != "40" {
			t.Fatalf("WithRev(40) %s: %v", o.WithRev(40), err)
		}
	})
}
