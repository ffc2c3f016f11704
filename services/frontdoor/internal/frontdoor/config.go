package frontdoor

import (
	"errors"
	"flag"
	"strings"
	"time"

	"herald.dev/libs/kube"
)

// Config is the whole configuration of a frontdoor replica.
type Config struct {
	Addr            string
	TLSCertFile     string
	TLSKeyFile      string
	TokenFile       string
	CacheAddr       string
	FanoutAddrs     string
	Prefix          string
	ResourcesFile   string
	AdminAddr       string
	RequestTimeout  time.Duration
	MaxHeaderBytes  int
	ReadHeaderTime  time.Duration
	GzipMinBytes    int
	MaxListResponse int
}

// RegisterFlags registers every flag of c on fs with its default.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Addr, "addr", "127.0.0.1:6443", "HTTPS address of the Kubernetes API.")
	fs.StringVar(&c.TLSCertFile, "tls.cert-file", "", "Serving certificate (PEM).")
	fs.StringVar(&c.TLSKeyFile, "tls.key-file", "", "Serving key (PEM).")
	fs.StringVar(&c.TokenFile, "token-auth-file", "", "Static bearer tokens, kube-apiserver's CSV format: token,user,uid,\"group1,group2\".")
	fs.StringVar(&c.CacheAddr, "cache.addr", "127.0.0.1:7100", "gRPC address of the cache (host:port, or dns:///name:port).")
	fs.StringVar(&c.FanoutAddrs, "fanout.addrs", "http://127.0.0.1:7200", "Comma-separated base URLs of fanout replicas.")
	fs.StringVar(&c.Prefix, "prefix", kube.DefaultPrefix, "etcd key prefix of the Kubernetes objects.")
	fs.StringVar(&c.ResourcesFile, "resources-file", "", "Resource registry file (JSON); empty for the built-in resources.")
	fs.StringVar(&c.AdminAddr, "admin.addr", "127.0.0.1:9300", "Address of the admin server (/livez, /readyz, /metrics).")
	fs.DurationVar(&c.RequestTimeout, "request-timeout", 60*time.Second, "Timeout of non-watch requests.")
	fs.IntVar(&c.MaxHeaderBytes, "max-header-bytes", 1<<20, "Largest request header block.")
	fs.DurationVar(&c.ReadHeaderTime, "read-header-timeout", 10*time.Second, "Time a client has to send its request headers.")
	fs.IntVar(&c.GzipMinBytes, "gzip-min-bytes", 128<<10, "Responses at least this large are gzipped when the client accepts it.")
	fs.IntVar(&c.MaxListResponse, "max-list-response-bytes", 2<<30, "Largest LIST response from the cache.")
}

// Validate reports configuration errors.
func (c *Config) Validate() error {
	var errs []error
	if c.TLSCertFile == "" || c.TLSKeyFile == "" {
		errs = append(errs, errors.New("tls.cert-file and tls.key-file are required"))
	}
	if c.TokenFile == "" {
		errs = append(errs, errors.New("token-auth-file is required (anonymous access is off)"))
	}
	if len(c.fanouts()) == 0 {
		errs = append(errs, errors.New("fanout.addrs is empty"))
	}
	return errors.Join(errs...)
}

func (c *Config) fanouts() []string {
	var out []string
	for _, a := range strings.Split(c.FanoutAddrs, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, strings.TrimRight(a, "/"))
		}
	}
	return out
}
