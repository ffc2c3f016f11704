// Package checker verifies Herald's history against etcd's: the stream must
// hold every etcd revision under the prefix exactly once, in order, with
// the same changes; and a client's watch must see every change once, in
// increasing resourceVersion. Tests of every hop reuse it.
package checker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	clientv3 "go.etcd.io/etcd/client/v3"

	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/stream"
)

// Change is one key change at one revision, as etcd or the stream says.
type Change struct {
	Rev    int64
	Key    string
	Delete bool
	Value  string
}

func (c Change) String() string {
	op := "PUT"
	if c.Delete {
		op = "DELETE"
	}
	return fmt.Sprintf("%d %s %s", c.Rev, op, c.Key)
}

// EtcdHistory reads every change under prefix with a revision in
// [from, to] from etcd's own history (a watch from a past revision).
func EtcdHistory(ctx context.Context, cli *clientv3.Client, prefix string, from, to int64) ([]Change, error) {
	if from > to {
		return nil, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithProgressNotify())
	// A response's header carries etcd's current revision, not the
	// revision its events reached: only the events themselves, or a progress
	// notification, say how far the watch got. etcd answers a progress
	// request only once the watch has caught up with its history: it drops
	// one that comes while the watch is still reading old revisions, and
	// says nothing when the watch catches up without an event at to (the
	// last change under prefix is older, or lies outside it). So the request
	// is repeated until an answer reaches to.
	ask := time.NewTicker(progressRetry)
	defer ask.Stop()
	cli.RequestProgress(ctx)
	var out []Change
	for {
		select {
		case <-ask.C:
			cli.RequestProgress(ctx)
		case resp, ok := <-wch:
			if !ok {
				return out, ctx.Err()
			}
			if err := resp.Err(); err != nil {
				return nil, err
			}
			for _, ev := range resp.Events {
				if ev.Kv.ModRevision > to {
					return out, nil
				}
				out = append(out, Change{Rev: ev.Kv.ModRevision, Key: string(ev.Kv.Key), Delete: ev.Type == clientv3.EventTypeDelete, Value: string(ev.Kv.Value)})
			}
			// etcd never splits a revision across responses.
			if n := len(resp.Events); n > 0 && resp.Events[n-1].Kv.ModRevision >= to {
				return out, nil
			}
			if resp.IsProgressNotify() && resp.Header.Revision >= to {
				return out, nil
			}
		}
	}
}

// progressRetry is how often EtcdHistory asks etcd again how far its watch
// got; etcd moves a watch that caught up to its synced set every 100ms.
const progressRetry = 100 * time.Millisecond

// Record is one stream message with its sequence.
type Record struct {
	Seq uint64
	*heraldv1.Record
}

// ReadStream reads every message of the stream.
func ReadStream(ctx context.Context, js jetstream.JetStream, name string) ([]Record, error) {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	var out []Record
	if info.State.Msgs == 0 {
		return nil, nil
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		r, err := stream.ReadAt(ctx, s, seq)
		if err != nil {
			return nil, err
		}
		out = append(out, Record{Seq: seq, Record: r})
	}
	return out, nil
}

