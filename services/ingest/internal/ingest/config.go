package ingest

import (
	"errors"
	"flag"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"herald.dev/libs/service"
	"herald.dev/libs/stream"
)

// Config is the whole configuration of an ingest process.
type Config struct {
	service.SourceConfig
	service.AdminConfig
	StreamReplicas  int
	StreamMaxAge    time.Duration
	StreamMaxBytes  int64
	StreamStorage   string
	MaxMessageBytes int
	// PublishMaxInFlight: records sent to the stream before the oldest is
	// acknowledged (publisher.go).
	PublishMaxInFlight int
	ElectionPrefix     string
	LeaseTTL           time.Duration
	ProgressInterval   time.Duration
	RetryBackoff       time.Duration
	FaultInjection     bool
}

// RegisterFlags registers every flag of c on fs with its default.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	c.SourceConfig.RegisterFlags(fs, "")
	fs.IntVar(&c.StreamReplicas, "stream.replicas", 1, "Stream replicas (1, 3 or 5).")
	fs.DurationVar(&c.StreamMaxAge, "stream.max-age", 24*time.Hour, "How long the stream keeps history (the durable resume window); 0 for no limit.")
	fs.Int64Var(&c.StreamMaxBytes, "stream.max-bytes", 8<<30, "Maximum stream size in bytes; -1 for no limit.")
	fs.StringVar(&c.StreamStorage, "stream.storage", "file", "Stream storage: file or memory.")
	fs.IntVar(&c.MaxMessageBytes, "stream.max-message-bytes", 900<<10, "Largest stream message; bigger revisions are split into parts. Must not exceed the NATS server's max_payload.")
	fs.IntVar(&c.PublishMaxInFlight, "publish.max-in-flight", 256, "Stream messages the leader sends before the oldest is acknowledged (at most 8 MiB of them): appends are pipelined, each still fenced on the message it must follow. 1: one append at a time, each waiting for its ack.")
	fs.StringVar(&c.ElectionPrefix, "election.prefix", "/herald/ingest/leader", "etcd prefix of the ingest leader election (outside the object prefix).")
	fs.DurationVar(&c.LeaseTTL, "election.lease-ttl", 5*time.Second, "Leader lease TTL; a dead leader is replaced after at most this long.")
	fs.DurationVar(&c.ProgressInterval, "progress-interval", time.Second, "How often an idle leader asks etcd for progress and publishes a progress marker if the revision moved.")
	fs.DurationVar(&c.RetryBackoff, "retry-backoff", 500*time.Millisecond, "Initial backoff after an etcd or NATS failure (doubles up to 10s).")
	c.AdminConfig.RegisterFlags(fs, "127.0.0.1:9090", "")
	fs.BoolVar(&c.FaultInjection, "debug.fault-injection", false, "Serve /debug/fault/pause-publish and /debug/fault/resume-publish on the admin port (tests only).")
}

// Validate reports configuration errors.
func (c *Config) Validate() error {
	errs := []error{c.SourceConfig.Validate()}
	if !strings.HasPrefix(c.Prefix, "/") {
		errs = append(errs, errors.New("prefix must start with /"))
	}
	if strings.HasPrefix(c.ElectionPrefix, strings.TrimRight(c.Prefix, "/")+"/") {
		errs = append(errs, errors.New("election.prefix must lie outside prefix: its changes would enter the stream"))
	}
	switch c.StreamReplicas {
	case 1, 3, 5:
	default:
		errs = append(errs, errors.New("stream.replicas must be 1, 3 or 5"))
	}
	if c.StreamStorage != "file" && c.StreamStorage != "memory" {
		errs = append(errs, errors.New("stream.storage must be file or memory"))
	}
	if c.MaxMessageBytes < 64<<10 {
		errs = append(errs, errors.New("stream.max-message-bytes must be at least 64KiB"))
	}
	if c.PublishMaxInFlight < 1 {
		errs = append(errs, errors.New("publish.max-in-flight must be at least 1"))
	}
	if c.LeaseTTL < time.Second {
		errs = append(errs, errors.New("election.lease-ttl must be at least 1s"))
	}
	if c.ProgressInterval <= 0 || c.RetryBackoff <= 0 {
		errs = append(errs, errors.New("progress-interval and retry-backoff must be positive"))
	}
	return errors.Join(errs...)
}

// StreamConfig is the JetStream stream ingest creates or updates.
func (c *Config) StreamConfig() jetstream.StreamConfig {
	storage := jetstream.FileStorage
	if c.StreamStorage == "memory" {
		storage = jetstream.MemoryStorage
	}
	return jetstream.StreamConfig{
		Name:        c.Stream,
		Description: "Herald: etcd revisions under " + c.Prefix + ", in order, once each",
		Subjects:    stream.Subjects(),
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      c.StreamMaxAge,
		MaxBytes:    c.StreamMaxBytes,
		MaxMsgSize:  int32(c.MaxMessageBytes),
		Storage:     storage,
		Replicas:    c.StreamReplicas,
		Duplicates:  2 * time.Minute,
	}
}
