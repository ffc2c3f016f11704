package kube

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// Object is a stored value decoded for serving (Decoder.Decode). It is immutable and shared:
// the cache's store, its event window and every gRPC event point at the same
// bytes.
//
// JSON holds the object as kube-apiserver's JSON serializer writes it, with
// metadata.resourceVersion set to Rev (without the serializer's trailing
// newline). The position of that value is remembered so that the same object can be served
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

func splice(b []byte, start, end int, rev int64) ([]byte, int, int) {
	digits := strconv.AppendInt(nil, rev, 10)
	out := make([]byte, 0, len(b)-(end-start)+len(digits))
	out = append(out, b[:start]...)
	out = append(out, digits...)
	out = append(out, b[end:]...)
	return out, start, start + len(digits)
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
