package cache

import (
	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/services/cache/internal/watchevent"
)

// event is one event as the shard prepared it, once, for every stream
// (watchevent.FromChange): the wire event that most streams get as it is, and what
// the others get made for them alone (wire). The window, the subscribers'
// queues and a deep replay hold events; nobody modifies one.
type event struct {
	*heraldv1.Event
	// prev: for an update marked prev_unchanged, the previous object, left
	// out of the wire event; a stream that did not ask omit_unchanged_prev
	// gets it under the event's revision (watchevent.PrevState). Nil otherwise.
	prev *kube.Object
}

// wireEvent wraps an event that needs nothing made per stream (bookmarks,
// initial state, tests).
func wireEvent(ev *heraldv1.Event) *event { return &event{Event: ev} }

// prepared is the event of a change as watchevent.FromChange made it, prev being
// the previous object its prev function returned.
func prepared(ev *heraldv1.Event, prev *kube.Object) *event {
	e := &event{Event: ev}
	if ev.PrevUnchanged {
		e.prev = prev
	}
	return e
}

// wire is ev as a stream with the request's omit_unchanged_prev (omitPrev)
// and with_protobuf (withProtobuf) gets it: the prepared event itself (a
// fanout hub's stream: both set), or a copy sharing its bytes, with the
// previous state made for this stream or without the protobuf bytes.
func wire(ev *event, omitPrev, withProtobuf bool) *heraldv1.Event {
	dropProtobuf := !withProtobuf && len(ev.ObjectProtobuf) > 0
	switch {
	case ev.prev != nil && !omitPrev:
		out := watchevent.PrevState(ev.Event, ev.prev)
		if dropProtobuf {
			out.ObjectProtobuf = nil
		}
		return out
	case dropProtobuf:
		return watchevent.WithoutProtobuf(ev.Event)
	}
	return ev.Event
}
