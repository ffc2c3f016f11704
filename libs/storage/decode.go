package storage

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsv1beta1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1beta1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8sjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	clientscheme "k8s.io/client-go/kubernetes/scheme"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	kjson "sigs.k8s.io/json"
)

// protobufPrefix starts every protobuf value kube-apiserver writes: the
// magic bytes before the runtime.Unknown envelope.
var protobufPrefix = []byte("k8s\x00")

// errDecoderPanicked is the cause of an ErrCorrupt that came from a panic in
// a third-party decoder; the fuzz test fails on it.
var errDecoderPanicked = errors.New("decoder panicked")

// Codec reads stored values and encodes objects as kube-apiserver serves
// them. It owns a private scheme (client-go's types, registered with
// k8s.io/api's install functions, meta.k8s.io/v1, apiextensions.k8s.io/v1
// and apiregistration.k8s.io/v1) so that nothing global is shared or
// mutated. Safe for concurrent use.
type Codec struct {
	scheme     *runtime.Scheme
	json       *k8sjson.Serializer
	protobuf   *protobuf.Serializer
	encryption *Encryption
}

// NewCodec returns a codec that decrypts with enc (nil: nothing encrypted).
func NewCodec(enc *Encryption) (*Codec, error) {
	s := runtime.NewScheme()
	if err := clientscheme.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("building scheme: %w", err)
	}
	// Status, WatchEvent, List options in the core version, as client-go's
	// scheme package does in its init.
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	if err := metav1.AddMetaToScheme(s); err != nil {
		return nil, fmt.Errorf("building scheme: %w", err)
	}
	// The kinds of kube-apiserver's two other servers: CRDs and
	// APIServices. Only versioned types are registered (the served one,
	// and v1beta1 CRDs, as kube-apiserver stores them): the internal ones
	// stay out of the scheme.
	if err := apiextensionsv1.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("building scheme: %w", err)
	}
	if err := apiextensionsv1beta1.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("building scheme: %w", err)
	}
	if err := apiregistrationv1.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("building scheme: %w", err)
	}
	return &Codec{
		scheme: s,
		// kube-apiserver's JSON serializer: not pretty, not strict, not YAML.
		json:       k8sjson.NewSerializerWithOptions(k8sjson.DefaultMetaFactory, s, s, k8sjson.SerializerOptions{}),
		protobuf:   protobuf.NewSerializer(s, s),
		encryption: enc,
	}, nil
}

// Typed reports whether gvk decodes into a Go type (built-in kinds); other
// kinds (custom resources) decode into unstructured objects from JSON.
func (c *Codec) Typed(gvk schema.GroupVersionKind) bool { return c.scheme.Recognizes(gvk) }

// Object is one decoded value: the object in its storage version with
// metadata.resourceVersion set to the key's mod revision, and what a cache
// indexes. It must be treated as immutable: it is shared by every reader and
// encoder, and its encodings are made without touching it.
type Object struct {
	codec *Codec
	obj   runtime.Object
	gvk   schema.GroupVersionKind

	Namespace string
	Name      string
	Labels    labels.Set
	// Fields are the selectable fields as kube-apiserver's registry
	// computes them (GetAttrs), keyed by field name.
	Fields          fields.Set
	ResourceVersion int64
	// Encrypted reports whether the value was stored encrypted.
	Encrypted bool
}

// Runtime returns the decoded object (typed, or *unstructured.Unstructured
// for custom resources). Never modify it.
func (o *Object) Runtime() runtime.Object { return o.obj }

// GroupVersionKind is the object's stored kind.
func (o *Object) GroupVersionKind() schema.GroupVersionKind { return o.gvk }

// JSON is the object exactly as kube-apiserver's JSON serializer writes it in
// a GET response: encoding/json of the object with apiVersion and kind set,
// ending with a newline.
func (o *Object) JSON() ([]byte, error) { return o.codec.EncodeJSON(o.obj) }

// Protobuf is the object as kube-apiserver's protobuf serializer writes it
// ("k8s\x00" + runtime.Unknown). Custom resources have none: ErrNoProtobuf.
func (o *Object) Protobuf() ([]byte, error) { return o.codec.EncodeProtobuf(o.obj) }

// PartialObjectMetadata is the object's metadata as kube-apiserver returns it
// for "as=PartialObjectMetadata;g=meta.k8s.io;v=v1". It shares maps and
// slices with the object: never modify it.
func (o *Object) PartialObjectMetadata() *metav1.PartialObjectMetadata {
	m, err := meta.Accessor(o.obj)
	if err != nil {
		// Every decoded object has ObjectMeta; Decode checked it.
		return nil
	}
	p := meta.AsPartialObjectMetadata(m)
	p.TypeMeta = metav1.TypeMeta{APIVersion: "meta.k8s.io/v1", Kind: "PartialObjectMetadata"}
	return p
}

