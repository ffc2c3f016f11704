package service

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"
)

// The option groups several services share. Each is embedded in the
// services' Config structs (so cfg.NATSURL and the like read as before) and
// registers its flags under fixed names: a flag means the same thing, with
// the same default, in every binary. Flag names and their HERALD_* variables
// are part of the deployment contract (integration/manifests checks them,
// docs/operations.md lists them): never rename one here.

// AdminConfig is the admin server's address (admin.addr).
type AdminConfig struct {
	AdminAddr string
}

// RegisterFlags registers admin.addr with the service's default; note is
// added to the help.
func (c *AdminConfig) RegisterFlags(fs *flag.FlagSet, def, note string) {
	fs.StringVar(&c.AdminAddr, "admin.addr", def, "Address of the admin server (/livez, /readyz, /metrics)."+note)
}

// AdminAddress is where the admin server listens.
func (c *AdminConfig) AdminAddress() string { return c.AdminAddr }

// EtcdConfig is how a service reaches etcd (etcd.*), with client TLS
// (etcd.tls.*: https:// endpoints, a client certificate for etcd's
// --client-cert-auth).
type EtcdConfig struct {
	EtcdEndpoints   string
	EtcdDialTimeout time.Duration
	EtcdTLS         ClientTLS
}

// RegisterFlagsWithPrefix registers prefix.endpoints, prefix.dial-timeout
// and prefix.tls.*; use says what the service reads from etcd (in the help,
// may be empty).
func (c *EtcdConfig) RegisterFlagsWithPrefix(prefix, use string, fs *flag.FlagSet) {
	fs.StringVar(&c.EtcdEndpoints, prefix+".endpoints", "http://127.0.0.1:2379", "Comma-separated etcd client URLs"+use+"; https:// with "+prefix+".tls.* for TLS.")
	fs.DurationVar(&c.EtcdDialTimeout, prefix+".dial-timeout", 5*time.Second, "Timeout for connecting to etcd.")
	c.EtcdTLS.RegisterFlagsWithPrefix(prefix, "etcd", fs)
}

// ValidateWithPrefix reports an empty endpoint list, incomplete TLS
// settings, and TLS settings with a plaintext endpoint: etcd's client talks
// plaintext to an http:// endpoint whatever its TLS configuration, so the
// certificate would be silently unused.
func (c *EtcdConfig) ValidateWithPrefix(prefix string) error {
	errs := []error{c.EtcdTLS.Validate(prefix)}
	if len(c.Endpoints()) == 0 {
		errs = append(errs, errors.New(prefix+".endpoints is empty"))
	}
	if c.EtcdTLS.Enabled() {
		for _, ep := range c.Endpoints() {
			if strings.HasPrefix(ep, "http://") || strings.HasPrefix(ep, "unix:") {
				errs = append(errs, fmt.Errorf("%s.endpoints: %s is plaintext but %s.tls.* is set; use https://", prefix, ep, prefix))
			}
		}
	}
	return errors.Join(errs...)
}

// Endpoints splits EtcdEndpoints.
func (c *EtcdConfig) Endpoints() []string { return SplitList(c.EtcdEndpoints) }

// JetStreamConfig is how a service reaches the JetStream stream of revisions
// (nats.url, stream.name), with TLS (nats.tls.*) and the service's own NATS
// user (nats.user, nats.password-file), whose permissions on the server say
// what it may do: ingest publish to the stream, a cache only read it.
type JetStreamConfig struct {
	NATSURL          string
	Stream           string
	NATSTLS          ClientTLS
	NATSUser         string
	NATSPasswordFile string
}

// RegisterFlags registers nats.url, stream.name, nats.tls.*, nats.user and
// nats.password-file.
func (c *JetStreamConfig) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.NATSURL, "nats.url", "nats://127.0.0.1:4222", "NATS server URL(s), comma-separated.")
	fs.StringVar(&c.Stream, "stream.name", "HERALD", "JetStream stream holding the event history.")
	c.NATSTLS.RegisterFlagsWithPrefix("nats", "NATS", fs)
	fs.StringVar(&c.NATSUser, "nats.user", "", "NATS user this service connects as (its permissions are the server's); empty: no credentials.")
	fs.StringVar(&c.NATSPasswordFile, "nats.password-file", "", "File holding nats.user's password; read again on every (re)connect, so a rotated password is used from the next reconnect.")
}

// Validate reports incomplete TLS settings and a user without a password
// (or the reverse).
func (c *JetStreamConfig) Validate() error {
	errs := []error{c.NATSTLS.Validate("nats")}
	if (c.NATSUser == "") != (c.NATSPasswordFile == "") {
		errs = append(errs, errors.New("nats.user and nats.password-file go together"))
	}
	return errors.Join(errs...)
}

