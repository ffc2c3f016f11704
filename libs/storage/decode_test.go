package storage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsv1beta1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1beta1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8sjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"
)

func newTestCodec(t testing.TB, enc *Encryption) *Codec {
	t.Helper()
	c, err := NewCodec(enc)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// storeProtobuf is what kube-apiserver writes into etcd for obj: its
// protobuf serializer's output ("k8s\x00" + runtime.Unknown) in the storage
// version, without a resourceVersion.
func storeProtobuf(t testing.TB, c *Codec, obj runtime.Object, gvk schema.GroupVersionKind) []byte {
	t.Helper()
	obj = obj.DeepCopyObject()
	obj.GetObjectKind().SetGroupVersionKind(gvk)
	var buf bytes.Buffer
	if err := protobuf.NewSerializer(c.scheme, c.scheme).Encode(obj, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// served is what kube-apiserver serves for obj at revision rev: its JSON and
// protobuf serializers' output with apiVersion, kind and resourceVersion set.
func served(t testing.TB, c *Codec, obj runtime.Object, gvk schema.GroupVersionKind, rev int64) (jsonOut, protoOut []byte) {
	t.Helper()
	obj = obj.DeepCopyObject()
	obj.GetObjectKind().SetGroupVersionKind(gvk)
	obj.(metav1.Object).SetResourceVersion(strconv.FormatInt(rev, 10))
	var j, p bytes.Buffer
	if err := k8sjson.NewSerializerWithOptions(k8sjson.DefaultMetaFactory, c.scheme, c.scheme, k8sjson.SerializerOptions{}).Encode(obj, &j); err != nil {
		t.Fatal(err)
	}
	if err := protobuf.NewSerializer(c.scheme, c.scheme).Encode(obj, &p); err != nil {
		t.Fatal(err)
	}
	return j.Bytes(), p.Bytes()
}

func samplePod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: "default", UID: "u-1", Labels: map[string]string{"app": "web"},
			Annotations: map[string]string{"a": "b"}, CreationTimestamp: metav1.Unix(1700000000, 0)},
		Spec: corev1.PodSpec{NodeName: "node-7", RestartPolicy: corev1.RestartPolicyAlways, SchedulerName: "default-scheduler",
			ServiceAccountName: "default", HostNetwork: true,
			Containers: []corev1.Container{{Name: "c", Image: "nginx", Ports: []corev1.ContainerPort{{ContainerPort: 80}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1", PodIPs: []corev1.PodIP{{IP: "10.0.0.1"}, {IP: "fd00::1"}}},
	}
}

type sample struct {
	gvr schema.GroupVersionResource
	obj runtime.Object
}

func samples() []sample {
	meta := metav1.ObjectMeta{Name: "x", Namespace: "ns1", Labels: map[string]string{"k": "v"}}
	return []sample{
		{gvr("", "v1", "pods"), samplePod()},
		{gvr("", "v1", "services"), &corev1.Service{ObjectMeta: meta, Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.1", Type: corev1.ServiceTypeClusterIP,
			Ports: []corev1.ServicePort{{Port: 443, Protocol: corev1.ProtocolTCP}}}}},
		{gvr("", "v1", "nodes"), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-7"}, Spec: corev1.NodeSpec{Unschedulable: true},
			Status: corev1.NodeStatus{Capacity: corev1.ResourceList{corev1.ResourceCPU: apiresource.MustParse("4")}}}},
		{gvr("", "v1", "secrets"), &corev1.Secret{ObjectMeta: meta, Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"password": []byte("hunter2")}}},
		{gvr("", "v1", "configmaps"), &corev1.ConfigMap{ObjectMeta: meta, Data: map[string]string{"z": "1", "a": "2"}}},
		{gvr("", "v1", "events"), &corev1.Event{ObjectMeta: meta, Reason: "Started", Type: "Normal",
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: "web-0", Namespace: "ns1"}, ReportingController: "kubelet"}},
		{gvr("apps", "v1", "deployments"), &appsv1.Deployment{ObjectMeta: meta, Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](3),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"k": "v"}}}}},
		{gvr("coordination.k8s.io", "v1", "leases"), &coordinationv1.Lease{ObjectMeta: meta, Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("me")}}},
		{gvr("rbac.authorization.k8s.io", "v1", "rolebindings"), &rbacv1.RoleBinding{ObjectMeta: meta,
			RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "r"}}},
		// Stored as v1beta1 (served as v1 by kube-apiserver only).
		{gvr("apiextensions.k8s.io", "v1", "customresourcedefinitions"), &apiextensionsv1beta1.CustomResourceDefinition{
			ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.com", Labels: map[string]string{"k": "v"}},
			Spec: apiextensionsv1beta1.CustomResourceDefinitionSpec{Group: "example.com", Scope: apiextensionsv1beta1.NamespaceScoped,
				Names: apiextensionsv1beta1.CustomResourceDefinitionNames{Plural: "widgets", Kind: "Widget"},
				Versions: []apiextensionsv1beta1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
					Schema:           &apiextensionsv1beta1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1beta1.JSONSchemaProps{Type: "object"}},
					SelectableFields: []apiextensionsv1beta1.SelectableField{{JSONPath: ".spec.color"}}}}}}},

		{gvr("apiregistration.k8s.io", "v1", "apiservices"), &apiregistrationv1.APIService{
			ObjectMeta: metav1.ObjectMeta{Name: "v1.example.com", Labels: map[string]string{"k": "v"}},
			Spec:       apiregistrationv1.APIServiceSpec{Group: "example.com", Version: "v1", GroupPriorityMinimum: 1000, VersionPriority: 15}}},
		{gvr("discovery.k8s.io", "v1", "endpointslices"), &discoveryv1.EndpointSlice{ObjectMeta: meta, AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}}}}},
	}
}

