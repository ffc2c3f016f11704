package frontdoor

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"herald.dev/libs/kube"
)

// Config is the whole configuration of a frontdoor replica. Flags are named
// after kube-apiserver's where the meaning is the same.
type Config struct {
	Addr        string
	TLSCertFile string
	TLSKeyFile  string
	AdminAddr   string

	// Authentication.
	TokenFile        string
	ClientCAFile     string
	SAKeyFiles       string
	SAIssuers        string
	APIAudiences     string
	AnonymousAuth    bool
	ReloadInterval   time.Duration
	AuthorizationDir string

	// Backends.
	CacheAddr       string
	CacheShards     string
	FanoutAddrs     string
	FanoutTLS       ClientTLS
	CacheTLS        ClientTLS
	FanoutRetryDown time.Duration
	FanoutResolve   time.Duration

	Prefix        string
	ResourcesFile string

	// Limits.
	RequestTimeout        time.Duration
	MaxHeaderBytes        int
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
}

// ClientTLS is the client side of mutual TLS to an internal service. Empty
// files mean plaintext (the service is reached over loopback or a trusted
// network); the frontdoor still tells it who the user is in headers.
type ClientTLS struct {
	CertFile, KeyFile, CAFile, ServerName string
}

func (t *ClientTLS) register(fs *flag.FlagSet, prefix, what string) {
	fs.StringVar(&t.CertFile, prefix+".tls.cert-file", "", "Client certificate (PEM) presented to "+what+" (mutual TLS).")
	fs.StringVar(&t.KeyFile, prefix+".tls.key-file", "", "Key of "+prefix+".tls.cert-file.")
	fs.StringVar(&t.CAFile, prefix+".tls.ca-file", "", "CA bundle (PEM) that signed "+what+"'s serving certificate; set to use TLS.")
	fs.StringVar(&t.ServerName, prefix+".tls.server-name", "", "Name to verify in "+what+"'s certificate (default: the host dialled).")
}

// Enabled says whether TLS is configured.
func (t ClientTLS) Enabled() bool { return t.CAFile != "" || t.CertFile != "" }

func (t ClientTLS) validate(prefix string) error {
	if (t.CertFile == "") != (t.KeyFile == "") {
		return fmt.Errorf("%s.tls.cert-file and %s.tls.key-file go together", prefix, prefix)
	}
	if t.CertFile != "" && t.CAFile == "" {
		return fmt.Errorf("%s.tls.ca-file is required with %s.tls.cert-file", prefix, prefix)
	}
	return nil
}

