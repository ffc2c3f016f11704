package storage

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	metav1beta1 "k8s.io/apimachinery/pkg/apis/meta/v1beta1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// The encodings of served objects. Herald's cache hands objects out as the
// JSON kube-apiserver serves (Object.JSON); the other encodings a client can
// negotiate are made from those bytes here, exactly as kube-apiserver makes
// them from its objects: protobuf (a built-in kind's JSON decoded into its
// Go type once, then kube's protobuf serializer), PartialObjectMetadata
// (kube's meta.AsPartialObjectMetadata of the object), YAML (kube's YAML
// serializer: its JSON converted), and the watch stream framings.

// Media types Herald serves, in kube-apiserver's order of preference (the
// order of its codec factory: the first one answers an empty Accept or
// "*/*").
const (
	MediaJSON     = runtime.ContentTypeJSON
	MediaYAML     = runtime.ContentTypeYAML
	MediaProtobuf = runtime.ContentTypeProtobuf
	// MediaProtobufWatch is the Content-Type of a protobuf watch stream.
	MediaProtobufWatch = runtime.ContentTypeProtobuf + ";stream=watch"
)

// Kinds a client may ask a response to be transformed into (the "as"
// parameter, with g=meta.k8s.io and v=v1 or v1beta1).
const (
	KindTable                     = "Table"
	KindPartialObjectMetadata     = "PartialObjectMetadata"
	KindPartialObjectMetadataList = "PartialObjectMetadataList"
)

// DecodeServed decodes the JSON of a built-in object of kind gvk, as served,
// into its Go type, to be encoded as protobuf. Custom resources have no Go
// type: ErrNoProtobuf.
func (c *Codec) DecodeServed(gvk schema.GroupVersionKind, data []byte) (obj runtime.Object, err error) {
	if !c.Typed(gvk) {
		return nil, ErrNoProtobuf
	}
	// Third-party decoders on bytes from the network: never a panic.
	defer func() {
		if r := recover(); r != nil {
			obj, err = nil, fmt.Errorf("decoding %v: %w", gvk, errDecoderPanicked)
		}
	}()
	out, _, err := c.json.Decode(data, &gvk, nil)
	if err != nil {
		return nil, fmt.Errorf("decoding %v: %w", gvk, err)
	}
	if got := out.GetObjectKind().GroupVersionKind(); got != gvk {
		return nil, fmt.Errorf("decoding %v: got %v", gvk, got)
	}
	return out, nil
}

// Metadata is kube-apiserver's PartialObjectMetadata (in meta.k8s.io
// version gv) of an object served as data; custom reports whether the
// object is a custom resource (read, as kube-apiserver reads it, through
// the unstructured accessors).
func Metadata(data []byte, custom bool, gv schema.GroupVersion) (*metav1.PartialObjectMetadata, error) {
	var p *metav1.PartialObjectMetadata
	if custom {
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(data); err != nil {
			return nil, fmt.Errorf("reading metadata: %w", err)
		}
		p = meta.AsPartialObjectMetadata(u)
	} else {
		// A typed object's ObjectMeta is exactly its JSON's metadata, read
		// as kube's JSON decoder reads it (case-sensitive).
		p = &metav1.PartialObjectMetadata{}
		var top struct {
			APIVersion string             `json:"apiVersion"`
			Kind       string             `json:"kind"`
			Metadata   *metav1.ObjectMeta `json:"metadata"`
		}
		top.Metadata = &p.ObjectMeta
		if err := kjson.UnmarshalCaseSensitivePreserveInts(data, &top); err != nil {
			return nil, fmt.Errorf("reading metadata: %w", err)
		}
		internalMetadata(top.APIVersion, top.Kind, &p.ObjectMeta)
	}
	p.SetGroupVersionKind(gv.WithKind(KindPartialObjectMetadata))
	return p, nil
}

// BookmarkObject is the object of a BOOKMARK event of a built-in kind: an
// empty object of the kind with only resourceVersion (and the annotations
// given, e.g. k8s.io/initial-events-end) set.
func (c *Codec) BookmarkObject(gvk schema.GroupVersionKind, rv string, annotations map[string]string) (runtime.Object, error) {
	obj, err := c.scheme.New(gvk)
	if err != nil {
		return nil, ErrNoProtobuf
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, err
	}
	m.SetResourceVersion(rv)
	m.SetAnnotations(annotations)
	asConvertedFromInternal(obj)
	obj.GetObjectKind().SetGroupVersionKind(gvk)
	return obj, nil
}

// internalMetadata changes a served object's metadata into its internal
// object's, which is what kube-apiserver's PartialObjectMetadata and Table
// rows show: a DaemonSet's deprecated.daemonset.template.generation
// annotation is its internal spec.templateGeneration
// (pkg/apis/apps/v1/conversion.go), not an annotation.
func internalMetadata(apiVersion, kind string, m *metav1.ObjectMeta) {
	if kind != "DaemonSet" || apiVersion != "apps/v1" {
		return
	}
	if _, ok := m.Annotations[appsv1.DeprecatedTemplateGeneration]; ok {
		delete(m.Annotations, appsv1.DeprecatedTemplateGeneration)
		if len(m.Annotations) == 0 {
			m.Annotations = nil
		}
	}
}

// asConvertedFromInternal gives an empty object what kube-apiserver's
// conversion of an empty internal object to it sets (its bookmarks are
// internal objects converted to the served version): integers the
// internal type holds by value and the served one by pointer, and the
// DaemonSet's template-generation annotation (pkg/apis/apps/v1/conversion.go).
// Seen against kube-apiserver v1.37.2 in integration/kubeapi.
func asConvertedFromInternal(obj runtime.Object) {
	zero := func() *int32 { return new(int32) }
	switch o := obj.(type) {
	case *appsv1.Deployment:
		o.Spec.Replicas = zero()
	case *appsv1.ReplicaSet:
		o.Spec.Replicas = zero()
	case *appsv1.StatefulSet:
		o.Spec.Replicas = zero()
	case *appsv1.DaemonSet:
		ann := map[string]string{appsv1.DeprecatedTemplateGeneration: "0"}
		for k, v := range o.Annotations {
			ann[k] = v
		}
		o.Annotations = ann
	}
}