// convertedSamples are the samples of resources whose served version
// differs from their storage version, as kube-apiserver serves them.
func convertedSamples() map[schema.GroupVersionResource]runtime.Object {
	return map[schema.GroupVersionResource]runtime.Object{
		// v1beta1's defaults applied on read, then converted to v1.
		gvr("apiextensions.k8s.io", "v1", "customresourcedefinitions"): &apiextensionsv1.CustomResourceDefinition{
			ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.com", Labels: map[string]string{"k": "v"}},
			Spec: apiextensionsv1.CustomResourceDefinitionSpec{Group: "example.com", Scope: apiextensionsv1.NamespaceScoped,
				Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList"},
				Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
					Schema:           &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object"}},
					SelectableFields: []apiextensionsv1.SelectableField{{JSONPath: ".spec.color"}}}},
				Conversion:            &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.NoneConverter},
				PreserveUnknownFields: true},
			Status: apiextensionsv1.CustomResourceDefinitionStatus{StoredVersions: []string{"v1"}}},
	}
}

func TestDecodeProtobufRoundTrip(t *testing.T) {
	c := newTestCodec(t, nil)
	table := NewBuiltinTable()
	for _, s := range samples() {
		t.Run(s.gvr.Resource, func(t *testing.T) {
			res := table.Lookup(s.gvr)
			m := s.obj.(metav1.Object)
			key := []byte(res.Key("/registry", m.GetNamespace(), m.GetName()))
			stored := storeProtobuf(t, c, s.obj, res.StorageGVK())
			if !bytes.HasPrefix(stored, []byte("k8s\x00")) {
				t.Fatalf("not a storage envelope: %q", stored[:8])
			}
			got, err := c.Decode(context.Background(), res, key, stored, 42)
			if err != nil {
				t.Fatal(err)
			}
			want, wantGVK := s.obj, res.StorageGVK()
			if o, ok := convertedSamples()[s.gvr]; ok {
				want, wantGVK = o, res.ServedGVK()
			}
			wantJSON, wantProto := served(t, c, want, wantGVK, 42)
			gotJSON, err := got.JSON()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(gotJSON, wantJSON) {
				t.Errorf("JSON differs\n got %s\nwant %s", gotJSON, wantJSON)
			}
			gotProto, err := got.Protobuf()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(gotProto, wantProto) {
				t.Errorf("protobuf differs")
			}
			if got.Name != m.GetName() || got.Namespace != m.GetNamespace() || got.ResourceVersion != 42 ||
				got.Labels.String() != (labelsString(m.GetLabels())) || got.Fields["metadata.name"] != m.GetName() {
				t.Errorf("index fields: %+v", got)
			}
			pom := got.PartialObjectMetadata()
			if pom.APIVersion != "meta.k8s.io/v1" || pom.Kind != "PartialObjectMetadata" || pom.Name != m.GetName() || pom.ResourceVersion != "42" {
				t.Errorf("PartialObjectMetadata: %+v", pom)
			}
			if _, err := c.EncodeJSON(pom); err != nil {
				t.Errorf("encoding PartialObjectMetadata: %v", err)
			}
			if _, err := c.EncodeProtobuf(pom); err != nil {
				t.Errorf("encoding PartialObjectMetadata as protobuf: %v", err)
			}
		})
	}
}

