package ingest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

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
// A stream found gone (deleted, or NATS restarted with memory storage or
// a wiped store) lost its history too: the leader says so once, is not
// ready, and creates it again with the next generation, whose floor is the
// last revision the replica saw in it (at least the revision before the
// new generation's first: the changes nobody appended meanwhile are in no
// stream). A stream created again by someone else (a replica starting
// meanwhile), holding nothing and no generation, is taken for lost the same
// way when the leader knows a generation.
//
// The new stream has no metadata left to count from, and the replica that
// finds it may never have seen the old one (it started, or won the
// election, after the loss): the leader also keeps the generation's number
// in etcd, beside its election (generationKey), and the next generation is
// one past the higher of that and what the replica saw.
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
		if gen, ok := stream.GenerationOf(cfg.Metadata); ok && gen.Number > i.known.Number {
			i.known = gen
		}
	}
	return cfg
}

var errStreamLost = errors.New("the stream is gone")

// streamLost is errStreamLost when err, from a stream operation, is because
// the stream no longer exists (the leader then counts and logs the loss,
// once, and is not ready until the next term creates it again); nil
// otherwise.
func (i *Ingest) streamLost(ctx context.Context, err error) error {
	if !errors.Is(err, jetstream.ErrStreamNotFound) && !errors.Is(err, jetstream.ErrNoStreamResponse) {
		return nil
	}
	// No responder is also what a JetStream still starting answers: only
	// the stream's own absence counts.
	if _, serr := i.js.Stream(ctx, i.cfg.Stream); !errors.Is(serr, jetstream.ErrStreamNotFound) {
		return nil
	}
	i.markLost()
	return fmt.Errorf("%w: %v", errStreamLost, err)
}

// markLost: the stream is gone.
func (i *Ingest) markLost() {
	i.ready.Store(false)
	if i.lost.Swap(true) {
		return
	}
	i.m.failures.WithLabelValues("stream_lost").Inc()
	i.log.Warn("the stream is gone (deleted, or NATS lost its store); the leader creates it again as a new generation and caches rebuild from etcd",
		"stream", i.cfg.Stream, "generation", i.known.Number, "lastRevision", i.knownLast)
}

// checkGeneration starts a new generation when the stream's history is not
// etcd's, and records the first one on a stream that has none. recreated:
// the stream was gone (or created again by someone else) and holds a new
// generation, which starts with a resync marker.
func (i *Ingest) checkGeneration(ctx context.Context) (recreated bool, err error) {
	stored, err := i.storedGeneration(ctx)
	if err != nil {
		return false, err
	}
	i.known.Number = max(i.known.Number, stored)
	gen, recorded, last, err := stream.ReadGeneration(ctx, i.stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		i.markLost()
		return true, i.recreate(ctx)
	}
	if err != nil {
		i.m.failures.WithLabelValues("nats").Inc()
		return false, err
	}
	es, err := stream.ReadEtcdState(ctx, i.etcd, last)
	if err != nil {
		i.m.failures.WithLabelValues("etcd").Inc()
		return false, err
	}
	mm := stream.CheckGeneration(gen, recorded, last, es)
	switch {
	case !recorded && last == 0 && i.known.Number > 0:
		// Created again (by a replica starting while it was gone), and
		// nothing appended yet.
		i.markLost()
		return true, i.recreate(ctx)
	case mm != nil:
		next := stream.Generation{Number: gen.Number + 1, ClusterID: es.ClusterID, FirstRevision: es.Revision, Floor: max(gen.Floor, last)}
		i.log.Warn("the stream holds another etcd history; starting a new generation (the stream is purged, caches rebuild from etcd, older resourceVersions expire)",
			"rule", mm.Rule, "reason", mm.Reason,
			"streamClusterID", fmt.Sprintf("%x", gen.ClusterID), "etcdClusterID", fmt.Sprintf("%x", es.ClusterID),
			"streamFirstRevision", gen.FirstRevision, "streamLastRevision", last, "etcdRevision", es.Revision,
			"generation", next.Number, "expiredThrough", next.Floor)
		if err := i.recordGeneration(ctx, next); err != nil {
			return false, err
		}
		if err := i.stream.Purge(ctx); err != nil {
			i.m.failures.WithLabelValues("nats").Inc()
			return false, fmt.Errorf("purging the stream for generation %d: %w", next.Number, err)
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
			return false, err
		}
		i.log.Info("recorded the stream's generation", "generation", gen.Number, "etcdClusterID", fmt.Sprintf("%x", es.ClusterID), "firstRevision", first)
	}
	if gen.Number > stored {
		if err := i.storeGeneration(ctx, gen.Number); err != nil {
			return false, err
		}
	}
	i.setGeneration(gen, last)
	return false, nil
}

