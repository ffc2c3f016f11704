package stream

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// A generation is one etcd history in the stream. The stream's metadata
// (written by ingest when it creates the stream or starts a new generation)
// says whose history it holds: etcd's cluster ID, the revision the
// generation starts at, and the highest revision an earlier generation
// reached. The stream's own records give the rest of the range it covers
// (its last record's revision).
//
// When etcd no longer matches (another cluster, a restore from an older
// snapshot, a compaction past the stream's end), the stream's history is
// not etcd's: ingest purges it and starts a new generation with a resync
// marker; caches rebuild from an etcd snapshot and answer every
// resourceVersion up to Floor as expired, since such a revision may name a
// state of the discarded history.
const (
	metaGeneration    = "herald.generation"
	metaClusterID     = "herald.etcd.cluster-id"
	metaFirstRevision = "herald.etcd.first-revision"
	metaFloor         = "herald.etcd.floor"
)

// Generation is the stream's record of whose history it holds.
type Generation struct {
	// Number counts the generations of the stream, from 1.
	Number int64
	// ClusterID is the etcd cluster the history belongs to.
	ClusterID uint64
	// FirstRevision is the etcd revision the generation started at: the
	// stream holds no record of this generation before it.
	FirstRevision int64
	// Floor is the highest revision an earlier generation reached (0:
	// none): a resourceVersion up to it may be of another history.
	Floor int64
}