func labelsString(m map[string]string) string {
	var s []string
	for k, v := range m {
		s = append(s, k+"="+v)
	}
	if len(s) > 1 {
		panic("one label per sample")
	}
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

func TestDecodeConcurrentEncodes(t *testing.T) {
	c := newTestCodec(t, nil)
	res := NewBuiltinTable().Lookup(gvr("", "v1", "pods"))
	got, err := c.Decode(context.Background(), res, []byte("/registry/pods/default/web-0"), storeProtobuf(t, c, samplePod(), res.StorageGVK()), 7)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := got.JSON()
	done := make(chan []byte)
	for range 8 {
		go func() {
			b, _ := got.JSON()
			_, _ = got.Protobuf()
			done <- b
		}()
	}
	for range 8 {
		if b := <-done; !bytes.Equal(b, want) {
			t.Fatal("concurrent encodes differ")
		}
	}
}

func TestSelectableFields(t *testing.T) {
	c := newTestCodec(t, nil)
	table := NewBuiltinTable()
	decode := func(r schema.GroupVersionResource, obj runtime.Object) *Object {
		res := table.Lookup(r)
		m := obj.(metav1.Object)
		o, err := c.Decode(context.Background(), res, []byte(res.Key("/registry", m.GetNamespace(), m.GetName())), storeProtobuf(t, c, obj, res.StorageGVK()), 1)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	pod := decode(gvr("", "v1", "pods"), samplePod())
	want := map[string]string{
		"metadata.name": "web-0", "metadata.namespace": "default", "spec.nodeName": "node-7", "spec.restartPolicy": "Always",
		"spec.schedulerName": "default-scheduler", "spec.serviceAccountName": "default", "spec.hostNetwork": "true",
		"status.phase": "Running", "status.podIP": "10.0.0.1", "status.nominatedNodeName": "",
	}
	if len(pod.Fields) != len(want) {
		t.Errorf("pod fields %v", pod.Fields)
	}
	for k, v := range want {
		if pod.Fields[k] != v {
			t.Errorf("pod %s = %q, want %q", k, pod.Fields[k], v)
		}
	}
	node := decode(gvr("", "v1", "nodes"), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Spec: corev1.NodeSpec{Unschedulable: true}})
	if node.Fields["spec.unschedulable"] != "true" || node.Fields.Has("metadata.namespace") {
		t.Errorf("node fields %v", node.Fields)
	}
	ev := decode(gvr("events.k8s.io", "v1", "events"), &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "e", Namespace: "ns"},
		InvolvedObject: corev1.ObjectReference{Name: "web-0"}, ReportingController: "kubelet"})
	if ev.Fields["involvedObject.name"] != "web-0" || ev.Fields["source"] != "kubelet" || ev.Fields["reportingComponent"] != "kubelet" {
		t.Errorf("event fields %v", ev.Fields)
	}
	sec := decode(gvr("", "v1", "secrets"), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "ns"}, Type: "kubernetes.io/tls"})
	if sec.Fields["type"] != "kubernetes.io/tls" {
		t.Errorf("secret fields %v", sec.Fields)
	}
}

