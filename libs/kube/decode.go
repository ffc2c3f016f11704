package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"herald.dev/libs/storage"
)

// ErrInvalidObject marks a stored value that cannot be served as an object
// of its resource. Every error of Decoder.Decode wraps it (and is a
// *DecodeError saying why); such values are skipped, never served.
var ErrInvalidObject = errors.New("invalid object")

// Why a stored value was skipped: the reason label of the metrics counting
// skipped values. The first ones are libs/storage's failure kinds.
const (
	ReasonUnknownKind         = "unknown_kind"         // protobuf of a kind Herald does not know
	ReasonWrongKind           = "wrong_kind"           // another kind than the resource stores
	ReasonCorrupt             = "corrupt"              // truncated envelope, invalid JSON, neither
	ReasonNotObject           = "not_object"           // JSON that is not an object
	ReasonDecrypt             = "decrypt"              // no configured key decrypts it
	ReasonUnsupportedProvider = "unsupported_provider" // KMS, or an unknown provider
	ReasonUnknownKey          = "unknown_key"          // a key outside the resource's layout
	ReasonKeyMismatch         = "key_mismatch"         // metadata.name/namespace differ from the key's
	ReasonEmpty               = "empty"                // a PUT without a value
	ReasonEncode              = "encode"               // decoded, but not encodable as JSON
	ReasonInvalidCRD          = "invalid_crd"          // a CRD Herald cannot serve anything of (crd.go)
)

// DecodeError is a stored value that was skipped. Reason is one of the
// Reason constants. It wraps ErrInvalidObject and the cause (for decoding
// failures a *storage.DecodeError, whose message names resource, key and
// revision and never quotes decrypted bytes).
type DecodeError struct {
	Reason string
	err    error
}

func (e *DecodeError) Error() string { return e.Reason + ": " + e.err.Error() }

// Unwrap returns ErrInvalidObject and the cause.
func (e *DecodeError) Unwrap() []error { return []error{ErrInvalidObject, e.err} }

// Reason is why err (from Decoder.Decode) skipped a value; "" when err is
// not a decoding failure.
func Reason(err error) string {
	var de *DecodeError
	if errors.As(err, &de) {
		return de.Reason
	}
	return ""
}

// KeyLayoutError is the error of a value at a key under r's prefix that r's
// layout does not allow (ParseKey found r but refused the key).
func KeyLayoutError(r *Resource, key string, rev int64) error {
	layout := "<name>"
	if r.Namespaced {
		layout = "<namespace>/<name>"
	}
	return &DecodeError{Reason: ReasonUnknownKey, err: fmt.Errorf("%s %q at revision %d: %w: want %s%s",
		r.ID(), key, rev, storage.ErrUnknownKey, r.KeyPrefix(), layout)}
}

// storageReasons maps libs/storage's failure kinds to reasons.
var storageReasons = []struct {
	kind   error
	reason string
}{
	{storage.ErrUnknownKind, ReasonUnknownKind},
	{storage.ErrWrongKind, ReasonWrongKind},
	{storage.ErrCorrupt, ReasonCorrupt},
	{storage.ErrNotObject, ReasonNotObject},
	{storage.ErrDecrypt, ReasonDecrypt},
	{storage.ErrUnsupportedProvider, ReasonUnsupportedProvider},
	{storage.ErrUnknownKey, ReasonUnknownKey},
}

// Decoder turns stored values into Objects exactly as kube-apiserver reads
// and serves them: libs/storage's Codec decrypts (kube-apiserver's
// EncryptionConfiguration), decodes protobuf or JSON into the typed object
// (unstructured for custom resources), sets metadata.resourceVersion to the
// key's mod revision and encodes the JSON with kube-apiserver's serializer.
// It is the only place a stored value is read: the cache's snapshot, its
// stream consumer and its deep replay all call Decode, so a value reads the
// same whichever path it takes. Safe for concurrent use.
type Decoder struct {
	codec *storage.Codec
}