// NATSSecurity is what the NATS connection needs beyond the URL: the TLS
// configuration (nil: plaintext, unless the server demands TLS) and the
// credentials callback (nil: none), for nats.Secure and
// nats.UserInfoHandler. The password file must be readable now (a
// configuration error otherwise); on a reconnect a file that cannot be read
// is logged and the last password read is used.
func (c *JetStreamConfig) NATSSecurity(log *slog.Logger) (*tls.Config, func() (string, string), error) {
	tc, err := c.NATSTLS.Config(log, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("nats.tls: %w", err)
	}
	if c.NATSUser == "" {
		return tc, nil, nil
	}
	last, err := readSecretFile(c.NATSPasswordFile)
	if err != nil {
		return nil, nil, fmt.Errorf("nats.password-file: %w", err)
	}
	var mu sync.Mutex
	return tc, func() (string, string) {
		mu.Lock()
		defer mu.Unlock()
		if pw, err := readSecretFile(c.NATSPasswordFile); err != nil {
			log.Warn("cannot read nats.password-file; using the last password read", "file", c.NATSPasswordFile, "err", err)
		} else {
			last = pw
		}
		return c.NATSUser, last
	}, nil
}

// readSecretFile reads a one-line secret (a trailing newline is not part of
// it); an empty one is an error.
func readSecretFile(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", fmt.Errorf("%s is empty", file)
	}
	return s, nil
}

// RegistryConfig is where the Kubernetes objects are in etcd and which
// resources Herald serves (prefix, resources-file): kube.LoadRegistry(
// ResourcesFile, Prefix) loads the registry. Only the flags live here, so
// that this package knows nothing of Kubernetes.
type RegistryConfig struct {
	Prefix        string
	ResourcesFile string
}

// RegisterFlags registers prefix (default kube-apiserver's, libs/kube's
// DefaultPrefix) and resources-file.
func (c *RegistryConfig) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Prefix, "prefix", "/registry", "etcd key prefix of the Kubernetes objects.")
	fs.StringVar(&c.ResourcesFile, "resources-file", "", "Resource registry file (JSON); empty for the built-in resources.")
}

// SourceConfig is where Herald's data comes from, for the two services
// that read it (ingest, the cache): etcd, the objects' place in it and
// their resources, and the JetStream stream of revisions.
type SourceConfig struct {
	EtcdConfig
	RegistryConfig
	JetStreamConfig
}

// RegisterFlags registers etcd.*, prefix, resources-file, nats.url and
// stream.name; etcdUse says what the service reads from etcd (in the help,
// may be empty).
func (c *SourceConfig) RegisterFlags(fs *flag.FlagSet, etcdUse string) {
	c.EtcdConfig.RegisterFlagsWithPrefix("etcd", etcdUse, fs)
	c.RegistryConfig.RegisterFlags(fs)
	c.JetStreamConfig.RegisterFlags(fs)
}

// Security is what connecting to etcd and NATS needs beyond the addresses:
// etcd's TLS configuration, NATS's, and NATS's credentials callback (each
// nil when not configured; see NATSSecurity).
func (c *SourceConfig) Security(log *slog.Logger) (etcdTLS, natsTLS *tls.Config, natsUser func() (string, string), err error) {
	if etcdTLS, err = c.EtcdTLS.Config(log, nil); err != nil {
		return nil, nil, nil, fmt.Errorf("etcd.tls: %w", err)
	}
	natsTLS, natsUser, err = c.NATSSecurity(log)
	return etcdTLS, natsTLS, natsUser, err
}

// Validate reports configuration errors.
func (c *SourceConfig) Validate() error {
	return errors.Join(c.EtcdConfig.ValidateWithPrefix("etcd"), c.JetStreamConfig.Validate())
}

// ShardsConfig is how a client finds the cache shards (cache.addr,
// cache.shards): the shard map, or every resource on one address.
type ShardsConfig struct {
	CacheAddr   string
	CacheShards string
}

// RegisterFlagsWithPrefix registers prefix.addr and prefix.shards; addrHelp
// is prefix.addr's help.
func (c *ShardsConfig) RegisterFlagsWithPrefix(prefix, addrHelp string, fs *flag.FlagSet) {
	fs.StringVar(&c.CacheAddr, prefix+".addr", "127.0.0.1:7100", addrHelp)
	fs.StringVar(&c.CacheShards, prefix+".shards", "", "Shard map: resource[/partitions]=target;...;*=target (see docs/operations.md). Empty: every resource on "+prefix+".addr.")
}

// ShardMap is the shard map in its textual form.
func (c *ShardsConfig) ShardMap() string {
	if c.CacheShards != "" {
		return c.CacheShards
	}
	return "*=" + c.CacheAddr
}

// SplitList splits a comma-separated flag value, dropping empty entries.
func SplitList(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}