// setGeneration: the stream holds generation gen, up to revision last.
func (i *Ingest) setGeneration(gen stream.Generation, last int64) {
	if last > 0 || gen.Number != i.known.Number {
		i.knownLast = last
	}
	i.known = gen
	i.gen.Store(gen.Number)
	i.m.generation.Set(float64(gen.Number))
}

// recreate creates the lost stream again (or records a generation in one
// created again without it) with the next generation: one more than the
// replica last saw, and a floor at the last revision it saw in the stream,
// or the revision before etcd's current one, whichever is higher.
func (i *Ingest) recreate(ctx context.Context) error {
	number := max(i.known.Number, 1) + 1
	if err := i.storeGeneration(ctx, number); err != nil {
		return err
	}
	es, err := stream.ReadEtcdState(ctx, i.etcd, 0)
	if err != nil {
		i.m.failures.WithLabelValues("etcd").Inc()
		return err
	}
	next := stream.Generation{Number: number, ClusterID: es.ClusterID, FirstRevision: es.Revision,
		Floor: max(i.known.Floor, i.knownLast, es.Revision-1)}
	cfg := i.cfg.StreamConfig()
	cfg.Metadata = next.SetMetadata(cfg.Metadata)
	st, err := i.js.CreateOrUpdateStream(ctx, cfg)
	if err != nil {
		i.m.failures.WithLabelValues("nats").Inc()
		return fmt.Errorf("creating the stream again for generation %d: %w", next.Number, err)
	}
	i.stream = st
	i.setGeneration(next, 0)
	i.lost.Store(false)
	i.ready.Store(true)
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

// generationKey is the etcd key where the leader keeps the stream's
// generation number: beside the election's keys (which are under
// election.prefix + "/").
func (i *Ingest) generationKey() string {
	return strings.TrimRight(i.cfg.ElectionPrefix, "/") + ".generation"
}

// storedGeneration is the generation number kept in etcd (0: none).
func (i *Ingest) storedGeneration(ctx context.Context) (int64, error) {
	resp, err := i.etcd.Get(ctx, i.generationKey())
	if err != nil {
		i.m.failures.WithLabelValues("etcd").Inc()
		return 0, fmt.Errorf("reading the stream's generation from etcd: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return 0, nil
	}
	n, err := strconv.ParseInt(string(resp.Kvs[0].Value), 10, 64)
	if err != nil {
		i.log.Warn("the stream's generation kept in etcd is not a number; ignored", "key", i.generationKey(), "value", string(resp.Kvs[0].Value))
		return 0, nil
	}
	return n, nil
}

// storeGeneration keeps generation number n in etcd.
func (i *Ingest) storeGeneration(ctx context.Context, n int64) error {
	if _, err := i.etcd.Put(ctx, i.generationKey(), strconv.FormatInt(n, 10)); err != nil {
		i.m.failures.WithLabelValues("etcd").Inc()
		return fmt.Errorf("keeping the stream's generation %d in etcd: %w", n, err)
	}
	return nil
}