// NewDecoder returns a decoder that decrypts with enc (nil: no encryption
// configured, as kube-apiserver without --encryption-provider-config).
func NewDecoder(enc *storage.Encryption) (*Decoder, error) {
	c, err := storage.NewCodec(enc)
	if err != nil {
		return nil, err
	}
	return &Decoder{codec: c}, nil
}

// Decode reads value, stored at key (of resource r, object namespace/name as
// r's layout parsed the key) with mod revision rev. On failure it returns a
// *DecodeError and no object: nothing of a value that failed is ever served.
func (d *Decoder) Decode(ctx context.Context, r *Resource, key, namespace, name string, value []byte, rev int64) (*Object, error) {
	o, _, err := d.decode(ctx, r, key, namespace, name, value, rev, false)
	return o, err
}

// DecodeWithProtobuf is Decode, and also returns the object as
// kube-apiserver's protobuf serializer writes it (nil for a custom
// resource, which has none, or if it does not encode). The typed object is
// at hand only here: encoding it now costs a fraction of what decoding the
// JSON again costs every protobuf watch later. The bytes are not part of
// the Object, so that a cache's state does not hold them for every object.
func (d *Decoder) DecodeWithProtobuf(ctx context.Context, r *Resource, key, namespace, name string, value []byte, rev int64) (*Object, []byte, error) {
	return d.decode(ctx, r, key, namespace, name, value, rev, true)
}

func (d *Decoder) decode(ctx context.Context, r *Resource, key, namespace, name string, value []byte, rev int64, withProtobuf bool) (*Object, []byte, error) {
	fail := func(reason string, err error) (*Object, []byte, error) {
		return nil, nil, &DecodeError{Reason: reason, err: err}
	}
	if len(value) == 0 {
		return fail(ReasonEmpty, fmt.Errorf("%s %q at revision %d: no value", r.ID(), key, rev))
	}
	so, err := d.codec.Decode(ctx, r.stored, []byte(key), value, rev)
	if err != nil {
		for _, sr := range storageReasons {
			if errors.Is(err, sr.kind) {
				return fail(sr.reason, err)
			}
		}
		return fail(ReasonCorrupt, err)
	}
	labels := so.Labels
	if r.custom != nil {
		// As kube-apiserver reads it: coerced to and defaulted from its
		// CRD's schemas (crdschema.go). The object is this decode's own
		// until it is encoded below.
		u, ok := so.Runtime().(*unstructured.Unstructured)
		if !ok {
			return fail(ReasonWrongKind, fmt.Errorf("%s %q at revision %d: not a custom resource's object", r.ID(), key, rev))
		}
		if err := r.custom.schemas.fromStorage(u, r.Version, r.custom.rewriteVersion); err != nil {
			return fail(ReasonCorrupt, fmt.Errorf("%s %q at revision %d: reading it with its CRD's schema: %w", r.ID(), key, rev, err))
		}
		labels = u.GetLabels()
	}
	if gvk := so.GroupVersionKind(); r.custom != nil && gvk.Version != r.Version {
		// Stored in another version of the kind: with the None conversion
		// strategy kube-apiserver only rewrites the apiVersion; with a
		// webhook, only the webhook could convert it.
		if !r.custom.rewriteVersion {
			return fail(ReasonWrongKind, fmt.Errorf("%s %q at revision %d: stored as %s, served as %s through a conversion webhook",
				r.ID(), key, rev, gvk.Version, r.Version))
		}
		so.Runtime().GetObjectKind().SetGroupVersionKind(gvk.GroupKind().WithVersion(r.Version))
	}
	if so.Name != name || (r.Namespaced && so.Namespace != namespace) {
		return fail(ReasonKeyMismatch, fmt.Errorf("%s %q at revision %d: metadata names %q/%q, the key %q/%q",
			r.ID(), key, rev, so.Namespace, so.Name, namespace, name))
	}
	js, err := so.JSON()
	if err != nil {
		return fail(ReasonEncode, fmt.Errorf("%s %q at revision %d: %w", r.ID(), key, rev, err))
	}
	js = bytes.TrimSuffix(js, []byte("\n"))
	start, end, ok := locateResourceVersion(js)
	if !ok || string(js[start:end]) != strconv.FormatInt(rev, 10) {
		return fail(ReasonEncode, fmt.Errorf("%s %q at revision %d: no metadata.resourceVersion in the encoded object", r.ID(), key, rev))
	}
	o := &Object{Namespace: namespace, Name: name, Rev: rev, JSON: js, Labels: labels, rvStart: start, rvEnd: end}
	o.Fields = r.fieldSet(namespace, name, so.Fields, js)
	var pb []byte
	if withProtobuf && r.custom == nil {
		// A kind without protobuf (or an object that does not encode)
		// leaves the protobuf watch to its own encoding, from the JSON.
		pb, _ = so.Protobuf()
	}
	return o, pb, nil
}

