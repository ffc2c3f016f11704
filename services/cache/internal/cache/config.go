package cache

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"herald.dev/libs/kube"
	"herald.dev/libs/service"
)

// Config is the whole configuration of a cache shard replica.
type Config struct {
	service.SourceConfig
	service.AdminConfig
	// Resources this shard owns (registry IDs); empty for all.
	Resources string
	// Partitions of each owned resource this shard owns; empty for all.
	Partitions string
	// ShardMap and ShardTarget: alternatively, own exactly what the shard
	// map routes to this shard's target.
	ShardMap          string
	ShardTarget       string
	WindowSizes       string
	DefaultWindowSize int
	WaitTimeout       time.Duration
	SubscriberBuffer  int
	GRPCAddr          string
	GRPCTLS           service.ServerTLS
	MaxRecvBytes      int
	// EncryptionConfig is kube-apiserver's EncryptionConfiguration file
	// (its --encryption-provider-config): how to decrypt values encrypted
	// at rest. Empty: nothing is encrypted.
	EncryptionConfig string
	DeepReplays      int
	// DeepReplayCache bounds the decoded history deep replays share.
	DeepReplayCache int
	// WindowRebuild: at start, the windows are rebuilt from up to this
	// many of the stream's last messages; 0: they start empty.
	WindowRebuild int
	// CatchUpTimeout bounds how long a watch resuming after a revision the
	// shard has not reached waits while the shard keeps applying revisions.
	CatchUpTimeout time.Duration
}

// RegisterFlags registers every flag of c on fs with its default.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	c.SourceConfig.RegisterFlags(fs, " (snapshots and consistent reads)")
	fs.StringVar(&c.Resources, "shard.resources", "", "Comma-separated resource IDs this shard owns (e.g. pods,deployments.apps); empty for all.")
	fs.StringVar(&c.Partitions, "shard.partitions", "", fmt.Sprintf("Namespace partitions (0-%d) of the owned resources, e.g. 0-7 or 0,2,4-5; empty for all.", kube.Partitions-1))
	fs.StringVar(&c.ShardMap, "cache.shards", "", "The shard map frontdoor and fanout use; with shard.target, this shard owns what the map routes to that target.")
	fs.StringVar(&c.ShardTarget, "shard.target", "", "This shard's target as written in cache.shards (e.g. dns:///herald-cache-a:7100).")
	fs.StringVar(&c.WindowSizes, "watch-cache-sizes", "", "Per-resource window sizes in kube-apiserver's format, e.g. pods#1000,nodes#500.")
	fs.IntVar(&c.DefaultWindowSize, "default-watch-cache-size", 1000, "Window size (events) of resources not named in watch-cache-sizes.")
	fs.DurationVar(&c.WaitTimeout, "wait-timeout", 3*time.Second, "How long a read waits for the shard to reach a requested or etcd's current revision.")
	fs.IntVar(&c.SubscriberBuffer, "subscriber-buffer", 4096, "Revisions buffered per following watch stream before it is cut off as too slow.")
	fs.StringVar(&c.GRPCAddr, "grpc.addr", "127.0.0.1:7100", "Address of the gRPC server (List, Watch).")
	c.GRPCTLS.RegisterFlagsWithPrefix("grpc", fs)
	c.GRPCTLS.RegisterAllowedClientNamesFlag("grpc", "herald-fanout,herald-frontdoor", fs)
	c.AdminConfig.RegisterFlags(fs, "127.0.0.1:9100", "")
	fs.IntVar(&c.MaxRecvBytes, "grpc.max-recv-bytes", 1<<20, "Largest gRPC request accepted.")
	fs.StringVar(&c.EncryptionConfig, "encryption-config", "", "kube-apiserver's EncryptionConfiguration file (apiserver.config.k8s.io/v1, as given to its --encryption-provider-config): decrypts values encrypted at rest (aescbc, aesgcm, secretbox, identity; KMS values are skipped). Empty: nothing is encrypted.")
	fs.IntVar(&c.DeepReplays, "deep-replay.concurrency", 4, "Deep resumes (watches older than the window, replayed from the stream) served at once; more wait their turn.")
	fs.IntVar(&c.DeepReplayCache, "deep-replay.cache-bytes", 16<<20, "Bytes of decoded objects deep replays share (the most recently read values of the stream's history): replays running side by side over the same records decode each once.")
	fs.IntVar(&c.WindowRebuild, "window.rebuild-messages", 10000, "At start, rebuild the windows from up to this many of the stream's last messages (etcd's state before them, then the stream), so that watches resuming from revisions shortly before a restart are served from memory instead of replayed from the stream one by one; 0 starts with empty windows at etcd's current revision.")
	fs.DurationVar(&c.CatchUpTimeout, "watch.catch-up-timeout", 30*time.Second, "How long a watch resuming after a revision the shard has not reached yet waits while the shard is catching up (applying revisions, as after a restart); without progress for wait-timeout it fails as too large.")
}