func TestDecodeJSON(t *testing.T) {
	c := newTestCodec(t, nil)
	table := NewBuiltinTable()
	pods := table.Lookup(gvr("", "v1", "pods"))
	key := []byte("/registry/pods/default/web-0")

	// JSON storage of a built-in decodes into the typed object and serves
	// the same bytes as protobuf storage would.
	wantJSON, _ := served(t, c, samplePod(), pods.StorageGVK(), 9)
	stored := bytes.Replace(wantJSON, []byte(`"resourceVersion":"9",`), nil, 1)
	got, err := c.Decode(context.Background(), pods, key, stored, 9)
	if err != nil {
		t.Fatal(err)
	}
	if j, _ := got.JSON(); !bytes.Equal(j, wantJSON) {
		t.Errorf("JSON storage: got %s\nwant %s", j, wantJSON)
	}

	// Hand-written values without apiVersion and kind (make seed, tests).
	got, err = c.Decode(context.Background(), pods, key, []byte(`{"metadata":{"name":"web-0","namespace":"default"},"spec":{"nodeName":"n1"}}`), 3)
	if err != nil {
		t.Fatal(err)
	}
	if j, _ := got.JSON(); !bytes.HasPrefix(j, []byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"web-0","namespace":"default","resourceVersion":"3"}`)) {
		t.Errorf("hand-written JSON served as %s", j)
	}
	if got.Fields["spec.nodeName"] != "n1" {
		t.Errorf("fields %v", got.Fields)
	}

	// The typed JSON path decodes what the serializer's Decode does (it
	// skips the serializer's second reading of apiVersion and kind),
	// including what the serializer keeps of odd values: unknown fields,
	// big integers, nulls, a field named in another case.
	for _, v := range []string{
		string(stored),
		`{"metadata":{"name":"web-0","namespace":"default"},"spec":{"nodeName":"n1"}}`,
		`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web-0","namespace":"default","labels":null,"generation":12345678901234},"spec":{"NodeName":"x","unknown":{"a":1},"activeDeadlineSeconds":7},"status":null}`,
	} {
		got, _, kind, err := c.decodeJSON(pods, []byte(v))
		if kind != nil || err != nil {
			t.Fatalf("%s: %v %v", v, kind, err)
		}
		sgvk := pods.StorageGVK()
		want, _, err := c.json.Decode([]byte(v), &sgvk, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: decoded %#v\nserializer %#v", v, got, want)
		}
	}
	if _, _, kind, _ := c.decodeJSON(pods, []byte(`{"kind":"Pod","spec":{"nodeName":1}}`)); kind != ErrCorrupt {
		t.Errorf("a value of the wrong type: %v, want ErrCorrupt", kind)
	}

	// Custom resources decode into unstructured objects, any stored version.
	cr := &Resource{Group: "example.com", Version: "v1", Resource: "widgets", Kind: "Widget",
		StorageGroup: "example.com", StorageVersion: "v1", StorageKind: "Widget", Namespaced: true, KeyPrefix: "example.com/widgets"}
	got, err = c.Decode(context.Background(), cr, []byte("/registry/example.com/widgets/ns/w"),
		[]byte(`{"apiVersion":"example.com/v1beta1","kind":"Widget","metadata":{"name":"w","namespace":"ns","labels":{"a":"b"}},"spec":{"z":1,"a":2}}`), 5)
	if err != nil {
		t.Fatal(err)
	}
	j, _ := got.JSON()
	if want := `{"apiVersion":"example.com/v1beta1","kind":"Widget","metadata":{"labels":{"a":"b"},"name":"w","namespace":"ns","resourceVersion":"5"},"spec":{"a":2,"z":1}}` + "\n"; string(j) != want {
		t.Errorf("custom resource JSON\n got %s\nwant %s", j, want)
	}
	if got.Labels["a"] != "b" || got.Fields["metadata.namespace"] != "ns" {
		t.Errorf("custom resource index: %+v", got)
	}
	if _, err := got.Protobuf(); !errors.Is(err, ErrNoProtobuf) {
		t.Errorf("custom resource protobuf: %v", err)
	}
	if pom := got.PartialObjectMetadata(); pom.Name != "w" || pom.ResourceVersion != "5" {
		t.Errorf("custom resource metadata: %+v", pom)
	}
}

