package frontdoor

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"herald.dev/libs/service"
	"herald.dev/libs/watchsession"
	"herald.dev/services/frontdoor/internal/audit"
	"herald.dev/services/frontdoor/internal/upstream"
)

// Config is the whole configuration of a frontdoor replica. Flags are named
// after kube-apiserver's where the meaning is the same.
type Config struct {
	service.AdminConfig
	Addr        string
	TLSCertFile string
	TLSKeyFile  string

	// Authentication.
	TokenFile        string
	ClientCAFile     string
	SAKeyFiles       string
	SAIssuers        string
	APIAudiences     string
	AnonymousAuth    bool
	ReloadInterval   time.Duration
	AuthorizationDir string

	// Cluster mode (internal/upstream): in front of a real kube-apiserver.
	Upstream upstream.Config

	// Backends.
	service.ShardsConfig
	FanoutAddrs     string
	FanoutTLS       service.ClientTLS
	CacheTLS        service.ClientTLS
	FanoutRetryDown time.Duration
	FanoutResolve   time.Duration
	// FanoutRebalance (0: off) and FanoutRebalanceShare pace the shedding
	// of watches off loaded replicas (see fanoutPool).
	FanoutRebalance      time.Duration
	FanoutRebalanceShare float64

	service.RegistryConfig

	// Limits.
	RequestTimeout        time.Duration
	WriteTimeout          time.Duration
	MaxHeaderBytes        int
	MaxSelectorBytes      int
	MaxBodyBytes          int64
	ReadHeaderTime        time.Duration
	IdleTimeout           time.Duration
	MaxInflight           int
	MaxInflightPerUser    int
	MaxWatches            int
	MaxWatchesPerUser     int
	HTTP2MaxStreams       int
	GzipMinBytes          int
	MaxListResponse       int
	ShutdownGracePeriod   time.Duration
	FanoutDialTimeout     time.Duration
	FanoutResponseTimeout time.Duration
	FanoutSharedWindow    int

	Audit audit.Config
}

