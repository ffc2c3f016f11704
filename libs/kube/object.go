package kube

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
)

// Object is a stored value prepared for serving. It is immutable and shared:
// the cache's store, its event window and every gRPC event point at the same
// bytes.
//
// JSON holds the object with metadata.resourceVersion set to Rev. The
// position of that value is remembered so that the same object can be served
// under another revision (a DELETED event carries the last state with the
// deletion's revision) by splicing, without parsing it again.
type Object struct {
	Namespace string
	Name      string
	Rev       int64
	JSON      []byte
	// Labels and Fields (selectable fields, including metadata.name and
	// metadata.namespace) as a selector sees them.
	Labels map[string]string
	Fields map[string]string

	rvStart, rvEnd int // JSON[rvStart:rvEnd] is the resourceVersion's digits
}

// ErrInvalidObject marks a stored value that is not a valid object of its
// resource. Such values are skipped, never served.
var ErrInvalidObject = errors.New("invalid object")

// Prepare parses a stored value of resource r found at key (namespace, name
// from the key) at revision rev. The stored value's own resourceVersion, if
// any, is replaced; apiVersion and kind are filled in when missing.
func Prepare(r *Resource, namespace, name string, value []byte, rev int64) (*Object, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(value, &top); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidObject, err)
	}
	if top == nil {
		return nil, fmt.Errorf("%w: not a JSON object", ErrInvalidObject)
	}
	var meta map[string]json.RawMessage
	if raw, ok := top["metadata"]; ok {
		if err := json.Unmarshal(raw, &meta); err != nil {
			return nil, fmt.Errorf("%w: metadata: %v", ErrInvalidObject, err)
		}
	}
	if meta == nil {
		return nil, fmt.Errorf("%w: metadata is missing", ErrInvalidObject)
	}
	var objName, objNS string
	if err := unmarshalOptional(meta["name"], &objName); err != nil {
		return nil, fmt.Errorf("%w: metadata.name: %v", ErrInvalidObject, err)
	}
	if err := unmarshalOptional(meta["namespace"], &objNS); err != nil {
		return nil, fmt.Errorf("%w: metadata.namespace: %v", ErrInvalidObject, err)
	}
	if objName != name {
		return nil, fmt.Errorf("%w: metadata.name %q does not match the key's name %q", ErrInvalidObject, objName, name)
	}
	if r.Namespaced && objNS != namespace {
		return nil, fmt.Errorf("%w: metadata.namespace %q does not match the key's namespace %q", ErrInvalidObject, objNS, namespace)
	}
	var lbls map[string]string
	if err := unmarshalOptional(meta["labels"], &lbls); err != nil {
		return nil, fmt.Errorf("%w: metadata.labels: %v", ErrInvalidObject, err)
	}
	fields := make(map[string]string, 2+len(r.Fields))
	fields["metadata.name"] = name
	fields["metadata.namespace"] = namespace
	for _, f := range r.Fields {
		fields[f.Name] = fieldValue(top, f.Path)
	}

	delete(meta, "resourceVersion")
	if _, ok := top["apiVersion"]; !ok {
		top["apiVersion"], _ = json.Marshal(r.GroupVersion())
	}
	if _, ok := top["kind"]; !ok {
		top["kind"], _ = json.Marshal(r.Kind)
	}
	delete(top, "metadata")
	out, rvAt, err := encode(top, meta)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidObject, err)
	}
	o := &Object{Namespace: namespace, Name: name, Labels: lbls, Fields: fields}
	o.JSON, o.rvStart, o.rvEnd = splice(out, rvAt, rvAt, rev)
	o.Rev = rev
	return o, nil
}

// WithRev returns the object's JSON with resourceVersion set to rev. It
// shares nothing with o.JSON when rev differs.
func (o *Object) WithRev(rev int64) []byte {
	if rev == o.Rev {
		return o.JSON
	}
	b, _, _ := splice(o.JSON, o.rvStart, o.rvEnd, rev)
	return b
}

// Metadata returns the raw metadata object of o (for Table rows).
func (o *Object) Metadata() json.RawMessage {
	var top struct {
		Metadata json.RawMessage `json:"metadata"`
	}
	_ = json.Unmarshal(o.JSON, &top)
	return top.Metadata
}

// encode writes top (without metadata) and meta as compact JSON with sorted
// keys; metadata gets "resourceVersion":"" and rvAt is the offset between
// those quotes, where the digits go.
func encode(top, meta map[string]json.RawMessage) (out []byte, rvAt int, err error) {
	var buf bytes.Buffer
	buf.Grow(256)
	writeKey := func(first *bool, k string) {
		if !*first {
			buf.WriteByte(',')
		}
		*first = false
		kb, _ := json.Marshal(k)
		buf.Write(kb)
		buf.WriteByte(':')
	}
	writeMeta := func() error {
		buf.WriteByte('{')
		first := true
		placed := false
		placeRV := func() {
			writeKey(&first, "resourceVersion")
			buf.WriteByte('"')
			rvAt = buf.Len()
			buf.WriteByte('"')
			placed = true
		}
		for _, k := range sortedKeys(meta) {
			if !placed && k > "resourceVersion" {
				placeRV()
			}
			writeKey(&first, k)
			if err := json.Compact(&buf, meta[k]); err != nil {
				return err
			}
		}
		if !placed {
			placeRV()
		}
		buf.WriteByte('}')
		return nil
	}
	buf.WriteByte('{')
	first := true
	placed := false
	for _, k := range sortedKeys(top) {
		if !placed && k > "metadata" {
			writeKey(&first, "metadata")
			if err := writeMeta(); err != nil {
				return nil, 0, err
			}
			placed = true
		}
		writeKey(&first, k)
		if err := json.Compact(&buf, top[k]); err != nil {
			return nil, 0, err
		}
	}
	if !placed {
		writeKey(&first, "metadata")
		if err := writeMeta(); err != nil {
			return nil, 0, err
		}
	}
	buf.WriteByte('}')
	return buf.Bytes(), rvAt, nil
}

func sortedKeys(m map[string]json.RawMessage) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func splice(b []byte, start, end int, rev int64) ([]byte, int, int) {
	digits := strconv.AppendInt(nil, rev, 10)
	out := make([]byte, 0, len(b)-(end-start)+len(digits))
	out = append(out, b[:start]...)
	out = append(out, digits...)
	out = append(out, b[end:]...)
	return out, start, start + len(digits)
}

func unmarshalOptional(raw json.RawMessage, v any) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	return json.Unmarshal(raw, v)
}

// fieldValue reads a dotted path as a selector value: strings as they are,
// booleans and numbers in their JSON form, anything missing as "".
func fieldValue(top map[string]json.RawMessage, path string) string {
	cur := top
	for {
		seg, rest, more := cutDot(path)
		raw, ok := cur[seg]
		if !ok {
			return ""
		}
		if !more {
			var s string
			if json.Unmarshal(raw, &s) == nil {
				return s
			}
			switch t := bytes.TrimSpace(raw); {
			case string(t) == "true", string(t) == "false":
				return string(t)
			case len(t) > 0 && (t[0] == '-' || (t[0] >= '0' && t[0] <= '9')):
				return string(t)
			}
			return ""
		}
		var next map[string]json.RawMessage
		if json.Unmarshal(raw, &next) != nil {
			return ""
		}
		cur, path = next, rest
	}
}

func cutDot(s string) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == '.' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}