// StreamChanges flattens records into changes, checking the stream's own
// invariants: revisions never go backwards, a revision appears in one run of
// consecutive parts numbered 0..parts-1, no revision appears twice, progress
// markers never go back before an appended revision. The last revision may
// end short of its parts without an error (the stream may be read while it
// is being written); Compare reports the changes it lacks.
func StreamChanges(recs []Record) ([]Change, []error) {
	var out []Change
	var errs []error
	var lastRev int64
	var lastPart, lastParts uint32
	seen := map[int64]bool{}
	for _, r := range recs {
		if r.Progress || r.Resync {
			if r.Revision < lastRev {
				errs = append(errs, fmt.Errorf("seq %d: progress or resync %d after revision %d", r.Seq, r.Revision, lastRev))
			}
			continue
		}
		switch {
		case r.Revision < lastRev:
			errs = append(errs, fmt.Errorf("seq %d: revision %d after %d (reordered)", r.Seq, r.Revision, lastRev))
		case r.Revision == lastRev && r.Part <= lastPart:
			errs = append(errs, fmt.Errorf("seq %d: revision %d part %d after part %d (duplicate)", r.Seq, r.Revision, r.Part, lastPart))
		case r.Revision == lastRev && r.Part != lastPart+1:
			errs = append(errs, fmt.Errorf("seq %d: revision %d part %d after part %d (a part lost)", r.Seq, r.Revision, r.Part, lastPart))
		case r.Revision > lastRev:
			if lastRev != 0 && lastPart+1 != lastParts {
				errs = append(errs, fmt.Errorf("seq %d: revision %d ended at part %d of %d", r.Seq, lastRev, lastPart, lastParts))
			}
			if seen[r.Revision] {
				errs = append(errs, fmt.Errorf("seq %d: revision %d appears twice", r.Seq, r.Revision))
			}
			if r.Part != 0 {
				errs = append(errs, fmt.Errorf("seq %d: revision %d starts at part %d", r.Seq, r.Revision, r.Part))
			}
		}
		seen[r.Revision] = true
		lastRev, lastPart, lastParts = r.Revision, r.Part, r.Parts
		for _, c := range r.Changes {
			if n := len(out) - 1; c.Kind == heraldv1.Change_KIND_UNSPECIFIED && n >= 0 && out[n].Rev == r.Revision && out[n].Key == c.Key {
				// A fragment of a change too large for one message
				// (libs/stream's Frame): the next bytes of its value.
				out[n].Value += string(c.Value)
				continue
			}
			out = append(out, Change{Rev: r.Revision, Key: c.Key, Delete: c.Kind == heraldv1.Change_DELETE, Value: string(c.Value)})
		}
	}
	return out, errs
}

// Compare reports every difference between etcd's history and the stream's
// changes over the same revisions: lost, duplicated, extra (a revision or
// key etcd does not have there) or different (the same revision and key,
// another operation or value) changes. A change out of place is reported
// where it is missing and again where it stands. It reports nothing if and
// only if the two are equal.
func Compare(etcd, stream []Change) []error {
	var errs []error
	for _, d := range align(etcd, stream) {
		switch d.kind {
		case lost:
			errs = append(errs, fmt.Errorf("lost: %s", etcd[d.want]))
		case duplicate:
			errs = append(errs, fmt.Errorf("duplicate in stream: %s", stream[d.got]))
		case extra:
			errs = append(errs, fmt.Errorf("extra in stream: %s", stream[d.got]))
		case different:
			e, s := etcd[d.want], stream[d.got]
			errs = append(errs, fmt.Errorf("different: etcd has %s %.80q, stream has %s %.80q", e, e.Value, s, s.Value))
		case more:
			errs = append(errs, errMore)
		}
	}
	return errs
}

// errMore ends a report that stops at maxDifferences.
var errMore = errors.New("... more differences")

// maxDifferences bounds a report: past the first few, differences usually
// follow from the same fault.
const maxDifferences = 20

type differenceKind int

const (
	lost      differenceKind = iota // want[want] never came
	duplicate                       // got[got] came again
	extra                           // got[got] is not in want
	different                       // got[got] has want[want]'s revision and key but differs
	more                            // the report stops here
)

// difference is one place where what was seen departs from what must be.
type difference struct {
	kind      differenceKind
	want, got int
}

// entry is one element of a history: a change or a watch event, placed by
// its revision and key.
type entry interface {
	comparable
	at() (rev int64, key string)
}

func (c Change) at() (int64, string)     { return c.Rev, c.Key }
func (e WatchEvent) at() (int64, string) { return e.RV, e.Key }