// Encode writes obj (with its kind set) in media type mt: kube's JSON
// serializer (pretty: indented), its YAML serializer, or its protobuf
// serializer.
func (c *Codec) Encode(mt string, pretty bool, obj runtime.Object) ([]byte, error) {
	switch mt {
	case MediaProtobuf:
		return c.EncodeProtobuf(obj)
	case MediaYAML:
		b, err := json.Marshal(obj)
		if err != nil {
			return nil, err
		}
		return yaml.JSONToYAML(b)
	}
	if pretty {
		return json.MarshalIndent(obj, "", "  ")
	}
	return c.EncodeJSON(obj)
}

// FromJSON turns a JSON response body (kube's JSON serializer's output: a
// compact document, with or without its final newline) into the same
// response in media type mt (JSON or YAML): what kube-apiserver's pretty
// JSON and YAML serializers write for the object the JSON encodes.
func FromJSON(mt string, pretty bool, body []byte) ([]byte, error) {
	switch {
	case mt == MediaYAML:
		return yaml.JSONToYAML(body)
	case pretty:
		var b bytes.Buffer
		if err := json.Indent(&b, bytes.TrimRight(body, "\n"), "", "  "); err != nil {
			return nil, err
		}
		return b.Bytes(), nil
	}
	return body, nil
}

// MetadataList is kube-apiserver's PartialObjectMetadataList (meta.k8s.io
// version gv) of a list's items served as JSON, with the list's metadata.
func MetadataList(items [][]byte, custom bool, gv schema.GroupVersion, lm metav1.ListMeta) (runtime.Object, error) {
	// The list's items stay nil when there are none, as kube-apiserver's
	// transformation leaves them ("items":null in JSON).
	var parts []metav1.PartialObjectMetadata
	for _, it := range items {
		p, err := Metadata(it, custom, gv)
		if err != nil {
			return nil, err
		}
		parts = append(parts, *p)
	}
	if gv == metav1beta1.SchemeGroupVersion {
		l := &metav1beta1.PartialObjectMetadataList{ListMeta: lm, Items: parts}
		l.SetGroupVersionKind(gv.WithKind(KindPartialObjectMetadataList))
		return l, nil
	}
	l := &metav1.PartialObjectMetadataList{ListMeta: lm, Items: parts}
	l.SetGroupVersionKind(gv.WithKind(KindPartialObjectMetadataList))
	return l, nil
}

// TypedList is the Go list of a built-in kind (gvk is the items' kind:
// PodList for Pod) holding items served as JSON, with the list's metadata;
// kube-apiserver sends an empty list's items as [], never null.
func (c *Codec) TypedList(gvk schema.GroupVersionKind, items [][]byte, lm metav1.ListMeta) (runtime.Object, error) {
	listGVK := gvk.GroupVersion().WithKind(gvk.Kind + "List")
	list, err := c.scheme.New(listGVK)
	if err != nil || !c.Typed(gvk) {
		return nil, ErrNoProtobuf
	}
	objs := make([]runtime.Object, 0, len(items))
	for _, it := range items {
		o, err := c.DecodeServed(gvk, it)
		if err != nil {
			return nil, err
		}
		objs = append(objs, o)
	}
	if err := meta.SetList(list, objs); err != nil {
		return nil, err
	}
	la, err := meta.ListAccessor(list)
	if err != nil {
		return nil, err
	}
	la.SetResourceVersion(lm.ResourceVersion)
	la.SetContinue(lm.Continue)
	la.SetRemainingItemCount(lm.RemainingItemCount)
	list.GetObjectKind().SetGroupVersionKind(listGVK)
	return list, nil
}

// JSONWatchEvent is one event of a JSON watch stream: kube-apiserver's
// metav1.WatchEvent in JSON, one per line, the object embedded as encoded.
func JSONWatchEvent(typ string, object []byte) []byte {
	object = bytes.TrimRight(object, "\n")
	b := make([]byte, 0, len(object)+32)
	b = append(b, `{"type":"`...)
	b = append(b, typ...)
	b = append(b, `","object":`...)
	b = append(b, object...)
	b = append(b, "}\n"...)
	return b
}

// ProtobufWatchEvent is one frame of a protobuf watch stream, as
// kube-apiserver writes it and client-go reads it: a 4-byte big-endian
// length (protobuf.LengthDelimitedFramer), then a metav1.WatchEvent encoded
// without the "k8s\x00" envelope (kube's raw protobuf serializer), whose
// object is the embedded object's full protobuf encoding (with envelope).
func ProtobufWatchEvent(typ string, object []byte) ([]byte, error) {
	ev := metav1.WatchEvent{Type: typ, Object: runtime.RawExtension{Raw: object}}
	n := ev.Size()
	b := make([]byte, 4+n)
	binary.BigEndian.PutUint32(b, uint32(n))
	if _, err := ev.MarshalToSizedBuffer(b[4:]); err != nil {
		return nil, err
	}
	return b, nil
}

// WatchEvent frames one event of a watch stream of media type mt (JSON or
// protobuf), object already encoded in that media type.
func WatchEvent(mt, typ string, object []byte) ([]byte, error) {
	if mt == MediaProtobuf {
		return ProtobufWatchEvent(typ, object)
	}
	return JSONWatchEvent(typ, object), nil
}