// GenerationOf reads the generation from a stream's metadata; ok is false
// when the stream records none (created before generations were recorded,
// or not by ingest).
func GenerationOf(meta map[string]string) (g Generation, ok bool) {
	n, err1 := strconv.ParseInt(meta[metaGeneration], 10, 64)
	id, err2 := strconv.ParseUint(meta[metaClusterID], 16, 64)
	first, err3 := strconv.ParseInt(meta[metaFirstRevision], 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil || n < 1 {
		return Generation{}, false
	}
	floor, _ := strconv.ParseInt(meta[metaFloor], 10, 64)
	return Generation{Number: n, ClusterID: id, FirstRevision: first, Floor: max(floor, 0)}, true
}

// SetMetadata writes g into meta (a stream configuration's metadata; nil
// makes a new map) and returns it.
func (g Generation) SetMetadata(meta map[string]string) map[string]string {
	if meta == nil {
		meta = map[string]string{}
	}
	meta[metaGeneration] = strconv.FormatInt(g.Number, 10)
	meta[metaClusterID] = strconv.FormatUint(g.ClusterID, 16)
	meta[metaFirstRevision] = strconv.FormatInt(g.FirstRevision, 10)
	meta[metaFloor] = strconv.FormatInt(g.Floor, 10)
	return meta
}

// KeepGeneration copies the generation keys of from into to (nil makes a
// new map) and returns to: a stream configuration being updated keeps the
// generation its stream records.
func KeepGeneration(to, from map[string]string) map[string]string {
	for _, k := range []string{metaGeneration, metaClusterID, metaFirstRevision, metaFloor} {
		if v, ok := from[k]; ok {
			if to == nil {
				to = map[string]string{}
			}
			to[k] = v
		}
	}
	return to
}

// EtcdState is what the generation check needs to know of etcd.
type EtcdState struct {
	ClusterID uint64
	Revision  int64
	// Compacted: etcd has compacted the revision after the stream's last
	// one, so the history that follows the stream cannot be read.
	Compacted bool
	// CompactRevision is etcd's compaction when Compacted.
	CompactRevision int64
}

// ReadEtcdState reads etcd's cluster ID and current revision (a
// linearizable read) and whether the revision after streamLast (0: none)
// is compacted.
func ReadEtcdState(ctx context.Context, kv clientv3.KV, streamLast int64) (EtcdState, error) {
	resp, err := kv.Get(ctx, RevProbeKey)
	if err != nil {
		return EtcdState{}, fmt.Errorf("reading etcd's revision: %w", err)
	}
	st := EtcdState{ClusterID: resp.Header.ClusterId, Revision: resp.Header.Revision}
	if streamLast <= 0 || streamLast+1 > st.Revision {
		return st, nil
	}
	_, err = kv.Get(ctx, RevProbeKey, clientv3.WithRev(streamLast+1))
	switch {
	case errors.Is(err, rpctypes.ErrCompacted):
		st.Compacted = true
		// The error does not say where etcd compacted: its current
		// revision is an upper bound, which is what the log needs.
		st.CompactRevision = st.Revision
	case err != nil:
		return EtcdState{}, fmt.Errorf("reading etcd at revision %d: %w", streamLast+1, err)
	}
	return st, nil
}

// GenerationMsgID is rec's message id in generation gen: MsgID's in the
// first generation (and on a stream that records none, gen 0), prefixed
// with "g<gen>." after it. JetStream's de-duplication window outlives a
// purge, and a new generation may reuse the revisions of the one it
// replaced: without the prefix, its first records would be refused as
// duplicates of the discarded ones.
func GenerationMsgID(gen int64, rec *heraldv1.Record) string {
	if gen <= 1 {
		return MsgID(rec)
	}
	return "g" + strconv.FormatInt(gen, 10) + "." + MsgID(rec)
}

// Rule names why the stream's history is not etcd's.
type Rule string

const (
	// RuleClusterID: the stream holds another etcd cluster's history.
	RuleClusterID Rule = "cluster-id"
	// RuleRevisionRegression: etcd's revision is below the stream's last
	// one (restored from an older snapshot, or another etcd).
	RuleRevisionRegression Rule = "revision-regression"
	// RuleCompacted: etcd compacted the history right after the stream's
	// last revision (restored with --mark-compacted, or ingest was away
	// longer than etcd keeps history): nothing connects the stream to
	// what etcd holds now.
	RuleCompacted Rule = "compacted"
	// RuleInterrupted: the stream holds records from before its
	// generation's first revision (a new generation was recorded but the
	// purge that follows did not happen).
	RuleInterrupted Rule = "interrupted-reset"
)

// Mismatch is why a stream's history is not etcd's.
type Mismatch struct {
	Rule   Rule
	Reason string
}

// CheckGeneration compares the stream's generation (recorded: whether the
// stream records one) and last revision (0: the stream holds no record)
// with etcd; nil means the stream's history is etcd's.
func CheckGeneration(g Generation, recorded bool, streamLast int64, e EtcdState) *Mismatch {
	switch {
	case recorded && g.ClusterID != e.ClusterID:
		return &Mismatch{RuleClusterID, fmt.Sprintf("the stream holds etcd cluster %x's history, etcd is cluster %x", g.ClusterID, e.ClusterID)}
	case streamLast > e.Revision:
		return &Mismatch{RuleRevisionRegression, fmt.Sprintf("etcd's revision %d is below the stream's last revision %d", e.Revision, streamLast)}
	case streamLast > 0 && e.Compacted:
		return &Mismatch{RuleCompacted, fmt.Sprintf("etcd compacted the revisions after the stream's last revision %d (etcd is at %d)", streamLast, e.Revision)}
	case recorded && streamLast > 0 && streamLast < g.FirstRevision:
		return &Mismatch{RuleInterrupted, fmt.Sprintf("the stream's last revision %d is before its generation's first revision %d", streamLast, g.FirstRevision)}
	}
	return nil
}

// ReadGeneration reads the generation a stream records and its last
// record's revision (0 when it holds none).
func ReadGeneration(ctx context.Context, s Reader) (g Generation, recorded bool, lastRev int64, err error) {
	info, err := s.Info(ctx)
	if err != nil {
		return Generation{}, false, 0, fmt.Errorf("stream info: %w", err)
	}
	g, recorded = GenerationOf(info.Config.Metadata)
	if info.State.Msgs == 0 {
		return g, recorded, 0, nil
	}
	rec, err := ReadAt(ctx, s, info.State.LastSeq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return g, recorded, 0, nil // purged meanwhile
	}
	if err != nil {
		return Generation{}, false, 0, err
	}
	return g, recorded, rec.Revision, nil
}