// RegisterFlags registers every flag of c on fs with its default.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Addr, "addr", "127.0.0.1:6443", "HTTPS address of the Kubernetes API.")
	fs.StringVar(&c.TLSCertFile, "tls.cert-file", "", "Serving certificate (PEM); reloaded when it changes.")
	fs.StringVar(&c.TLSKeyFile, "tls.key-file", "", "Serving key (PEM); reloaded when it changes.")
	c.AdminConfig.RegisterFlags(fs, "127.0.0.1:9300", " Internal: keep it off public networks.")

	fs.StringVar(&c.TokenFile, "token-auth-file", "", "Static bearer tokens, kube-apiserver's CSV format: token,user,uid,\"group1,group2\"; reloaded when it changes (a removed line or an emptied file revokes; a file that is deleted or fails to parse refuses every token until it loads). Standalone only: refused with upstream.kubeconfig (its tokens would be impersonated upstream).")
	fs.StringVar(&c.ClientCAFile, "client-ca-file", "", "CA bundle (PEM) for x509 client certificates (CN is the user, O the groups); reloaded when it changes (an emptied file refuses every certificate; so does one that is deleted or fails to parse, until it loads).")
	fs.StringVar(&c.SAKeyFiles, "service-account-key-file", "", "Comma-separated PEM files with the public keys (or certificates, or private keys) that verify service-account tokens (which must carry an expiry: legacy Secret-based tokens are refused); reloaded when they change (one that is deleted or fails to load refuses every service-account token until it loads). A token bound to a pod, node or secret is refused once the cache no longer holds that object with its uid. Standalone only: refused with upstream.kubeconfig.")
	fs.StringVar(&c.SAIssuers, "service-account-issuer", "https://kubernetes.default.svc.cluster.local", "Comma-separated accepted issuers (iss) of service-account tokens.")
	fs.StringVar(&c.APIAudiences, "api-audiences", "", "Comma-separated audiences a service-account token must name one of (default: the issuers).")
	fs.BoolVar(&c.AnonymousAuth, "anonymous-auth", false, "Serve requests without credentials as system:anonymous (group system:unauthenticated), subject to authorization.")
	fs.DurationVar(&c.ReloadInterval, "reload-interval", 2*time.Second, "How often the certificate, token, CA, key and RBAC files are checked for changes.")
	fs.StringVar(&c.AuthorizationDir, "authorization.rbac-dir", "", "Directory of RBAC manifests (YAML or JSON Role, ClusterRole, RoleBinding, ClusterRoleBinding, List); reloaded when it changes (a directory that is deleted, or a manifest that fails to load, grants nothing until it loads). Group system:masters is always allowed everything. Standalone only: refused with upstream.kubeconfig.")

	c.Upstream.RegisterFlags(fs)

	c.ShardsConfig.RegisterFlagsWithPrefix("cache", "gRPC address of the cache (host:port, or dns:///name:port).", fs)
	fs.StringVar(&c.FanoutAddrs, "fanout.addrs", "http://127.0.0.1:7200", "Comma-separated base URLs of fanout replicas (https:// with fanout.tls.* for mutual TLS).")
	c.FanoutTLS.RegisterFlagsWithPrefix("fanout", "fanout replicas", fs)
	c.FanoutTLS.RegisterServerNameFlag("fanout", "fanout replicas", fs)
	c.CacheTLS.RegisterFlagsWithPrefix("cache", "the cache", fs)
	c.CacheTLS.RegisterServerNameFlag("cache", "the cache", fs)
	fs.DurationVar(&c.FanoutRetryDown, "fanout.down-for", 2*time.Second, "How long a fanout replica that refused a connection is skipped.")
	fs.DurationVar(&c.FanoutResolve, "fanout.resolve-interval", time.Second, "How often a fanout URL given by DNS name (a headless Service) is resolved again into its replicas (also at once when a replica fails).")
	fs.DurationVar(&c.FanoutRebalance, "fanout.rebalance-interval", 5*time.Second, "How often watches are moved off fanout replicas holding more than their fair share (they end cleanly and the clients resume on the least loaded replica); 0 turns it off.")
	fs.Float64Var(&c.FanoutRebalanceShare, "fanout.rebalance-max-share", 0.1, "Largest share of this frontdoor's watches ended per rebalance interval (at least one).")
	fs.DurationVar(&c.FanoutDialTimeout, "fanout.dial-timeout", 2*time.Second, "Timeout to connect to a fanout replica before trying the next.")
	fs.DurationVar(&c.FanoutResponseTimeout, "fanout.response-timeout", 30*time.Second, "Time a fanout replica has to start answering a watch.")
	fs.IntVar(&c.FanoutSharedWindow, "fanout.shared-window", 16<<20, "Bytes of recent watch events each session with a fanout replica (up to 500 watches) keeps, here and in the replica, so that an event that several of its watches get crosses once: while those watches are at most this many bytes of events apart. A broadcast past the machine's capacity spreads its watches out; a window they outgrow sends each event again for every one of them, which costs more CPU, and they fall further apart. Memory: up to this much per session, here and in the replica (there on top of its ring-bytes), while its watches use that many bytes of events that went to more than one of them; what no watch used for 30-45 s is forgotten at both ends; 10,000 watches take 20 or more sessions. From 524288 (what a replica that predates the setting keeps) to 268435456.")

	c.RegistryConfig.RegisterFlags(fs)
	c.Audit.RegisterFlags(fs)

	fs.DurationVar(&c.RequestTimeout, "request-timeout", 60*time.Second, "Timeout of non-watch requests.")
	fs.DurationVar(&c.WriteTimeout, "write-timeout", 60*time.Second, "Time a non-watch response (LIST, GET, discovery, an error) has to reach the client from its first byte; a client that stops reading is cut then, freeing its request slot and the response's memory. Watches are exempt: fanout cuts slow watchers. Long-running forwarded requests (logs, exec, port-forward, watches kube-apiserver answers) are exempt too: each of their writes must complete within it (see upstream.long-running-timeout).")
	fs.IntVar(&c.MaxHeaderBytes, "max-header-bytes", 1<<20, "Largest request header block (431 beyond).")
	fs.IntVar(&c.MaxSelectorBytes, "max-selector-bytes", 64<<10, "Largest fieldSelector and labelSelector of a list or watch together (400 beyond, before the request is authorized: an authorizer's review carries them). kube-apiserver bounds them only by its 1 MiB of request headers.")
	fs.Int64Var(&c.MaxBodyBytes, "max-request-body-bytes", 3<<20, "Largest request body (413 beyond, before anything is forwarded upstream): kube-apiserver's limit.")
	fs.DurationVar(&c.ReadHeaderTime, "read-header-timeout", 10*time.Second, "Time a client has to complete the TLS handshake and send its request headers (slowloris).")
	fs.DurationVar(&c.IdleTimeout, "idle-timeout", 90*time.Second, "How long an idle keep-alive connection is kept.")
	fs.IntVar(&c.MaxInflight, "max-requests-inflight", 400, "Non-watch requests served at once; more get 429 with Retry-After.")
	fs.IntVar(&c.MaxInflightPerUser, "max-requests-inflight-per-user", 100, "Non-watch requests one user may have in flight (fairness); more get 429.")
	fs.IntVar(&c.MaxWatches, "max-watches", 10000, "Watches open at once; more get 429 with Retry-After.")
	fs.IntVar(&c.MaxWatchesPerUser, "max-watches-per-user", 0, "Watches one user may hold open; more get 429. 0 (the default) sets no per-user bound, as kube-apiserver has none: a DaemonSet's pods share one ServiceAccount. Fairness between users holds anyway: a watch's initialization takes a slot of max-requests-inflight(-per-user), and once less than a quarter of max-watches is free a user holding a fair share or more is refused.")
	fs.IntVar(&c.HTTP2MaxStreams, "http2-max-streams-per-connection", 250, "Concurrent HTTP/2 streams per client connection.")
	fs.IntVar(&c.GzipMinBytes, "gzip-min-bytes", 128<<10, "Responses at least this large are gzipped when the client accepts it.")
	fs.IntVar(&c.MaxListResponse, "max-list-response-bytes", 2<<30, "Largest LIST response from the cache.")
	fs.DurationVar(&c.ShutdownGracePeriod, "shutdown-grace-period", 5*time.Second, "Time non-watch requests get to finish on SIGTERM (watches end at once, cleanly; clients resume elsewhere; a watch client that does not read its stream's end is cut after it).")
}