// align walks two histories in revision order, want (what must be seen)
// and got (what was), and lists where they differ, in order, stopping after
// maxDifferences. Within one revision (a transaction) etcd's order is the
// transaction's, not the keys', so an entry of that revision that is
// further on in want means that want's entries before it were lost; one
// that is nowhere in that revision is extra. Equal histories have no
// differences.
func align[T entry](want, got []T) []difference {
	var out []difference
	seen := map[T]bool{}
	i, j := 0, 0
	unwanted := func() {
		k := extra
		if seen[got[j]] {
			k = duplicate
		}
		out = append(out, difference{kind: k, want: i, got: j})
		j++
	}
	for i < len(want) || j < len(got) {
		if len(out) == maxDifferences {
			return append(out, difference{kind: more, want: i, got: j})
		}
		if i == len(want) {
			unwanted()
			continue
		}
		if j == len(got) {
			out = append(out, difference{kind: lost, want: i, got: j})
			i++
			continue
		}
		if want[i] == got[j] {
			seen[got[j]] = true
			i++
			j++
			continue
		}
		wr, wk := want[i].at()
		gr, gk := got[j].at()
		switch {
		case gr == wr && gk == wk && !seen[got[j]]:
			out = append(out, difference{kind: different, want: i, got: j})
			i++
			j++
		case gr < wr || (gr == wr && !inRevision(want[i:], got[j])):
			unwanted()
		default:
			out = append(out, difference{kind: lost, want: i, got: j})
			i++
		}
	}
	return out
}

// inRevision says whether x is among the entries at the head of es that
// share its revision.
func inRevision[T entry](es []T, x T) bool {
	rev, _ := x.at()
	for _, e := range es {
		if r, _ := e.at(); r != rev {
			return false
		}
		if e == x {
			return true
		}
	}
	return false
}

// Resyncs lists the revisions of the stream's resync markers.
func Resyncs(recs []Record) []int64 {
	var out []int64
	for _, r := range recs {
		if r.Resync {
			out = append(out, r.Revision)
		}
	}
	return out
}

// ExpectedEvents turns etcd's history of one resource's keys (under
// resourcePrefix) into the watch events a client watching all of it must
// see, given which keys existed before the history starts.
func ExpectedEvents(resourcePrefix string, history []Change, existed map[string]bool) []WatchEvent {
	live := map[string]bool{}
	for k, v := range existed {
		live[k] = v
	}
	var out []WatchEvent
	for _, c := range history {
		if !strings.HasPrefix(c.Key, resourcePrefix) {
			continue
		}
		typ := "ADDED"
		switch {
		case c.Delete:
			typ = "DELETED"
			delete(live, c.Key)
		case live[c.Key]:
			typ = "MODIFIED"
		default:
			live[c.Key] = true
		}
		out = append(out, WatchEvent{Type: typ, Key: KeyName(resourcePrefix, c.Key), RV: c.Rev})
	}
	return out
}

// WatchEvent is what a client saw on a watch.
type WatchEvent struct {
	Type string
	Key  string // namespace/name
	RV   int64
}

// CheckWatch verifies a client's events against the expected changes
// (exactly once each, in order) and returns the differences: an event whose
// resourceVersion goes back, and every lost, duplicated, unexpected or
// different event (see Compare). Expected changes are given as events too.
// It returns nothing if and only if got equals want and never goes back.
func CheckWatch(want, got []WatchEvent) []error {
	var errs []error
	var last int64
	for i, e := range got {
		if e.RV < last {
			errs = append(errs, fmt.Errorf("event %d: resourceVersion %d after %d", i, e.RV, last))
		}
		last = e.RV
	}
	for _, d := range align(want, got) {
		switch d.kind {
		case lost:
			errs = append(errs, fmt.Errorf("lost: %+v", want[d.want]))
		case duplicate:
			errs = append(errs, fmt.Errorf("event %d: duplicate %+v", d.got, got[d.got]))
		case extra:
			errs = append(errs, fmt.Errorf("event %d: unexpected %+v", d.got, got[d.got]))
		case different:
			errs = append(errs, fmt.Errorf("event %d: want %+v, got %+v", d.got, want[d.want], got[d.got]))
		case more:
			errs = append(errs, errMore)
		}
	}
	return errs
}

// KeyName turns a key under a resource's prefix ("/registry/pods/") into
// "namespace/name" (or "name" for cluster-scoped resources).
func KeyName(resourcePrefix, key string) string {
	return strings.TrimPrefix(key, resourcePrefix)
}
