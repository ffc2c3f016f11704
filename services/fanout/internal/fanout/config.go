package fanout

import (
	"errors"
	"flag"
	"time"

	"herald.dev/libs/kube"
	"herald.dev/libs/service"
)

// Config is the whole configuration of a fanout replica.
type Config struct {
	CacheAddr        string
	CacheShards      string
	Prefix           string
	ResourcesFile    string
	HTTPAddr         string
	HTTPTLS          service.ServerTLS
	CacheTLS         service.ClientTLS
	AdminAddr        string
	RingSize         int
	RingBytes        int
	QueueEvents      int
	QueueBytes       int
	MaxWatchers      int
	BookmarkInterval time.Duration
	MinTimeout       time.Duration
	MaxTimeout       time.Duration
	UpstreamWait     time.Duration
	GzipInitial      bool
}

// RegisterFlags registers every flag of c on fs with its default.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.CacheAddr, "cache.addr", "127.0.0.1:7100", "gRPC address of the cache (host:port, or dns:///name:port for several replicas).")
	fs.StringVar(&c.CacheShards, "cache.shards", "", "Shard map: resource[/partitions]=target;...;*=target (see docs/operations.md). Empty: every resource on cache.addr.")
	fs.StringVar(&c.Prefix, "prefix", kube.DefaultPrefix, "etcd key prefix of the Kubernetes objects.")
	fs.StringVar(&c.ResourcesFile, "resources-file", "", "Resource registry file (JSON); empty for the built-in resources.")
	fs.StringVar(&c.HTTPAddr, "http.addr", "127.0.0.1:7200", "Address of the internal watch HTTP server (reached through frontdoor only).")
	c.HTTPTLS.RegisterFlags(fs, "http")
	c.CacheTLS.RegisterFlags(fs, "cache", "the cache")
	fs.StringVar(&c.AdminAddr, "admin.addr", "127.0.0.1:9200", "Address of the admin server (/livez, /readyz, /metrics).")
	fs.IntVar(&c.RingSize, "ring-size", 10240, "Recent events kept per resource for watchers that join or resume (at 200 writes/s, about 50 s).")
	fs.IntVar(&c.RingBytes, "ring-bytes", 64<<20, "Bound on the memory of one resource's recent events (objects and their encodings, estimated).")
	fs.IntVar(&c.QueueEvents, "watcher.queue-events", 1000, "Events queued per watcher before it is closed as too slow.")
	fs.IntVar(&c.QueueBytes, "watcher.queue-bytes", 16<<20, "Bytes queued per watcher before it is closed as too slow.")
	fs.IntVar(&c.MaxWatchers, "max-watchers", 20000, "Watchers per replica; more get 429.")
	fs.DurationVar(&c.BookmarkInterval, "bookmark-interval", time.Minute, "How often a watcher that allows bookmarks gets one.")
	fs.DurationVar(&c.MinTimeout, "watch.min-timeout", 30*time.Minute, "Lower bound of the random server-side watch timeout (when the client sets none).")
	fs.DurationVar(&c.MaxTimeout, "watch.max-timeout", time.Hour, "Upper bound of the random server-side watch timeout.")
	fs.BoolVar(&c.GzipInitial, "watch.gzip-initial", true, "Gzip watch streams that start with initial state (sendInitialEvents, resourceVersion unset or 0) when the client accepts gzip.")
	fs.DurationVar(&c.UpstreamWait, "upstream-wait", 5*time.Second, "How long a new watch waits for the resource's upstream stream before 503.")
}

// ShardMap is the shard map in its textual form.
func (c *Config) ShardMap() string {
	if c.CacheShards != "" {
		return c.CacheShards
	}
	return "*=" + c.CacheAddr
}

// Validate reports configuration errors.
func (c *Config) Validate() error {
	var errs []error
	if err := c.HTTPTLS.Validate("http"); err != nil {
		errs = append(errs, err)
	}
	if c.CacheAddr == "" {
		errs = append(errs, errors.New("cache.addr is empty"))
	}
	if c.RingSize < 1 || c.RingBytes < 1 || c.QueueEvents < 1 || c.QueueBytes < 1 || c.MaxWatchers < 1 {
		errs = append(errs, errors.New("ring-size, ring-bytes, watcher.queue-events, watcher.queue-bytes and max-watchers must be positive"))
	}
	if c.BookmarkInterval <= 0 || c.MinTimeout <= 0 || c.MaxTimeout < c.MinTimeout {
		errs = append(errs, errors.New("bookmark-interval and watch timeouts must be positive, min <= max"))
	}
	return errors.Join(errs...)
}
