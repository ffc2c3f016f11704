package cache

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// deepReplay sends the events of rs (in namespace, or all) with revisions in
// (after, upTo], read from the stream's retained history: a resume slightly
// older than the memory window is served instead of answered 410, as long as
// the stream still holds that history. The previous state of a modified
// object, needed for selector transitions, comes from an earlier record of
// the same replay or from etcd's history at the revision before.
func (s *Shard) deepReplay(ctx context.Context, rs *resourceState, namespace string, after, upTo int64, send func(*heraldv1.Event) error) error {
	tooOld := func() error {
		return status.Error(codes.OutOfRange, fmt.Sprintf("too old resource version: %d (%d)", after, upTo+1))
	}
	stream, err := s.js.Stream(ctx, s.cfg.Stream)
	if err != nil {
		return status.Errorf(codes.Unavailable, "stream: %v", err)
	}
	info, err := stream.Info(ctx)
	if err != nil || info.State.Msgs == 0 {
		return tooOld()
	}
	first, err := stream.GetMsg(ctx, info.State.FirstSeq)
	if err != nil {
		return tooOld()
	}
	var rec heraldv1.Record
	if proto.Unmarshal(first.Data, &rec) != nil {
		return tooOld()
	}
	// The stream is complete after completeAfter: a progress marker says
	// everything up to it was appended; a revision's first part says the
	// revisions before it had nothing to append (or aged out before it).
	completeAfter := rec.Revision
	if !rec.Progress && !rec.Resync && rec.Part == 0 {
		completeAfter = rec.Revision - 1
	}
	if after < completeAfter {
		return tooOld()
	}
	seq, err := startSequence(ctx, stream, after)
	if err != nil {
		return status.Errorf(codes.Unavailable, "stream: %v", err)
	}
	subjects := []string{kube.SubjectMulti, kube.SubjectProgress, rs.res.SubjectFilter()}
	if namespace != "" {
		subjects[2] = rs.res.Subject(namespace)
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: subjects, DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: seq,
	})
	if err != nil {
		return status.Errorf(codes.Unavailable, "stream consumer: %v", err)
	}
	it, err := cons.Messages()
	if err != nil {
		return status.Errorf(codes.Unavailable, "stream consumer: %v", err)
	}
	defer it.Stop()
	seen := map[string]*kube.Object{}
	var changes []*heraldv1.Change
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return status.Errorf(codes.Unavailable, "reading the stream: %v", err)
		}
		var rec heraldv1.Record
		if err := proto.Unmarshal(msg.Data(), &rec); err != nil {
			continue
		}
		if rec.Revision > upTo {
			return nil
		}
		if rec.Resync {
			return tooOld() // the history has a gap
		}
		if rec.Progress {
			if rec.Revision >= upTo {
				return nil
			}
			continue
		}
		changes = append(changes, rec.Changes...)
		if rec.Part+1 < rec.Parts {
			continue
		}
		for _, c := range changes {
			ev, err := s.historicEvent(ctx, rs, namespace, rec.Revision, c, seen)
			if err != nil {
				return err
			}
			if ev != nil {
				if err := send(ev); err != nil {
					return err
				}
			}
		}
		changes = nil
		if rec.Revision == upTo {
			return nil
		}
	}
}

// historicEvent rebuilds the event of one change read from the stream.
func (s *Shard) historicEvent(ctx context.Context, rs *resourceState, namespace string, rev int64, c *heraldv1.Change, seen map[string]*kube.Object) (*heraldv1.Event, error) {
	r, ns, name, ok := s.reg.ParseKey(c.Key)
	if !ok || r != rs.res || (namespace != "" && ns != namespace) {
		return nil, nil
	}
	if _, owned := s.owns(r, ns); !owned {
		return nil, nil
	}
	ev := &heraldv1.Event{Revision: rev, Namespace: ns, Name: name}
	switch c.Kind {
	case heraldv1.Change_PUT:
		obj, err := kube.Prepare(r, ns, name, c.Value, rev)
		if err != nil {
			return nil, nil // skipped when it was applied, too
		}
		ev.Type, ev.Object, ev.Labels, ev.Fields = heraldv1.EventType_ADDED, obj.JSON, obj.Labels, obj.Fields
		if c.CreateRevision != rev {
			prev, err := s.previous(ctx, r, ns, name, c.Key, rev, seen)
			if err != nil {
				return nil, err
			}
			if prev != nil {
				ev.Type = heraldv1.EventType_MODIFIED
				ev.PrevObject, ev.PrevLabels, ev.PrevFields = prev.WithRev(rev), prev.Labels, prev.Fields
			}
		}
		seen[c.Key] = obj
	case heraldv1.Change_DELETE:
		prev := seen[c.Key]
		if prev == nil && len(c.PrevValue) > 0 {
			prev, _ = kube.Prepare(r, ns, name, c.PrevValue, rev)
		}
		delete(seen, c.Key)
		if prev == nil {
			return nil, nil
		}
		ev.Type, ev.Object, ev.Labels, ev.Fields = heraldv1.EventType_DELETED, prev.WithRev(rev), prev.Labels, prev.Fields
	default:
		return nil, nil
	}
	return ev, nil
}

// previous returns the object's state just before rev.
func (s *Shard) previous(ctx context.Context, r *kube.Resource, ns, name, key string, rev int64, seen map[string]*kube.Object) (*kube.Object, error) {
	if o, ok := seen[key]; ok {
		return o, nil
	}
	resp, err := s.etcd.Get(ctx, key, clientv3.WithRev(rev-1))
	if errors.Is(err, rpctypes.ErrCompacted) {
		return nil, status.Error(codes.OutOfRange, fmt.Sprintf("too old resource version: %d (etcd compacted the history needed to replay it)", rev-1))
	}
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "etcd: %v", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	o, err := kube.Prepare(r, ns, name, resp.Kvs[0].Value, resp.Kvs[0].ModRevision)
	if err != nil {
		return nil, nil
	}
	return o, nil
}
