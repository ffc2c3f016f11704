package cache

import (
	"context"
	"errors"
	"strconv"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"herald.dev/libs/kube"
	"herald.dev/libs/rv"
)

// etcd's compaction revision, and the lists it expires.
//
// kube-apiserver answers a continue token, or a list at an exact revision,
// that etcd has compacted with 410 Expired (a continued list with a token
// that goes on after the same key at the latest state: kube.CompactedError),
// however much of that history its watch cache still holds: its cache
// drops the snapshots older than the compaction revision its compactor
// records. The shard does the same, so that a client sees the same
// answer whichever server it asks, and a paged list never stays
// consistent longer than etcd's history.
//
// The revision comes from where kube-apiserver's own cache learns it: the
// key compact_rev_key at the root of etcd's keyspace, which every
// kube-apiserver's compactor writes (the revision it compacts, in a
// transaction just before compacting) and every kube-apiserver follows
// (k8s.io/apiserver's etcd3 compactor). Ingest's watch of the registry
// prefix does not see it, and the stream does not need to carry it: it
// orders nothing (a revision only becomes unreadable), and each shard
// replica follows the one key itself, a watch that sees one change per
// compaction interval (5 minutes by default). A watch started at a
// revision etcd has compacted also reports etcd's compaction revision;
// that is taken too. A compaction that writes no compact_rev_key (etcd's
// own --auto-compaction, an operator's etcdctl compact) is not seen:
// tokens then expire when the window moves past them, and the frontdoor
// forwards them to kube-apiserver, which reads etcd.
//
// Invariants:
//   - compacted only grows, and is at most a revision etcd has compacted:
//     a list the shard expires, etcd could not serve.
//   - A continue token or exact list at a revision below compacted is
//     never served from the window.

// compactRevKey is the key kube-apiserver's compactor writes the revision
// it compacts at (k8s.io/apiserver/pkg/storage/etcd3, compactRevKey).
const compactRevKey = "compact_rev_key"

// followCompaction keeps s.compacted at etcd's compaction revision as
// kube-apiserver records it, until ctx ends. A failure is retried after a
// second, as kube-apiserver's compactor retries its watch, and after up to
// 30s while it keeps failing (an etcd user that may not read the key).
func (s *Shard) followCompaction(ctx context.Context) {
	backoff := time.Second
	for {
		start := time.Now()
		err := s.watchCompaction(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > time.Minute {
			backoff = time.Second // it had worked for a while
		}
		s.log.Warn("following etcd's compaction revision failed; retrying", "key", compactRevKey, "err", err, "backoff", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// watchCompaction reads compact_rev_key and follows its changes until the
// watch fails.
func (s *Shard) watchCompaction(ctx context.Context) error {
	resp, err := s.etcd.Get(ctx, compactRevKey)
	if err != nil {
		return err
	}
	if len(resp.Kvs) > 0 {
		s.noteCompactRev(resp.Kvs[0].Value)
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for wr := range s.etcd.Watch(wctx, compactRevKey, clientv3.WithRev(resp.Header.Revision+1)) {
		if wr.CompactRevision > 0 {
			// etcd compacted past where the watch started: the watch
			// ends, saying up to where.
			s.noteCompacted(wr.CompactRevision)
		}
		if err := wr.Err(); err != nil {
			return err
		}
		for _, ev := range wr.Events {
			if ev.Type == mvccpb.PUT {
				s.noteCompactRev(ev.Kv.Value)
			}
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return errors.New("the watch ended")
}

// noteCompactRev takes compact_rev_key's value.
func (s *Shard) noteCompactRev(v []byte) {
	rev, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil || rev < 0 {
		s.log.Warn("unreadable compaction revision; ignored", "key", compactRevKey, "value", string(v))
		return
	}
	s.noteCompacted(rev)
}

// noteCompacted raises s.compacted to rev.
func (s *Shard) noteCompacted(rev int64) {
	for {
		cur := s.compacted.Load()
		if rev <= cur {
			return
		}
		if s.compacted.CompareAndSwap(cur, rev) {
			s.log.Debug("etcd compacted", "revision", rev)
			return
		}
	}
}

// expiredByCompaction is the answer to a list plan whose revision etcd has
// compacted (kube.CompactedError), nil for any other: a continued list
// gets the token of an inconsistent list after the same key, a list at an
// exact revision 410. Revisions at or above the compaction revision are
// still readable in etcd.
func (s *Shard) expiredByCompaction(plan rv.ListPlan, prefix string) error {
	compacted := s.compacted.Load()
	switch {
	case plan.Mode == rv.ListContinue && plan.Token.Rev > 0 && plan.Token.Rev < compacted:
		return kube.CompactedError(plan.Token.Inconsistent().Encode(prefix))
	case plan.Mode == rv.ListExact && plan.Rev < compacted:
		return kube.CompactedError("")
	}
	return nil
}