// EncodeJSON writes obj (apiVersion and kind already set, as on every decoded
// object) with kube-apiserver's JSON serializer.
func (c *Codec) EncodeJSON(obj runtime.Object) ([]byte, error) {
	var buf bytes.Buffer
	if err := c.json.Encode(obj, &buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// EncodeProtobuf writes obj with kube-apiserver's protobuf serializer.
func (c *Codec) EncodeProtobuf(obj runtime.Object) ([]byte, error) {
	if _, ok := obj.(runtime.Unstructured); ok {
		return nil, ErrNoProtobuf
	}
	var buf bytes.Buffer
	if err := c.protobuf.Encode(obj, &buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Decode reads one etcd value of resource res: key is the full etcd key (the
// authenticated data of encrypted values), stored the value as etcd holds
// it, revision its mod revision. On failure it returns a *DecodeError and no
// object.
func (c *Codec) Decode(ctx context.Context, res *Resource, key, stored []byte, revision int64) (obj *Object, err error) {
	encrypted, decrypted := false, false
	fail := func(kind, cause error) (*Object, error) {
		return nil, &DecodeError{Resource: res.GroupResource(), Key: string(key), Revision: revision, Kind: kind,
			Encrypted: encrypted, redact: decrypted, cause: cause}
	}
	// The generated protobuf and JSON decoders are third-party code run on
	// outside input: a panic in them must become a skipped value, not a
	// crashed cache.
	defer func() {
		if r := recover(); r != nil {
			obj, err = fail(ErrCorrupt, errDecoderPanicked)
		}
	}()

	plain, encrypted, kind, cause := c.encryption.fromStorage(ctx, res.GroupResource(), key, stored)
	if kind != nil {
		return fail(kind, cause)
	}
	decrypted = encrypted
	var (
		out runtime.Object
		gvk schema.GroupVersionKind
	)
	if bytes.HasPrefix(plain, protobufPrefix) {
		out, gvk, kind, cause = c.decodeProtobuf(res, plain)
	} else {
		out, gvk, kind, cause = c.decodeJSON(res, plain)
	}
	if kind != nil {
		return fail(kind, cause)
	}
	m, err := meta.Accessor(out)
	if err != nil {
		return fail(ErrWrongKind, err)
	}
	readAsKubeAPIServer(out)
	// Selectable fields are the stored kind's (a served version's field
	// labels map onto them: Resource.FieldLabels).
	flds := selectableFields(out, m, res.Namespaced)
	if res.Convert != nil && gvk == res.StorageGVK() && gvk != res.ServedGVK() {
		if out, err = res.Convert(out); err != nil {
			return fail(ErrWrongKind, err)
		}
		if m, err = meta.Accessor(out); err != nil {
			return fail(ErrWrongKind, err)
		}
		gvk = res.ServedGVK()
	}
	// The object carries its kind from now on, so encoders never have to
	// set it (kube-apiserver's versioning encoder sets the same one).
	out.GetObjectKind().SetGroupVersionKind(gvk)
	m.SetResourceVersion(strconv.FormatInt(revision, 10))
	return &Object{
		codec:           c,
		obj:             out,
		gvk:             gvk,
		Namespace:       m.GetNamespace(),
		Name:            m.GetName(),
		Labels:          labels.Set(m.GetLabels()),
		Fields:          flds,
		ResourceVersion: revision,
		Encrypted:       encrypted,
	}, nil
}

func (c *Codec) decodeProtobuf(res *Resource, data []byte) (runtime.Object, schema.GroupVersionKind, error, error) {
	out, gvk, err := c.protobuf.Decode(data, nil, nil)
	switch {
	case err != nil && (runtime.IsNotRegisteredError(err) || runtime.IsMissingKind(err) || runtime.IsMissingVersion(err)):
		return nil, schema.GroupVersionKind{}, ErrUnknownKind, err
	case err != nil:
		return nil, schema.GroupVersionKind{}, ErrCorrupt, err
	case gvk == nil || *gvk != res.StorageGVK():
		return nil, schema.GroupVersionKind{}, ErrWrongKind, fmt.Errorf("stored %v, resource stores %v", gvk, res.StorageGVK())
	}
	return out, *gvk, nil, nil
}

func (c *Codec) decodeJSON(res *Resource, data []byte) (runtime.Object, schema.GroupVersionKind, error, error) {
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	if len(trimmed) == 0 {
		return nil, schema.GroupVersionKind{}, ErrCorrupt, errors.New("empty value")
	}
	if trimmed[0] != '{' {
		if json.Valid(data) {
			return nil, schema.GroupVersionKind{}, ErrNotObject, nil
		}
		return nil, schema.GroupVersionKind{}, ErrCorrupt, errors.New("neither protobuf nor JSON")
	}
	want := res.StorageGVK()
	if c.Typed(want) {
		if out, ok := c.decodeTyped(data, want); ok {
			return out, want, nil, nil
		}
	}
	// Everything else reads apiVersion and kind first, as the serializer's
	// Decode does.
	found, err := k8sjson.DefaultMetaFactory.Interpret(data)
	if err != nil {
		return nil, schema.GroupVersionKind{}, ErrCorrupt, err
	}
	// Hand-written values may leave apiVersion and kind out: they are the
	// resource's storage kind then, as kube-apiserver's decoder defaults them.
	gvk := *found
	if gvk.Kind == "" {
		gvk.Kind = want.Kind
	}
	if gvk.Group == "" && gvk.Version == "" {
		gvk.Group, gvk.Version = want.Group, want.Version
	}
	if gvk.GroupKind() != want.GroupKind() {
		return nil, schema.GroupVersionKind{}, ErrWrongKind, fmt.Errorf("stored %v, resource stores %v", gvk, want)
	}
	if c.Typed(want) {
		// A built-in kind in another version (JSON written by an older
		// kube-apiserver) would need kube-apiserver's internal conversions.
		if gvk != want {
			if c.Typed(gvk) {
				return nil, schema.GroupVersionKind{}, ErrWrongKind, fmt.Errorf("stored %v, resource stores %v", gvk, want)
			}
			return nil, schema.GroupVersionKind{}, ErrUnknownKind, fmt.Errorf("stored %v", gvk)
		}
		// What the (non-strict) serializer's Decode does for this kind,
		// into a new object: decodeTyped's may be half filled.
		out, err := c.scheme.New(want)
		if err != nil {
			return nil, schema.GroupVersionKind{}, ErrUnknownKind, err
		}
		if err := kjson.UnmarshalCaseSensitivePreserveInts(data, out); err != nil {
			return nil, schema.GroupVersionKind{}, ErrCorrupt, err
		}
		return out, want, nil, nil
	}
	// Custom resources: any stored version of the kind; converting to the
	// served version is the caller's business.
	u := &unstructured.Unstructured{}
	if _, _, err := unstructured.UnstructuredJSONScheme.Decode(data, &gvk, u); err != nil {
		return nil, schema.GroupVersionKind{}, ErrCorrupt, err
	}
	return u, gvk, nil, nil
}

// decodeTyped decodes data into a new object of the built-in kind want, as
// the serializer's Decode does, and reports whether the serializer would
// have found want in it too: apiVersion and kind are want's (so both are
// present) and no top-level key is unknown. The serializer reads them with
// encoding/json, which matches keys case-insensitively, where the decode
// matches them exactly: a "KIND" after "kind", or a "Kind" that is not a
// string, is an unknown field here but another kind or an error there. This
// spares that second pass over the whole value on every event of a
// JSON-stored resource; on false, decodeJSON reads the value as before,
// so a value that falls back (one without apiVersion and kind, or with a
// top-level field this build does not know) costs one decode more than it
// did.
func (c *Codec) decodeTyped(data []byte, want schema.GroupVersionKind) (obj runtime.Object, ok bool) {
	// A decoder that panics on a value of another kind must not turn its
	// ErrWrongKind into Decode's ErrCorrupt: the old path decides.
	defer func() {
		if recover() != nil {
			obj, ok = nil, false
		}
	}()
	out, err := c.scheme.New(want)
	if err != nil {
		return nil, false
	}
	// Strict errors change nothing in what is decoded: they name the
	// unknown fields.
	unknown, err := kjson.UnmarshalStrict(data, out, kjson.DisallowUnknownFields)
	// kjson keeps the first 100 strict errors only: a top-level one may
	// be past them.
	if err != nil || len(unknown) >= 100 || out.GetObjectKind().GroupVersionKind() != want {
		return nil, false
	}
	for _, u := range unknown {
		// A nested field's path has a dot ("spec.x").
		if f, ok := u.(kjson.FieldError); !ok || !strings.Contains(f.FieldPath(), ".") {
			return nil, false
		}
	}
	return out, true
}

// readAsKubeAPIServer applies kube-apiserver's decode-time defaulting (its
// storage codec defaults what it reads) where an object it wrote itself can
// still lack the default (seen against kube-apiserver v1.37.2 in
// integration/kubeapi): a PersistentVolumeClaim is stored with an empty
// status (its strategy clears status on create) and served with phase
// Pending, as SetDefaults_PersistentVolumeClaim sets it; PersistentVolumes
// alike. The rest of kube-apiserver's defaulting is a no-op on objects it
// wrote (they were defaulted on the way in); it lives in k8s.io/kubernetes'
// internal packages, which Herald does not link.
func readAsKubeAPIServer(obj runtime.Object) {
	switch o := obj.(type) {
	case *corev1.PersistentVolumeClaim:
		if o.Status.Phase == "" {
			o.Status.Phase = corev1.ClaimPending
		}
	case *corev1.PersistentVolume:
		if o.Status.Phase == "" {
			o.Status.Phase = corev1.VolumePending
		}
	}
}
