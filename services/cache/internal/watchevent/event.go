// Package watchevent owns the step from a stored change to the watch event
// a consumer of the JetStream stream serves (the cache's shards and its deep
// replay): the change's value decoded once, as an object of its resource,
// and ADDED, MODIFIED or DELETED decided from what the consumer knew of the
// object just before. libs/stream reads the records; this package decodes.
//
// Invariants: a value that cannot be served is an error and no event, never
// a partial one; a delete makes an event only for an object that was
// served (known to the consumer, or a previous value that decodes). It
// keeps no state: the consumer passes what it knew.
package watchevent

import (
	"context"
	"maps"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// ValueDecoder reads a stored value as an object of its resource:
// kube.Decoder, or one that remembers what it decoded.
type ValueDecoder interface {
	Decode(ctx context.Context, r *kube.Resource, key, namespace, name string, value []byte, rev int64) (*kube.Object, error)
}

var _ ValueDecoder = (*kube.Decoder)(nil)

// ProtobufDecoder is a ValueDecoder that can also give a PUT's object in
// kube-apiserver's protobuf encoding (kube.Decoder): Event then sets the
// event's object_protobuf, so that fanout builds protobuf watch frames
// without decoding the JSON again.
type ProtobufDecoder interface {
	ValueDecoder
	DecodeWithProtobuf(ctx context.Context, r *kube.Resource, key, namespace, name string, value []byte, rev int64) (*kube.Object, []byte, error)
}

var _ ProtobufDecoder = (*kube.Decoder)(nil)

// FromChange makes the watch event of change c, at revision rev, to the object
// name in namespace of resource r (as the registry parsed c.Key), reading
// stored values with dec (the consumer's one way to decode a value). prev
// returns the object as the consumer knows it just before rev, nil when it
// did not exist; Event calls it only when the event needs it (for a PUT,
// once its value proved valid).
//
// A MODIFIED event carries the previous state (prev_object, prev_labels,
// prev_fields) only when its labels or selectable fields differ from the
// new object's; otherwise it is marked prev_unchanged and carries none of
// it, so that the previous object's JSON is not copied under the new
// revision for every update when nearly every stream asks to omit it
// (omit_unchanged_prev). A consumer that serves a stream which did not ask
// makes it then from the object prev returned: PrevState. Labels and
// fields go on the wire as pairs sorted by key (heraldv1.SortedPairs), made
// here once per event from the object's maps, which stay as they are.
//
// It returns the event and, for a PUT, the object now stored at the key. ev
// is nil when there is nothing to send: the delete of an object the
// consumer never knew and whose previous value ingest did not carry, or a
// change of an unknown kind. err is dec's *kube.DecodeError (wrapping
// kube.ErrInvalidObject) for a PUT whose value cannot be served as an object
// of r (corrupt, undecryptable, stripped by ingest for its size, ...), which
// consumers skip; otherwise it is prev's error.
func FromChange(ctx context.Context, dec ValueDecoder, r *kube.Resource, namespace, name string, rev int64, c *heraldv1.Change, prev func() (*kube.Object, error)) (ev *heraldv1.Event, obj *kube.Object, err error) {
	ev = &heraldv1.Event{Revision: rev, Namespace: namespace, Name: name}
	switch c.Kind {
	case heraldv1.Change_PUT:
		if pd, ok := dec.(ProtobufDecoder); ok {
			obj, ev.ObjectProtobuf, err = pd.DecodeWithProtobuf(ctx, r, c.Key, namespace, name, c.Value, rev)
		} else {
			obj, err = dec.Decode(ctx, r, c.Key, namespace, name, c.Value, rev)
		}
		if err != nil {
			return nil, nil, err
		}
		ev.Type, ev.Object = heraldv1.EventType_ADDED, obj.JSON
		ev.Labels, ev.Fields = heraldv1.SortedPairs(obj.Labels), heraldv1.SortedPairs(obj.Fields)
		p, err := prev()
		if err != nil {
			return nil, nil, err
		}
		if p != nil {
			ev.Type = heraldv1.EventType_MODIFIED
			ev.PrevUnchanged = maps.Equal(p.Labels, obj.Labels) && maps.Equal(p.Fields, obj.Fields)
			if !ev.PrevUnchanged {
				ev.PrevObject = p.WithRev(rev)
				ev.PrevLabels, ev.PrevFields = heraldv1.SortedPairs(p.Labels), heraldv1.SortedPairs(p.Fields)
			}
		}
		return ev, obj, nil
	case heraldv1.Change_DELETE:
		p, err := prev()
		if err != nil {
			return nil, nil, err
		}
		if p == nil && len(c.PrevValue) > 0 {
			// An invalid previous value makes no event: it was never
			// served.
			p, _ = dec.Decode(ctx, r, c.Key, namespace, name, c.PrevValue, rev)
		}
		if p == nil {
			return nil, nil, nil // never served, nothing to delete
		}
		ev.Type, ev.Object = heraldv1.EventType_DELETED, p.WithRev(rev)
		ev.Labels, ev.Fields = heraldv1.SortedPairs(p.Labels), heraldv1.SortedPairs(p.Fields)
		return ev, nil, nil
	}
	return nil, nil, nil
}

// PrevState is ev, a MODIFIED event Event marked prev_unchanged, with the
// previous state it left out: prev (the object Event's prev returned) under
// ev's revision, for a stream that did not ask omit_unchanged_prev. It
// shares everything else with ev; ev itself is unchanged.
func PrevState(ev *heraldv1.Event, prev *kube.Object) *heraldv1.Event {
	full := shallowCopy(ev)
	full.PrevObject = prev.WithRev(ev.Revision)
	full.PrevLabels, full.PrevFields = heraldv1.SortedPairs(prev.Labels), heraldv1.SortedPairs(prev.Fields)
	return full
}

// WithoutProtobuf is ev without object_protobuf, for a stream that did not
// ask with_protobuf. It shares everything else with ev.
func WithoutProtobuf(ev *heraldv1.Event) *heraldv1.Event {
	out := shallowCopy(ev)
	out.ObjectProtobuf = nil
	return out
}

// shallowCopy is a new Event sharing ev's bytes and pairs (nobody modifies
// them).
func shallowCopy(ev *heraldv1.Event) *heraldv1.Event {
	return &heraldv1.Event{
		Type:             ev.Type,
		Revision:         ev.Revision,
		Namespace:        ev.Namespace,
		Name:             ev.Name,
		Object:           ev.Object,
		Labels:           ev.Labels,
		Fields:           ev.Fields,
		PrevObject:       ev.PrevObject,
		PrevLabels:       ev.PrevLabels,
		PrevFields:       ev.PrevFields,
		ObservedUnixNano: ev.ObservedUnixNano,
		Traceparent:      ev.Traceparent,
		ObjectProtobuf:   ev.ObjectProtobuf,
		PrevUnchanged:    ev.PrevUnchanged,
	}
}