// TestDecodeJSONTyped checks that decodeTyped, which skips reading apiVersion
// and kind with encoding/json, accepts a value only where that reading would
// find the resource's kind, and that every other value reads as before.
func TestDecodeJSONTyped(t *testing.T) {
	c := newTestCodec(t, nil)
	table := NewBuiltinTable()
	pods := table.Lookup(gvr("", "v1", "pods"))
	deployments := table.Lookup(gvr("apps", "v1", "deployments"))
	pod, _ := served(t, c, samplePod(), pods.StorageGVK(), 9)
	svc, _ := served(t, c, samples()[1].obj, corev1.SchemeGroupVersion.WithKind("Service"), 9)
	var manyUnknown strings.Builder
	for i := range 150 {
		fmt.Fprintf(&manyUnknown, `"u%d":0,`, i)
	}

	tests := []struct {
		name  string
		res   *Resource
		value string
		fast  bool  // decodeTyped accepts it
		want  error // nil: decodes as the serializer does
	}{
		{"pod", pods, string(pod), true, nil},
		{"pod with unknown nested fields", pods, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","KIND":"x"},"spec":{"Kind":1}}`, true, nil},
		{"no apiVersion and kind", pods, `{"metadata":{"name":"p"}}`, false, nil},
		{"no apiVersion", pods, `{"kind":"Pod","metadata":{"name":"p"}}`, false, nil},
		{"keys in another case", pods, `{"APIVERSION":"v1","Kind":"Pod","metadata":{"name":"p"}}`, false, nil},
		{"kind in another case", pods, `{"apiVersion":"v1","KIND":"Service","metadata":{"name":"p"}}`, false, ErrWrongKind},
		{"kind then kind in another case", pods, `{"apiVersion":"v1","kind":"Pod","KIND":"Service","metadata":{"name":"p"}}`, false, ErrWrongKind},
		{"kind with a Kelvin sign", pods, `{"apiVersion":"v1","kind":"Pod","\u212aind":"Service"}`, false, ErrWrongKind},
		{"apiVersion in another case", pods, `{"apiVersion":"v1","kind":"Pod","ApiVersion":"apps/v1"}`, false, ErrWrongKind},
		{"kind in another case not a string", pods, `{"apiVersion":"v1","kind":"Pod","Kind":7}`, false, ErrCorrupt},
		{"kind in another case after 150 unknown fields", pods, `{"apiVersion":"v1","kind":"Pod","spec":{` + manyUnknown.String() + `"nodeName":"n"},"KIND":"Service"}`, false, ErrWrongKind},
		{"kind twice", pods, `{"apiVersion":"v1","kind":"Pod","kind":"Service"}`, false, ErrWrongKind},
		{"kind not a string", pods, `{"apiVersion":"v1","kind":7}`, false, ErrCorrupt},
		{"apiVersion not parsed", pods, `{"apiVersion":"a/b/c","kind":"Pod"}`, false, ErrCorrupt},
		{"another kind", pods, string(svc), false, ErrWrongKind},
		{"another version", deployments, `{"apiVersion":"apps/v1beta1","kind":"Deployment","metadata":{"name":"d"}}`, false, ErrWrongKind},
		{"an unknown version", deployments, `{"apiVersion":"apps/v0","kind":"Deployment","metadata":{"name":"d"}}`, false, ErrUnknownKind},
		{"invalid JSON", pods, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}`, false, ErrCorrupt},
		{"trailing data", pods, `{"apiVersion":"v1","kind":"Pod"} {}`, false, ErrCorrupt},
		{"a field of the wrong type", pods, `{"apiVersion":"v1","kind":"Pod","spec":{"nodeName":1}}`, false, ErrCorrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, fast := c.decodeTyped([]byte(tt.value), tt.res.StorageGVK()); fast != tt.fast {
				t.Errorf("decodeTyped accepts: %v, want %v", fast, tt.fast)
			}
			got, gvk, kind, _ := c.decodeJSON(tt.res, []byte(tt.value))
			if kind != tt.want {
				t.Fatalf("got %v, want %v", kind, tt.want)
			}
			if tt.want != nil {
				return
			}
			sgvk := tt.res.StorageGVK()
			want, _, err := c.json.Decode([]byte(tt.value), &sgvk, nil)
			if err != nil {
				t.Fatal(err)
			}
			if gvk != sgvk || !reflect.DeepEqual(got, want) {
				t.Errorf("decoded %v %#v\nserializer %#v", gvk, got, want)
			}
		})
	}

	// Every built-in kind: no top-level decoding of its own hides a key
	// from decodeTyped.
	for _, res := range table.Resources() {
		want := res.StorageGVK()
		if !c.Typed(want) {
			continue
		}
		apiVersion, kind := want.GroupVersion().String(), want.Kind
		plain := fmt.Sprintf(`{"apiVersion":%q,"kind":%q}`, apiVersion, kind)
		other := fmt.Sprintf(`{"apiVersion":%q,"kind":%q,"KIND":"Other"}`, apiVersion, kind)
		if _, fast := c.decodeTyped([]byte(plain), want); !fast {
			t.Errorf("%v: %s not decoded at once", want, plain)
		}
		if _, _, kind, _ := c.decodeJSON(res, []byte(other)); kind != ErrWrongKind {
			t.Errorf("%v: %s read as %v, want ErrWrongKind", want, other, kind)
		}
	}
}