// fieldSet is the selectable fields of an object of r: metadata.name and
// metadata.namespace, then each of r's Fields by its label, from the
// fields the stored kind's registry computed or, for the others, from the
// object's JSON (parsed only when a field needs it).
func (r *Resource) fieldSet(namespace, name string, computed map[string]string, js []byte) map[string]string {
	out := make(map[string]string, 2+len(r.Fields))
	out["metadata.name"] = name
	out["metadata.namespace"] = namespace
	var top map[string]json.RawMessage
	for i, f := range r.Fields {
		if r.computed[i] {
			out[f.Name] = computed[f.Path]
			continue
		}
		if top == nil {
			if json.Unmarshal(js, &top) != nil || top == nil {
				top = map[string]json.RawMessage{}
			}
		}
		out[f.Name] = fieldValue(top, f.Path)
	}
	return out
}

// locateResourceVersion finds the characters of metadata.resourceVersion's
// string value in a JSON object: b[start:end]. It follows the object's
// structure (a "resourceVersion" elsewhere, as in an Event's
// involvedObject, is not it) without decoding anything, and reports false
// for anything it cannot follow.
func locateResourceVersion(b []byte) (start, end int, ok bool) {
	ms, _, ok := member(b, skipSpace(b, 0), "metadata")
	if !ok {
		return 0, 0, false
	}
	vs, ve, ok := member(b, ms, "resourceVersion")
	if !ok || b[vs] != '"' {
		return 0, 0, false
	}
	for i := vs + 1; i < ve-1; i++ {
		if b[i] == '\\' {
			return 0, 0, false // digits never need escaping
		}
	}
	return vs + 1, ve - 1, true
}

// member finds the value of key name in the object starting at b[i]:
// b[start:end] is the value.
func member(b []byte, i int, name string) (start, end int, ok bool) {
	if i >= len(b) || b[i] != '{' {
		return 0, 0, false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return 0, 0, false
	}
	for i < len(b) {
		ke, ok := skipString(b, i)
		if !ok {
			return 0, 0, false
		}
		key := b[i+1 : ke-1]
		i = skipSpace(b, ke)
		if i >= len(b) || b[i] != ':' {
			return 0, 0, false
		}
		i = skipSpace(b, i+1)
		ve, ok := skipValue(b, i)
		if !ok {
			return 0, 0, false
		}
		if string(key) == name {
			return i, ve, true
		}
		i = skipSpace(b, ve)
		if i >= len(b) || b[i] != ',' {
			return 0, 0, false // '}' or garbage: no such member
		}
		i = skipSpace(b, i+1)
	}
	return 0, 0, false
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at b[i].
func skipString(b []byte, i int) (int, bool) {
	if i >= len(b) || b[i] != '"' {
		return 0, false
	}
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1, true
		}
	}
	return 0, false
}

// skipValue returns the index after the value starting at b[i]: a string,
// an object or array (by nesting, strings skipped), or a literal.
func skipValue(b []byte, i int) (int, bool) {
	if i >= len(b) {
		return 0, false
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				e, ok := skipString(b, i)
				if !ok {
					return 0, false
				}
				i = e
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1, true
				}
			}
			i++
		}
		return 0, false
	}
	start := i
	for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' && b[i] != '\t' && b[i] != '\n' && b[i] != '\r' {
		i++
	}
	return i, i > start
}
