package ingest

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/stream"
)

// Whose history the stream holds (libs/stream's generations).
//
// Every leadership term starts by comparing the stream's generation with
// the etcd ingest reads: another cluster ID, an etcd revision below the
// stream's last one, or a compaction right after the stream's last
// revision means the stream's history is not (or no longer connects to)
// etcd's. The leader then says so once in its log, records a new
// generation in the stream's metadata (etcd's cluster ID, the revision it
// starts at, the highest revision the discarded history reached) and purges
// the stream; the term goes on as for any emptied stream, with a resync
// marker at etcd's current revision, from which caches rebuild.
//
// The metadata is written before the purge: a leader that dies between the
// two leaves a stream whose records are older than its generation's first
// revision, which the next term's check purges (RuleInterrupted).

// generationGauge is herald_stream_generation as ingest reports it.
func generationGauge(reg prometheus.Registerer) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "herald_stream_generation",
		Help: "The stream's generation (the etcd history it holds; ingest: as its leader last checked or started it). It changes when etcd is replaced, restored from a snapshot, or compacted past the stream's end; caches then rebuild."})
	reg.MustRegister(g)
	return g
}

// streamConfig is the configuration ingest creates or updates the stream
// with, keeping the generation an existing stream records.
func (i *Ingest) streamConfig(ctx context.Context) jetstream.StreamConfig {
	cfg := i.cfg.StreamConfig()
	if st, err := i.js.Stream(ctx, i.cfg.Stream); err == nil {
		cfg.Metadata = stream.KeepGeneration(cfg.Metadata, st.CachedInfo().Config.Metadata)
	}
	return cfg
}

// checkGeneration starts a new generation when the stream's history is not
// etcd's, and records the first one on a stream that has none.
func (i *Ingest) checkGeneration(ctx context.Context) error {
	gen, recorded, last, err := stream.ReadGeneration(ctx, i.stream)
	if err != nil {
		i.m.failures.WithLabelValues("nats").Inc()
		return err
	}
	es, err := stream.ReadEtcdState(ctx, i.etcd, last)
	if err != nil {
		i.m.failures.WithLabelValues("etcd").Inc()
		return err
	}
	mm := stream.CheckGeneration(gen, recorded, last, es)
	switch {
	case mm != nil:
		next := stream.Generation{Number: gen.Number + 1, ClusterID: es.ClusterID, FirstRevision: es.Revision, Floor: max(gen.Floor, last)}
		i.log.Warn("the stream holds another etcd history; starting a new generation (the stream is purged, caches rebuild from etcd, older resourceVersions expire)",
			"rule", mm.Rule, "reason", mm.Reason,
			"streamClusterID", fmt.Sprintf("%x", gen.ClusterID), "etcdClusterID", fmt.Sprintf("%x", es.ClusterID),
			"streamFirstRevision", gen.FirstRevision, "streamLastRevision", last, "etcdRevision", es.Revision,
			"generation", next.Number, "expiredThrough", next.Floor)
		if err := i.recordGeneration(ctx, next); err != nil {
			return err
		}
		if err := i.stream.Purge(ctx); err != nil {
			i.m.failures.WithLabelValues("nats").Inc()
			return fmt.Errorf("purging the stream for generation %d: %w", next.Number, err)
		}
		gen = next
	case !recorded:
		first := es.Revision
		if last > 0 {
			// A stream written before generations were recorded: its
			// history is taken to be this etcd's from where it starts.
			if first, err = stream.HistoryStart(ctx, i.stream); err != nil {
				first = last
			}
		}
		gen = stream.Generation{Number: 1, ClusterID: es.ClusterID, FirstRevision: first}
		if err := i.recordGeneration(ctx, gen); err != nil {
			return err
		}
		i.log.Info("recorded the stream's generation", "generation", gen.Number, "etcdClusterID", fmt.Sprintf("%x", es.ClusterID), "firstRevision", first)
	}
	i.gen.Store(gen.Number)
	i.m.generation.Set(float64(gen.Number))
	return nil
}

// msgID is rec's message id in the stream's generation: JetStream's
// de-duplication remembers ids across a purge (stream.duplicates), and a
// new generation reuses revisions of the discarded history, so ids after
// the first generation name it (libs/stream's GenerationMsgID).
func (i *Ingest) msgID(rec *heraldv1.Record) string {
	return stream.GenerationMsgID(i.gen.Load(), rec)
}

// recordGeneration writes g into the stream's metadata.
func (i *Ingest) recordGeneration(ctx context.Context, g stream.Generation) error {
	cfg := i.cfg.StreamConfig()
	cfg.Metadata = g.SetMetadata(cfg.Metadata)
	st, err := i.js.UpdateStream(ctx, cfg)
	if err != nil {
		i.m.failures.WithLabelValues("nats").Inc()
		return fmt.Errorf("recording generation %d in the stream's metadata: %w", g.Number, err)
	}
	i.stream = st
	return nil
}
