package cache

import (
	"context"
	"fmt"
	"log/slog"

	"herald.dev/libs/kube"
	"herald.dev/libs/storage"
)

// Reading etcd's values. Ingest carries them untouched (protobuf, JSON, and
// still encrypted when etcd holds them encrypted); the shard decodes each
// one once, with kube.Decoder, wherever it comes from: the snapshot, the
// stream, or the stream's history in a deep replay. A value that cannot be
// decoded is skipped, counted and logged once, and never served.

// newDecoder reads the EncryptionConfiguration (if any) and builds the
// shard's decoder.
func newDecoder(cfg Config) (*kube.Decoder, error) {
	var enc *storage.Encryption
	if cfg.EncryptionConfig != "" {
		var err error
		if enc, err = storage.LoadEncryptionConfig(cfg.EncryptionConfig); err != nil {
			return nil, fmt.Errorf("encryption-config: %w", err)
		}
	}
	return kube.NewDecoder(enc)
}

// jsonOnly is the shard's decoder for a revision no stream wants in
// protobuf: it hides kube.Decoder's DecodeWithProtobuf from watchevent.FromChange,
// which then leaves the events' object_protobuf unmade.
type jsonOnly struct{ dec *kube.Decoder }

// Decode is kube.Decoder's.
func (d jsonOnly) Decode(ctx context.Context, r *kube.Resource, key, namespace, name string, value []byte, rev int64) (*kube.Object, error) {
	return d.dec.Decode(ctx, r, key, namespace, name, value, rev)
}

// skipUndecodable counts a stored value of r that is not served and logs it
// in one line naming resource, key, revision and reason (err never quotes
// a decrypted byte).
func (s *Shard) skipUndecodable(r *kube.Resource, key string, rev int64, err error) {
	reason := kube.Reason(err)
	s.m.skipped.WithLabelValues(r.ID(), reason).Inc()
	s.log.Warn("skipping a stored value that cannot be decoded", "resource", r.ID(), "key", key, "revision", rev, "reason", reason, "err", err)
}

// skipKey skips the value of a key under r's prefix that r's layout does
// not allow (a namespaced key without a name, extra segments).
func (s *Shard) skipKey(r *kube.Resource, key string, rev int64) {
	s.skipUndecodable(r, key, rev, kube.KeyLayoutError(r, key, rev))
}

// debugHandler writes every record at debug level. klog goes through it:
// k8s.io/apiserver's value transformers log each value they fail to decrypt,
// and the shard's own line (skipUndecodable) is the one that must reach an
// operator, once.
type debugHandler struct{ slog.Handler }

func (h debugHandler) Enabled(ctx context.Context, _ slog.Level) bool {
	return h.Handler.Enabled(ctx, slog.LevelDebug)
}

func (h debugHandler) Handle(ctx context.Context, r slog.Record) error {
	r.Level = slog.LevelDebug
	return h.Handler.Handle(ctx, r)
}

func (h debugHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return debugHandler{h.Handler.WithAttrs(as)}
}

func (h debugHandler) WithGroup(name string) slog.Handler {
	return debugHandler{h.Handler.WithGroup(name)}
}