// Validate reports configuration errors.
func (c *Config) Validate() error {
	var errs []error
	if c.TLSCertFile == "" || c.TLSKeyFile == "" {
		errs = append(errs, errors.New("tls.cert-file and tls.key-file are required"))
	}
	if c.TokenFile == "" && c.ClientCAFile == "" && c.SAKeyFiles == "" && !c.AnonymousAuth && !c.Upstream.Enabled() {
		errs = append(errs, errors.New("no authenticator: set token-auth-file, client-ca-file, service-account-key-file or upstream.kubeconfig (anonymous access is off)"))
	}
	if c.Upstream.Enabled() {
		// In front of a cluster every identity and every decision is the
		// cluster's. A static token here would be forwarded upstream by
		// impersonation (a dev admin token would act as system:masters in
		// the cluster), a service-account token verified by key alone would
		// outlive its Pod, Secret or ServiceAccount, and local RBAC would
		// be silently ignored.
		for flag, v := range map[string]string{"token-auth-file": c.TokenFile, "service-account-key-file": c.SAKeyFiles, "authorization.rbac-dir": c.AuthorizationDir} {
			if v != "" {
				errs = append(errs, fmt.Errorf("%s cannot be used with upstream.kubeconfig: in cluster mode callers are authenticated (TokenReview, client-ca-file) and authorized (SubjectAccessReview) by the cluster only", flag))
			}
		}
	}
	if c.SAKeyFiles != "" && len(service.SplitList(c.SAIssuers)) == 0 {
		errs = append(errs, errors.New("service-account-issuer is required with service-account-key-file"))
	}
	if len(c.fanouts()) == 0 {
		errs = append(errs, errors.New("fanout.addrs is empty"))
	}
	if c.FanoutRebalance < 0 || c.FanoutRebalanceShare <= 0 || c.FanoutRebalanceShare > 1 {
		errs = append(errs, errors.New("fanout.rebalance-interval must not be negative and fanout.rebalance-max-share must be in (0, 1]"))
	}
	if c.ReloadInterval <= 0 {
		errs = append(errs, errors.New("reload-interval must be positive"))
	}
	for name, n := range map[string]int{
		"max-requests-inflight": c.MaxInflight, "max-requests-inflight-per-user": c.MaxInflightPerUser,
		"max-watches":      c.MaxWatches,
		"max-header-bytes": c.MaxHeaderBytes, "http2-max-streams-per-connection": c.HTTP2MaxStreams,
		"max-selector-bytes": c.MaxSelectorBytes,
	} {
		if n <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive", name))
		}
	}
	if c.FanoutSharedWindow < watchsession.DefaultSharedWindow || c.FanoutSharedWindow > watchsession.MaxSharedWindow {
		errs = append(errs, fmt.Errorf("fanout.shared-window must be from %d to %d bytes", watchsession.DefaultSharedWindow, watchsession.MaxSharedWindow))
	}
	if c.MaxWatchesPerUser < 0 {
		errs = append(errs, errors.New("max-watches-per-user must not be negative (0: no per-user bound)"))
	}
	if c.MaxBodyBytes < 0 {
		errs = append(errs, errors.New("max-request-body-bytes must not be negative"))
	}
	if c.WriteTimeout <= 0 {
		errs = append(errs, errors.New("write-timeout must be positive (it bounds clients that stop reading)"))
	}
	if c.ReadHeaderTime <= 0 {
		errs = append(errs, errors.New("read-header-timeout must be positive (it bounds slow clients)"))
	}
	errs = append(errs, c.FanoutTLS.Validate("fanout"), c.CacheTLS.Validate("cache"), c.Upstream.Validate(), c.Audit.Validate())
	if c.FanoutTLS.Enabled() {
		// The transport would send plaintext to an http:// URL: the
		// certificate unused, the identity headers readable on the wire.
		for _, a := range c.fanouts() {
			if !strings.HasPrefix(a, "https://") {
				errs = append(errs, fmt.Errorf("fanout.addrs: %s is not https:// but fanout.tls.* is set", a))
			}
		}
	}
	return errors.Join(errs...)
}

func (c *Config) fanouts() []string {
	var out []string
	for _, a := range service.SplitList(c.FanoutAddrs) {
		out = append(out, strings.TrimRight(a, "/"))
	}
	return out
}
