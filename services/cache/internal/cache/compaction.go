package cache

import (
	"context"
	"strconv"
	"time"

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
// replica reads the one key itself every few seconds (compactionPoll; a
// read, not a watch, so that etcd still sees one watch from Herald). A
// compaction that writes no compact_rev_key (etcd's
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

// compactionPoll is how often a shard reads compact_rev_key. It is read,
// not watched: etcd must see one watch from Herald, ingest's (a watch per
// cache replica would be one more per replica). kube-apiserver's own
// cache learns a compaction up to 15 s late; a read every 5 s costs etcd
// one range request of one key.
const compactionPoll = 5 * time.Second

// followCompaction keeps s.compacted at etcd's compaction revision as
// kube-apiserver records it, until ctx ends: it reads compact_rev_key every
// compactionPoll. A failure is logged once until a read works again (an
// etcd user that may not read the key fails every time).
func (s *Shard) followCompaction(ctx context.Context) {
	t := time.NewTicker(compactionPoll)
	defer t.Stop()
	failing := false
	for {
		err := s.readCompaction(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && !failing:
			s.log.Warn("reading etcd's compaction revision failed; retrying", "key", compactRevKey, "err", err, "every", compactionPoll)
		case err == nil && failing:
			s.log.Info("reading etcd's compaction revision works again", "key", compactRevKey)
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// readCompaction reads compact_rev_key once.
func (s *Shard) readCompaction(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, compactionPoll)
	defer cancel()
	resp, err := s.etcd.Get(rctx, compactRevKey)
	if err != nil {
		return err
	}
	if len(resp.Kvs) > 0 {
		s.noteCompactRev(resp.Kvs[0].Value)
	}
	return nil
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
