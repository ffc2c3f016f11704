package stream

import heraldv1 "herald.dev/libs/proto/herald/v1"

// Assembler reassembles split revisions from records read in stream order
// and hands out every revision once, complete or not at all: a split
// revision's parts must arrive as 0..parts-1 in order, all of the same
// revision. A part that does not continue the revision being assembled (a
// gap, a part of another revision, a part without its part 0) drops that
// revision; a duplicate part, or any record of a revision already handed
// out, is ignored. A change Frame cut into fragments comes out joined (see
// Join), whole as etcd wrote it. The zero value is ready to use; an
// Assembler is not safe for concurrent use (one reader owns it).
type Assembler struct {
	done    int64 // the last revision handed out; 0: none yet
	rev     int64 // the revision in progress
	next    uint32
	changes []*heraldv1.Change
}

// Add takes the next record read from the stream and returns the changes of
// its revision once the revision is complete (ok true). Markers are not
// revisions: Add ignores them, and they do not interrupt a revision in
// progress.
func (a *Assembler) Add(rec *heraldv1.Record) (changes []*heraldv1.Change, ok bool) {
	switch {
	case IsMarker(rec):
		return nil, false
	case a.done != 0 && rec.Revision <= a.done:
		return nil, false // handed out already
	case a.next > 0 && rec.Revision == a.rev && rec.Part < a.next:
		return nil, false // a duplicate of a part already taken
	case rec.Parts <= 1:
		a.drop() // a whole revision: whatever was in progress is incomplete
		return a.complete(rec.Revision, rec.Changes)
	case rec.Part >= rec.Parts:
		a.drop() // malformed: no such part
		return nil, false
	case rec.Part == 0:
		a.drop()
		a.rev = rec.Revision
	case a.next == 0 || rec.Revision != a.rev || rec.Part != a.next:
		a.drop() // a gap or another revision's part: neither is complete
		return nil, false
	}
	a.changes = append(a.changes, rec.Changes...)
	a.next = rec.Part + 1
	if a.next < rec.Parts {
		return nil, false
	}
	changes = a.changes
	a.drop()
	return a.complete(rec.Revision, changes)
}

func (a *Assembler) complete(rev int64, changes []*heraldv1.Change) ([]*heraldv1.Change, bool) {
	a.done = rev
	return Join(changes), true
}

// drop forgets the revision in progress.
func (a *Assembler) drop() { a.rev, a.next, a.changes = 0, 0, nil }

// Reset forgets everything: the reader starts again elsewhere in the stream
// (after loading a snapshot, say), where revisions it handed out may come
// again.
func (a *Assembler) Reset() { *a = Assembler{} }
