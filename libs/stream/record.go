package stream

import (
	"fmt"
	"strconv"

	"google.golang.org/protobuf/proto"

	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// MsgID is the JetStream message id of rec: "<revision>.<part>" for a
// revision's part, "p<revision>" for a progress marker, "r<revision>" for a
// resync marker. One id names one record, so JetStream's de-duplication
// refuses a second copy of it.
func MsgID(rec *heraldv1.Record) string {
	rev := strconv.FormatInt(rec.Revision, 10)
	switch {
	case rec.Resync:
		return "r" + rev
	case rec.Progress:
		return "p" + rev
	}
	return rev + "." + strconv.FormatUint(uint64(rec.Part), 10)
}

// Progress is the progress marker at rev: every change up to rev is in the
// stream.
func Progress(rev int64) *heraldv1.Record {
	return &heraldv1.Record{Revision: rev, Progress: true, Parts: 1}
}

// Resync is the resync marker at rev: the history before rev has a gap, and
// consumers rebuild from an etcd snapshot at or after rev.
func Resync(rev int64) *heraldv1.Record {
	return &heraldv1.Record{Revision: rev, Resync: true, Parts: 1}
}

// IsMarker reports whether rec is a progress or resync marker rather than a
// revision's changes.
func IsMarker(rec *heraldv1.Record) bool { return rec.Progress || rec.Resync }

// Frame cuts one revision's changes into records that each fit in a message
// of maxMessageBytes: parts 0..parts-1, in etcd's order, to be appended on
// consecutive sequences of one subject. A change too large for one message
// (etcd accepts values up to its request limit, 1.5 MiB by default, well
// over NATS's default max_payload of 1 MiB) is cut into fragments: the
// change itself with the first bytes of its value and previous value, then
// continuations (see IsContinuation) with the rest, each in a part of its
// own. An Assembler joins them again; nothing is ever dropped for its size.
func Frame(rev int64, changes []*heraldv1.Change, maxMessageBytes int, observedUnixNano int64) []*heraldv1.Record {
	var parts [][]*heraldv1.Change
	var cur []*heraldv1.Change
	size := 0
	for _, whole := range changes {
		for _, c := range fragments(whole, maxMessageBytes) {
			// 8: the field's tag and length; 256: the record's other fields.
			cs := proto.Size(c) + 8
			if len(cur) > 0 && size+cs > maxMessageBytes-256 {
				parts = append(parts, cur)
				cur, size = nil, 0
			}
			cur = append(cur, c)
			size += cs
		}
	}
	parts = append(parts, cur)
	recs := make([]*heraldv1.Record, len(parts))
	for n, part := range parts {
		recs[n] = &heraldv1.Record{Revision: rev, Changes: part, Part: uint32(n), Parts: uint32(len(parts)), ObservedUnixNano: observedUnixNano}
	}
	return recs
}

// fragmentOverhead is the room a fragment leaves in its message for the
// record's own fields and the message's headers (message id, expected
// stream and sequence, trace context), which count against the server's
// max_payload too.
const fragmentOverhead = 1024

// fragments cuts c into pieces whose values fit in a part of a message of
// maxMessageBytes: c itself when it fits, otherwise c's head (kind, key,
// create revision and the first bytes of value, then of prev value)
// followed by continuations carrying the rest, in order.
func fragments(c *heraldv1.Change, maxMessageBytes int) []*heraldv1.Change {
	// 64: the change's own tags, lengths and create revision.
	room := maxMessageBytes - fragmentOverhead - len(c.Key) - 64
	if room < 1 {
		room = 1 // a key nearly as large as a message: still progress
	}
	if len(c.Value)+len(c.PrevValue) <= room {
		return []*heraldv1.Change{c}
	}
	value, prev := c.Value, c.PrevValue
	out := []*heraldv1.Change{}
	for len(out) == 0 || len(value)+len(prev) > 0 {
		f := &heraldv1.Change{Kind: heraldv1.Change_KIND_UNSPECIFIED, Key: c.Key}
		if len(out) == 0 {
			f.Kind, f.CreateRevision = c.Kind, c.CreateRevision
		}
		n := min(room, len(value))
		f.Value, value = value[:n:n], value[n:]
		m := min(room-n, len(prev))
		f.PrevValue, prev = prev[:m:m], prev[m:]
		out = append(out, f)
	}
	return out
}

// IsContinuation reports whether c continues the change before it in its
// revision (a fragment Frame cut from a change too large for one message):
// its value and previous value are the next bytes of that change's. It has
// no kind of its own, so a reader that does not join fragments ignores it
// (and finds the head's value incomplete, which it skips as invalid).
func IsContinuation(c *heraldv1.Change) bool { return c.Kind == heraldv1.Change_KIND_UNSPECIFIED }

// Join puts fragmented changes back together: every continuation is
// appended to the change before it, which must be of the same key (etcd
// changes a key at most once per revision). A continuation that follows
// nothing of its key is malformed and dropped. Changes without
// continuations are returned as they are; joined ones are new values (the
// fragments are not modified).
func Join(changes []*heraldv1.Change) []*heraldv1.Change {
	joined := false
	for _, c := range changes {
		if IsContinuation(c) {
			joined = true
			break
		}
	}
	if !joined {
		return changes
	}
	out := make([]*heraldv1.Change, 0, len(changes))
	var head *heraldv1.Change // the change being joined, a copy
	for _, c := range changes {
		if !IsContinuation(c) {
			head = nil
			out = append(out, c)
			continue
		}
		last := len(out) - 1
		if last < 0 || out[last].Key != c.Key || IsContinuation(out[last]) {
			continue // follows nothing of its key
		}
		if head == nil {
			head = proto.Clone(out[last]).(*heraldv1.Change)
			out[last] = head
		}
		head.Value = append(head.Value, c.Value...)
		head.PrevValue = append(head.PrevValue, c.PrevValue...)
	}
	return out
}

// Next is the position that follows rec in the stream: the next part of
// its revision when rec is a part other than the last, otherwise part 0 of
// the next revision. A writer resuming after rec starts there.
func Next(rec *heraldv1.Record) (rev int64, part uint32) {
	if !IsMarker(rec) && rec.Part < rec.Parts && rec.Part+1 < rec.Parts {
		return rec.Revision, rec.Part + 1
	}
	return rec.Revision + 1, 0
}

// Encode is the data of rec's stream message.
func Encode(rec *heraldv1.Record) ([]byte, error) {
	b, err := proto.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("encoding a stream record: %w", err)
	}
	return b, nil
}

// Decode parses one stream message's data.
func Decode(data []byte) (*heraldv1.Record, error) {
	var rec heraldv1.Record
	if err := proto.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("not a stream record: %w", err)
	}
	return &rec, nil
}