// RegisterFlags registers every flag of c on fs with its default.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Addr, "addr", "127.0.0.1:6443", "HTTPS address of the Kubernetes API.")
	fs.StringVar(&c.TLSCertFile, "tls.cert-file", "", "Serving certificate (PEM); reloaded when it changes.")
	fs.StringVar(&c.TLSKeyFile, "tls.key-file", "", "Serving key (PEM); reloaded when it changes.")
	fs.StringVar(&c.AdminAddr, "admin.addr", "127.0.0.1:9300", "Address of the admin server (/livez, /readyz, /metrics). Internal: keep it off public networks.")

	fs.StringVar(&c.TokenFile, "token-auth-file", "", "Static bearer tokens, kube-apiserver's CSV format: token,user,uid,\"group1,group2\"; reloaded when it changes.")
	fs.StringVar(&c.ClientCAFile, "client-ca-file", "", "CA bundle (PEM) for x509 client certificates (CN is the user, O the groups); reloaded when it changes.")
	fs.StringVar(&c.SAKeyFiles, "service-account-key-file", "", "Comma-separated PEM files with the public keys (or certificates, or private keys) that verify service-account tokens.")
	fs.StringVar(&c.SAIssuers, "service-account-issuer", "https://kubernetes.default.svc.cluster.local", "Comma-separated accepted issuers (iss) of service-account tokens.")
	fs.StringVar(&c.APIAudiences, "api-audiences", "", "Comma-separated audiences a service-account token must name one of (default: the issuers).")
	fs.BoolVar(&c.AnonymousAuth, "anonymous-auth", false, "Serve requests without credentials as system:anonymous (group system:unauthenticated), subject to authorization.")
	fs.DurationVar(&c.ReloadInterval, "reload-interval", 2*time.Second, "How often the certificate, token, CA, key and RBAC files are checked for changes.")
	fs.StringVar(&c.AuthorizationDir, "authorization.rbac-dir", "", "Directory of RBAC manifests (YAML or JSON Role, ClusterRole, RoleBinding, ClusterRoleBinding, List); reloaded when it changes. Group system:masters is always allowed everything.")

	fs.StringVar(&c.CacheAddr, "cache.addr", "127.0.0.1:7100", "gRPC address of the cache (host:port, or dns:///name:port).")
	fs.StringVar(&c.CacheShards, "cache.shards", "", "Shard map: resource[/partitions]=target;...;*=target (see docs/operations.md). Empty: every resource on cache.addr.")
	fs.StringVar(&c.FanoutAddrs, "fanout.addrs", "http://127.0.0.1:7200", "Comma-separated base URLs of fanout replicas (https:// with fanout.tls.* for mutual TLS).")
	c.FanoutTLS.register(fs, "fanout", "fanout replicas")
	c.CacheTLS.register(fs, "cache", "the cache")
	fs.DurationVar(&c.FanoutRetryDown, "fanout.down-for", 2*time.Second, "How long a fanout replica that refused a connection is skipped.")
	fs.DurationVar(&c.FanoutResolve, "fanout.resolve-interval", 5*time.Second, "How often a fanout URL given by DNS name (e.g. a headless Service) is resolved again into its replicas.")
	fs.DurationVar(&c.FanoutDialTimeout, "fanout.dial-timeout", 2*time.Second, "Timeout to connect to a fanout replica before trying the next.")
	fs.DurationVar(&c.FanoutResponseTimeout, "fanout.response-timeout", 30*time.Second, "Time a fanout replica has to start answering a watch.")

	fs.StringVar(&c.Prefix, "prefix", kube.DefaultPrefix, "etcd key prefix of the Kubernetes objects.")
	fs.StringVar(&c.ResourcesFile, "resources-file", "", "Resource registry file (JSON); empty for the built-in resources.")

	fs.DurationVar(&c.RequestTimeout, "request-timeout", 60*time.Second, "Timeout of non-watch requests.")
	fs.IntVar(&c.MaxHeaderBytes, "max-header-bytes", 1<<20, "Largest request header block (431 beyond).")
	fs.Int64Var(&c.MaxBodyBytes, "max-request-body-bytes", 3<<20, "Largest request body (413 beyond); Herald's API reads none.")
	fs.DurationVar(&c.ReadHeaderTime, "read-header-timeout", 10*time.Second, "Time a client has to complete the TLS handshake and send its request headers (slowloris).")
	fs.DurationVar(&c.IdleTimeout, "idle-timeout", 90*time.Second, "How long an idle keep-alive connection is kept.")
	fs.IntVar(&c.MaxInflight, "max-requests-inflight", 400, "Non-watch requests served at once; more get 429 with Retry-After.")
	fs.IntVar(&c.MaxInflightPerUser, "max-requests-inflight-per-user", 100, "Non-watch requests one user may have in flight (fairness); more get 429.")
	fs.IntVar(&c.MaxWatches, "max-watches", 10000, "Watches open at once; more get 429 with Retry-After.")
	fs.IntVar(&c.MaxWatchesPerUser, "max-watches-per-user", 1000, "Watches one user may hold open (fairness); more get 429.")
	fs.IntVar(&c.HTTP2MaxStreams, "http2-max-streams-per-connection", 250, "Concurrent HTTP/2 streams per client connection.")
	fs.IntVar(&c.GzipMinBytes, "gzip-min-bytes", 128<<10, "Responses at least this large are gzipped when the client accepts it.")
	fs.IntVar(&c.MaxListResponse, "max-list-response-bytes", 2<<30, "Largest LIST response from the cache.")
	fs.DurationVar(&c.ShutdownGracePeriod, "shutdown-grace-period", 5*time.Second, "Time non-watch requests get to finish on SIGTERM (watches end at once; clients resume elsewhere).")
}

// Validate reports configuration errors.
// ShardMap is the shard map in its textual form.
func (c *Config) ShardMap() string {
	if c.CacheShards != "" {
		return c.CacheShards
	}
	return "*=" + c.CacheAddr
}

func (c *Config) Validate() error {
	var errs []error
	if c.TLSCertFile == "" || c.TLSKeyFile == "" {
		errs = append(errs, errors.New("tls.cert-file and tls.key-file are required"))
	}
	if c.TokenFile == "" && c.ClientCAFile == "" && c.SAKeyFiles == "" && !c.AnonymousAuth {
		errs = append(errs, errors.New("no authenticator: set token-auth-file, client-ca-file or service-account-key-file (anonymous access is off)"))
	}
	if c.SAKeyFiles != "" && len(splitList(c.SAIssuers)) == 0 {
		errs = append(errs, errors.New("service-account-issuer is required with service-account-key-file"))
	}
	if len(c.fanouts()) == 0 {
		errs = append(errs, errors.New("fanout.addrs is empty"))
	}
	if c.ReloadInterval <= 0 {
		errs = append(errs, errors.New("reload-interval must be positive"))
	}
	for name, n := range map[string]int{
		"max-requests-inflight": c.MaxInflight, "max-requests-inflight-per-user": c.MaxInflightPerUser,
		"max-watches": c.MaxWatches, "max-watches-per-user": c.MaxWatchesPerUser,
		"max-header-bytes": c.MaxHeaderBytes, "http2-max-streams-per-connection": c.HTTP2MaxStreams,
	} {
		if n <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive", name))
		}
	}
	if c.MaxBodyBytes < 0 {
		errs = append(errs, errors.New("max-request-body-bytes must not be negative"))
	}
	if c.ReadHeaderTime <= 0 {
		errs = append(errs, errors.New("read-header-timeout must be positive (it bounds slow clients)"))
	}
	errs = append(errs, c.FanoutTLS.validate("fanout"), c.CacheTLS.validate("cache"))
	return errors.Join(errs...)
}

func (c *Config) fanouts() []string {
	var out []string
	for _, a := range splitList(c.FanoutAddrs) {
		out = append(out, strings.TrimRight(a, "/"))
	}
	return out
}

// splitList splits a comma-separated flag value, dropping empty entries.
func splitList(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}
