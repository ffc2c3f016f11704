// Package checker verifies Herald's history against etcd's: the stream must
// hold every etcd revision under the prefix exactly once, in order, with
// the same changes; and a client's watch must see every change once, in
// increasing resourceVersion. Tests of every hop reuse it.
package checker

import (
	"context"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	heraldv1 "herald.dev/libs/proto/herald/v1"
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
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var out []Change
	if from > to {
		return nil, nil
	}
	wch := cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithProgressNotify())
	cli.RequestProgress(ctx)
	// A response's header carries etcd's current revision, not the
	// revision its events reached: only the events themselves, or a progress
	// notification (sent once the watch has caught up), say how far it got.
	for resp := range wch {
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
		if resp.IsProgressNotify() {
			if resp.Header.Revision >= to {
				return out, nil
			}
			cli.RequestProgress(ctx)
		}
	}
	return out, ctx.Err()
}

// Record is one stream message with its sequence.
type Record struct {
	Seq uint64
	*heraldv1.Record
}

// ReadStream reads every message of the stream.
func ReadStream(ctx context.Context, js jetstream.JetStream, stream string) ([]Record, error) {
	s, err := js.Stream(ctx, stream)
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
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			return nil, fmt.Errorf("message %d: %w", seq, err)
		}
		var r heraldv1.Record
		if err := proto.Unmarshal(m.Data, &r); err != nil {
			return nil, fmt.Errorf("message %d: %w", seq, err)
		}
		out = append(out, Record{Seq: seq, Record: &r})
	}
	return out, nil
}

// StreamChanges flattens records into changes, checking the stream's own
// invariants: revisions never go backwards, a revision appears in one run of
// consecutive parts numbered 0..parts-1, no revision appears twice, progress
// markers never go back before an appended revision.
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
		case r.Revision == lastRev && r.Part != lastPart+1:
			errs = append(errs, fmt.Errorf("seq %d: revision %d part %d after part %d (duplicate)", r.Seq, r.Revision, r.Part, lastPart))
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
			out = append(out, Change{Rev: r.Revision, Key: c.Key, Delete: c.Kind == heraldv1.Change_DELETE, Value: string(c.Value)})
		}
	}
	return out, errs
}

// Compare reports every difference between etcd's history and the stream's
// changes over the same revisions: lost, duplicated, reordered or altered
// changes.
func Compare(etcd, stream []Change) []error {
	var errs []error
	i, j := 0, 0
	for i < len(etcd) || j < len(stream) {
		switch {
		case i == len(etcd):
			errs = append(errs, fmt.Errorf("extra in stream: %s", stream[j]))
			j++
		case j == len(stream):
			errs = append(errs, fmt.Errorf("lost: %s", etcd[i]))
			i++
		case etcd[i] == stream[j]:
			i++
			j++
		case stream[j].Rev < etcd[i].Rev || (stream[j].Rev == etcd[i].Rev && stream[j].Key < etcd[i].Key && !containsAt(etcd[i:], stream[j])):
			errs = append(errs, fmt.Errorf("extra in stream: %s", stream[j]))
			j++
		default:
			errs = append(errs, fmt.Errorf("lost or different: etcd has %s, stream has %s", etcd[i], stream[j]))
			i++
		}
		if len(errs) > 20 {
			errs = append(errs, fmt.Errorf("... more differences"))
			break
		}
	}
	return errs
}

func containsAt(cs []Change, c Change) bool {
	for _, x := range cs {
		if x.Rev != c.Rev {
			return false
		}
		if x == c {
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
// (exactly once each, in order) and returns the differences. Expected
// changes are given as events too.
func CheckWatch(want, got []WatchEvent) []error {
	var errs []error
	var last int64
	for i, e := range got {
		if e.RV < last {
			errs = append(errs, fmt.Errorf("event %d: resourceVersion %d after %d", i, e.RV, last))
		}
		last = e.RV
	}
	n := min(len(want), len(got))
	for i := range n {
		if want[i] != got[i] {
			errs = append(errs, fmt.Errorf("event %d: want %+v, got %+v", i, want[i], got[i]))
			if len(errs) > 20 {
				return errs
			}
		}
	}
	if len(got) > len(want) {
		errs = append(errs, fmt.Errorf("%d extra events, first %+v", len(got)-len(want), got[len(want)]))
	}
	if len(got) < len(want) {
		errs = append(errs, fmt.Errorf("%d events missing, first %+v", len(want)-len(got), want[len(got)]))
	}
	return errs
}

// KeyName turns a key under a resource's prefix ("/registry/pods/") into
// "namespace/name" (or "name" for cluster-scoped resources).
func KeyName(resourcePrefix, key string) string {
	return strings.TrimPrefix(key, resourcePrefix)
}
