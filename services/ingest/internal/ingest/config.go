package ingest

import (
	"errors"
	"flag"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"herald.dev/libs/kube"
)

// Config is the whole configuration of an ingest process.
type Config struct {
	EtcdEndpoints    string
	EtcdDialTimeout  time.Duration
	Prefix           string
	ResourcesFile    string
	NATSURL          string
	Stream           string
	StreamReplicas   int
	StreamMaxAge     time.Duration
	StreamMaxBytes   int64
	StreamStorage    string
	MaxMessageBytes  int
	ElectionPrefix   string
	LeaseTTL         time.Duration
	ProgressInterval time.Duration
	RetryBackoff     time.Duration
	AdminAddr        string
	FaultInjection   bool
}

// RegisterFlags registers every flag of c on fs with its default.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.EtcdEndpoints, "etcd.endpoints", "http://127.0.0.1:2379", "Comma-separated etcd client URLs.")
	fs.DurationVar(&c.EtcdDialTimeout, "etcd.dial-timeout", 5*time.Second, "Timeout for connecting to etcd.")
	fs.StringVar(&c.Prefix, "prefix", kube.DefaultPrefix, "etcd key prefix of the Kubernetes objects.")
	fs.StringVar(&c.ResourcesFile, "resources-file", "", "Resource registry file (JSON); empty for the built-in resources.")
	fs.StringVar(&c.NATSURL, "nats.url", "nats://127.0.0.1:4222", "NATS server URL(s), comma-separated.")
	fs.StringVar(&c.Stream, "stream.name", "HERALD", "JetStream stream holding the event history.")
	fs.IntVar(&c.StreamReplicas, "stream.replicas", 1, "Stream replicas (1, 3 or 5).")
	fs.DurationVar(&c.StreamMaxAge, "stream.max-age", 24*time.Hour, "How long the stream keeps history (the durable resume window); 0 for no limit.")
	fs.Int64Var(&c.StreamMaxBytes, "stream.max-bytes", 8<<30, "Maximum stream size in bytes; -1 for no limit.")
	fs.StringVar(&c.StreamStorage, "stream.storage", "file", "Stream storage: file or memory.")
	fs.IntVar(&c.MaxMessageBytes, "stream.max-message-bytes", 900<<10, "Largest stream message; bigger revisions are split into parts. Must not exceed the NATS server's max_payload.")
	fs.StringVar(&c.ElectionPrefix, "election.prefix", "/herald/ingest/leader", "etcd prefix of the ingest leader election (outside the object prefix).")
	fs.DurationVar(&c.LeaseTTL, "election.lease-ttl", 5*time.Second, "Leader lease TTL; a dead leader is replaced after at most this long.")
	fs.DurationVar(&c.ProgressInterval, "progress-interval", time.Second, "How often an idle leader asks etcd for progress and publishes a progress marker if the revision moved.")
	fs.DurationVar(&c.RetryBackoff, "retry-backoff", 500*time.Millisecond, "Initial backoff after an etcd or NATS failure (doubles up to 10s).")
	fs.StringVar(&c.AdminAddr, "admin.addr", "127.0.0.1:9090", "Address of the admin server (/livez, /readyz, /metrics).")
	fs.BoolVar(&c.FaultInjection, "debug.fault-injection", false, "Serve /debug/fault/pause-publish and /debug/fault/resume-publish on the admin port (tests only).")
}

// Validate reports configuration errors.
func (c *Config) Validate() error {
	var errs []error
	if len(c.Endpoints()) == 0 {
		errs = append(errs, errors.New("etcd.endpoints is empty"))
	}
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
	if c.LeaseTTL < time.Second {
		errs = append(errs, errors.New("election.lease-ttl must be at least 1s"))
	}
	if c.ProgressInterval <= 0 || c.RetryBackoff <= 0 {
		errs = append(errs, errors.New("progress-interval and retry-backoff must be positive"))
	}
	return errors.Join(errs...)
}

// Endpoints splits EtcdEndpoints.
func (c *Config) Endpoints() []string {
	var out []string
	for _, e := range strings.Split(c.EtcdEndpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
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
		Subjects:    []string{kube.SubjectRoot + ".>", kube.SubjectProgress},
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
