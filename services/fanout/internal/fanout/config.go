package fanout

import (
	"errors"
	"flag"
	"fmt"
	"time"

	"herald.dev/libs/cacheclient"
	"herald.dev/libs/service"
)

// Config is the whole configuration of a fanout replica.
type Config struct {
	service.ShardsConfig
	service.RegistryConfig
	service.AdminConfig
	HTTPAddr         string
	HTTPTLS          service.ServerTLS
	CacheTLS         service.ClientTLS
	RingSize         int
	RingBytes        int
	QueueEvents      int
	QueueBytes       int
	MaxWatchers      int
	BookmarkInterval time.Duration
	MinTimeout       time.Duration
	MaxTimeout       time.Duration
	UpstreamWait     time.Duration
	MergeEvents      int
	MergeBytes       int64
	GzipInitial      bool
	Replays          int
	// CacheStreamWindow is the flow-control window of each stream from
	// the caches: the most a stream that is not being read holds.
	CacheStreamWindow int
	// WriteCoalesce: how long a busy watch gathers events before its next
	// write (see Server.serve).
	WriteCoalesce time.Duration
	// WriteHold: how long a connection from frontdoor gathers the frames
	// of its streams before it is written to (service.GatherWrites).
	WriteHold time.Duration
}

// RegisterFlags registers every flag of c on fs with its default.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	c.ShardsConfig.RegisterFlagsWithPrefix("cache", "gRPC address of the cache (host:port, or dns:///name:port for several replicas).", fs)
	c.RegistryConfig.RegisterFlags(fs)
	fs.StringVar(&c.HTTPAddr, "http.addr", "127.0.0.1:7200", "Address of the internal watch HTTP server (reached through frontdoor only).")
	c.HTTPTLS.RegisterFlagsWithPrefix("http", fs)
	c.HTTPTLS.RegisterAllowedClientNamesFlag("http", "herald-frontdoor", fs)
	c.CacheTLS.RegisterFlagsWithPrefix("cache", "the cache", fs)
	c.AdminConfig.RegisterFlags(fs, "127.0.0.1:9200", "")
	fs.IntVar(&c.RingSize, "ring-size", 10240, "Recent events kept per resource for watchers that join, resume or fall behind (at 200 writes/s, about 50 s).")
	fs.IntVar(&c.RingBytes, "ring-bytes", 64<<20, "Bound on the memory of one resource's recent events (objects and their encodings, estimated).")
	fs.IntVar(&c.QueueEvents, "watcher.queue-events", 1000, "Events queued per watcher. A watcher further behind is written from the resource's ring of recent events (ring-size, ring-bytes) until it catches up, and closed as too slow only if the ring drops an event it has not been sent.")
	fs.IntVar(&c.QueueBytes, "watcher.queue-bytes", 16<<20, "Bytes of objects queued per watcher (see watcher.queue-events).")
	fs.IntVar(&c.MaxWatchers, "max-watchers", 20000, "Watchers per replica; more get 429.")
	fs.DurationVar(&c.BookmarkInterval, "bookmark-interval", time.Minute, "How often a watcher that allows bookmarks gets one.")
	fs.DurationVar(&c.WriteCoalesce, "watch.write-coalesce", 50*time.Millisecond, "A watch written to less than this long ago waits out the rest before its next write, and sends everything queued meanwhile in that one write: a busy watch (a controller's or kube-proxy's in a busy cluster) costs one write, here and in frontdoor, per this interval instead of one per event, for at most this much more latency. A watch that was quiet for this long (a kubelet's) is written to at once. 0: every event at once.")
	fs.DurationVar(&c.WriteHold, "http.write-hold", time.Millisecond, "A connection to the watch port (frontdoor's session, carrying up to 500 watches) written to less than this long ago holds what is written to it (session frames) and sends it together at the end of the interval, or at once when 64 KiB are held: a connection carrying many busy watches costs one socket write per interval instead of one per session write, here and in frontdoor's reads. A connection quiet for this long is written to at once. 0: every write at once.")
	fs.DurationVar(&c.MinTimeout, "watch.min-timeout", 30*time.Minute, "Lower bound of the random server-side watch timeout (when the client sets none).")
	fs.DurationVar(&c.MaxTimeout, "watch.max-timeout", time.Hour, "Upper bound of the random server-side watch timeout.")
	fs.BoolVar(&c.GzipInitial, "watch.gzip-initial", true, "Gzip watch streams that start with initial state (sendInitialEvents, resourceVersion unset or 0) when the client accepts gzip.")
	def := cacheclient.DefaultMergeLimits()
	fs.IntVar(&c.MergeEvents, "upstream.merge-max-events", def.Events, "Events of a split resource held back while one cache shard lags behind the others; past it (or upstream.merge-max-bytes) the resource's watchers are closed to resume.")
	fs.Int64Var(&c.MergeBytes, "upstream.merge-max-bytes", def.Bytes, "Bytes of objects held back while one cache shard lags behind the others (see upstream.merge-max-events).")
	fs.IntVar(&c.Replays, "replay.concurrency", 16, "Watches caught up from the caches (resumes older than the ring) at once; more wait their turn.")
	fs.IntVar(&c.CacheStreamWindow, "cache.stream-window-bytes", 256<<10, "Flow-control window of each stream from the caches (at least 64 KiB): the most bytes a cache may send ahead of what fanout has read on one stream. A catch-up over a split resource reads one shard while the others wait, so each running catch-up may hold about this much per other shard.")
	fs.DurationVar(&c.UpstreamWait, "upstream-wait", 5*time.Second, "How long a new watch waits for the resource's upstream stream before 503.")
}

// Validate reports configuration errors.
func (c *Config) Validate() error {
	var errs []error
	errs = append(errs, c.HTTPTLS.Validate("http"), c.CacheTLS.Validate("cache"))
	if c.CacheAddr == "" {
		errs = append(errs, errors.New("cache.addr is empty"))
	}
	if c.RingSize < 1 || c.RingBytes < 1 || c.QueueEvents < 1 || c.QueueBytes < 1 || c.MaxWatchers < 1 || c.MergeEvents < 1 || c.MergeBytes < 1 || c.Replays < 1 {
		errs = append(errs, errors.New("ring-size, ring-bytes, watcher.queue-events, watcher.queue-bytes, max-watchers, upstream.merge-max-* and replay.concurrency must be positive"))
	}
	if c.CacheStreamWindow < minStreamWindow || c.CacheStreamWindow > maxStreamWindow {
		errs = append(errs, fmt.Errorf("cache.stream-window-bytes must be between %d and %d", minStreamWindow, maxStreamWindow))
	}
	if c.WriteCoalesce < 0 || c.WriteCoalesce > time.Second {
		errs = append(errs, errors.New("watch.write-coalesce must be between 0 and 1s"))
	}
	if c.WriteHold < 0 || c.WriteHold > 100*time.Millisecond {
		errs = append(errs, errors.New("http.write-hold must be between 0 and 100ms"))
	}
	if c.BookmarkInterval <= 0 || c.MinTimeout <= 0 || c.MaxTimeout < c.MinTimeout {
		errs = append(errs, errors.New("bookmark-interval and watch timeouts must be positive, min <= max"))
	}
	return errors.Join(errs...)
}

// Bounds of cache.stream-window-bytes: gRPC ignores a window below 64 KiB,
// and one above 16 MiB buys no throughput (it is the most a connection
// carries unread).
const (
	minStreamWindow = 64 << 10
	maxStreamWindow = 16 << 20
)
