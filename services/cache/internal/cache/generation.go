package cache

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/rv"
	"herald.dev/libs/stream"
)

// Whose history the stream holds (libs/stream's generations), as a shard
// sees it.
//
//   - Before every rebuild from an etcd snapshot (at start, after a resync
//     marker or a gap) the shard compares the stream's generation with its
//     etcd. When the stream holds another cluster's history, or one past
//     etcd's revision, the shard neither rebuilds its windows from it nor
//     applies it: it waits (not ready) until the ingest leader has started
//     a new generation (its own check, at every leadership term).
//   - A resync marker at or below the shard's head is normally one the
//     snapshot already covers; when the stream's generation changed, it
//     opens another history and the shard rebuilds.
//   - A stream deleted and created again (by an operator, or by NATS
//     restarted with memory storage or a wiped store) holds another history
//     whatever its generation says: ingest records the next generation in
//     it, but it may also be one created before ingest noticed, with none.
//     The shard tells it by its creation time (or a last sequence below the
//     one it reads next), checked whenever the consumer skips or repeats a
//     sequence or is created again, and every streamCheckInterval while it
//     waits (a consumer created again on the new stream waits for the
//     sequence it was at, which the new stream may take long to reach): it
//     then rebuilds, as for a gap.
//   - A watch from a resourceVersion up to the generation's floor (the
//     highest revision a discarded history reached) is expired (410): such
//     a revision may name a state of the other history, and the events
//     that follow it in this one would not apply to it.

var errOtherHistory = errors.New("the stream holds another etcd history; waiting for the ingest leader to start a new generation")

func generationGauge(reg prometheus.Registerer) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "herald_stream_generation",
		Help: "The stream's generation (the etcd history it holds) the shard last rebuilt from. It changes when etcd is replaced, restored from a snapshot, or compacted past the stream's end."})
	reg.MustRegister(g)
	return g
}

// checkGeneration compares the stream's generation with etcd before a
// rebuild; errOtherHistory means the stream is not (yet) etcd's.
func (s *Shard) checkGeneration(ctx context.Context, st stream.Reader) error {
	gen, recorded, last, err := stream.ReadGeneration(ctx, st)
	if err != nil {
		return err
	}
	es, err := stream.ReadEtcdState(ctx, s.etcd, last)
	if err != nil {
		return err
	}
	if mm := stream.CheckGeneration(gen, recorded, last, es); mm != nil && mm.Rule != stream.RuleCompacted {
		// A compaction past the stream's end costs only the warm start
		// (loadSnapshot falls back to etcd's current revision); the other
		// rules mean the stream's records are not etcd's history.
		return fmt.Errorf("%w (%s: %s)", errOtherHistory, mm.Rule, mm.Reason)
	}
	s.setGeneration(gen)
	return nil
}

func (s *Shard) setGeneration(gen stream.Generation) {
	if old := s.gen.Swap(gen.Number); old != gen.Number && old != 0 {
		s.log.Warn("the stream started a new generation", "generation", gen.Number, "etcdClusterID", fmt.Sprintf("%x", gen.ClusterID),
			"firstRevision", gen.FirstRevision, "expiredThrough", gen.Floor)
	}
	s.floor.Store(max(s.floor.Load(), gen.Floor))
	s.m.generation.Set(float64(gen.Number))
}

// generationChanged reports whether the stream's generation is no longer
// the one the shard rebuilt from.
func (s *Shard) generationChanged(ctx context.Context, st stream.Reader) bool {
	gen, recorded, _, err := stream.ReadGeneration(ctx, st)
	if err != nil {
		s.log.Warn("cannot read the stream's generation at a resync marker; rebuilding", "err", err)
		return true
	}
	return recorded && gen.Number != s.gen.Load()
}

// expiredByGeneration is the 410 of a watch from a resourceVersion up to
// the generation's floor, nil otherwise.
func (s *Shard) expiredByGeneration(req *heraldv1.WatchRequest) error {
	rev := req.AfterRevision
	if req.InitialEvents {
		rev = req.StateRevision
	}
	if floor := s.floor.Load(); rev > 0 && rev <= floor {
		return status.Error(codes.OutOfRange, fmt.Sprintf("too old resource version: %d (%d)", rev, floor+1))
	}
	return nil
}

// sendExpiredThrough tells the watch's client the generation's floor in a
// response header (libs/rv's ExpiredThroughHeader): a fanout replica
// refuses to join watches from resourceVersions up to it to its shared
// stream, and asks the cache, which expires them.
func (s *Shard) sendExpiredThrough(ctx context.Context) {
	if floor := s.floor.Load(); floor > 0 {
		_ = grpc.SetHeader(ctx, metadata.Pairs(rv.ExpiredThroughHeader, rv.FormatExpiredThrough(floor)))
	}
}

// streamCheckInterval is how often a following shard checks that its
// stream is still the one it rebuilt from.
const streamCheckInterval = time.Second

// recreated reports whether info is of another stream than the one created
// at created (zero: unknown) that the shard reads at sequence next.
func recreated(info *jetstream.StreamInfo, created time.Time, next uint64) bool {
	return !created.IsZero() && !info.Created.Equal(created) || info.State.LastSeq+1 < next
}

// watchIdentity checks every streamCheckInterval, until ctx ends, that st is
// still the stream created at created, holding the sequence before the one
// the shard reads next (reading); when it is gone or was created again, it
// calls lost and returns.
func (s *Shard) watchIdentity(ctx context.Context, st stream.Reader, created time.Time, reading *atomic.Uint64, lost func()) {
	t := time.NewTicker(streamCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// The sequence read so far, taken before the stream's info: the
		// consumer goes on reading while the info is asked for, and a
		// sequence read after it would look like a stream that went back
		// (a rebuild for nothing, every few seconds under load).
		next := reading.Load()
		info, err := st.Info(ctx)
		if errors.Is(err, jetstream.ErrStreamNotFound) || err == nil && recreated(info, created, next) {
			if ctx.Err() == nil {
				s.log.Warn("the stream was deleted or created again; rebuilding from etcd once it is back", "stream", s.cfg.Stream)
				lost()
			}
			return
		}
	}
}