// Validate reports configuration errors.
func (c *Config) Validate() error {
	errs := []error{c.SourceConfig.Validate()}
	if _, err := c.partitionSet(); err != nil {
		errs = append(errs, err)
	}
	if err := c.GRPCTLS.Validate("grpc"); err != nil {
		errs = append(errs, err)
	}
	if (c.ShardMap == "") != (c.ShardTarget == "") {
		errs = append(errs, errors.New("cache.shards and shard.target go together"))
	}
	if c.ShardTarget != "" && (c.Resources != "" || c.Partitions != "") {
		errs = append(errs, errors.New("shard.target replaces shard.resources and shard.partitions"))
	}
	if _, err := c.windowSizes(); err != nil {
		errs = append(errs, err)
	}
	if c.DefaultWindowSize < 1 {
		errs = append(errs, errors.New("default-watch-cache-size must be at least 1"))
	}
	if c.WaitTimeout <= 0 || c.SubscriberBuffer < 1 || c.DeepReplays < 1 {
		errs = append(errs, errors.New("wait-timeout, subscriber-buffer and deep-replay.concurrency must be positive"))
	}
	if c.WindowRebuild < 0 || c.DeepReplayCache < 0 {
		errs = append(errs, errors.New("window.rebuild-messages and deep-replay.cache-bytes must not be negative"))
	}
	if c.CatchUpTimeout < c.WaitTimeout {
		errs = append(errs, errors.New("watch.catch-up-timeout must be at least wait-timeout"))
	}
	return errors.Join(errs...)
}

// ownership returns, by resource ID, the namespace partitions this shard
// owns (nil: all of them); a nil map means every resource, whole.
func (c *Config) ownership(reg *kube.Registry) (map[string]map[int]bool, error) {
	if c.ShardTarget != "" {
		m, err := kube.ParseShardMap(c.ShardMap, reg)
		if err != nil {
			return nil, fmt.Errorf("cache.shards: %w", err)
		}
		out := map[string]map[int]bool{}
		for _, r := range reg.Resources() {
			for _, sh := range m.All(r) {
				if sh.Target != c.ShardTarget {
					continue
				}
				var parts map[int]bool
				if sh.Partitions != nil {
					parts = map[int]bool{}
					for _, p := range sh.Partitions {
						parts[p] = true
					}
				}
				out[r.ID()] = parts
			}
		}
		if len(out) == 0 {
			return nil, fmt.Errorf("shard.target %q owns nothing in cache.shards", c.ShardTarget)
		}
		return out, nil
	}
	parts, err := c.partitionSet()
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(c.Resources) == "" {
		if parts == nil {
			return nil, nil
		}
		out := map[string]map[int]bool{}
		for _, r := range reg.Resources() {
			out[r.ID()] = parts
		}
		return out, nil
	}
	out := map[string]map[int]bool{}
	for _, id := range strings.Split(c.Resources, ",") {
		if id = strings.TrimSpace(id); id != "" {
			if _, ok := reg.ByID(id); !ok {
				return nil, fmt.Errorf("shard.resources: unknown resource %q", id)
			}
			out[id] = parts
		}
	}
	return out, nil
}

// partitionSet returns the owned partitions (nil: all).
func (c *Config) partitionSet() (map[int]bool, error) {
	if strings.TrimSpace(c.Partitions) == "" {
		return nil, nil
	}
	set, err := kube.ParsePartitions(c.Partitions)
	if err != nil {
		return nil, fmt.Errorf("shard.partitions: %w", err)
	}
	out := map[int]bool{}
	for p, owned := range set {
		if owned {
			out[p] = true
		}
	}
	return out, nil
}

// windowSizes parses "pods#1000,nodes#500". Resources may be named by ID or
// by plural (kube-apiserver's form).
func (c *Config) windowSizes() (map[string]int, error) {
	out := map[string]int{}
	if strings.TrimSpace(c.WindowSizes) == "" {
		return out, nil
	}
	for _, item := range strings.Split(c.WindowSizes, ",") {
		name, size, ok := strings.Cut(strings.TrimSpace(item), "#")
		n, err := strconv.Atoi(size)
		if !ok || name == "" || err != nil || n < 1 {
			return nil, fmt.Errorf("watch-cache-sizes: %q is not resource#size with size >= 1", item)
		}
		out[name] = n
	}
	return out, nil
}
