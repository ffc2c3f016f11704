// Package stack starts a whole Herald on one machine: embedded etcd and an
// embedded NATS JetStream server (real servers, from their Go modules, in
// this process), and every Herald service as its own OS process talking over
// real sockets. `make run` and the end-to-end tests use it.
package stack

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
)

// Options say what to start. Zero addresses pick free loopback ports.
type Options struct {
	// Dir holds all state (etcd and NATS data, certificates, tokens, logs).
	Dir string
	// BinDir holds the service binaries (see Build).
	BinDir string
	// Fixed addresses (make run); empty for free ports.
	EtcdAddr, NATSAddr, FrontdoorAddr string
	// Fixed internal ports (make run), in order: ingest admin, cache gRPC,
	// cache admin, fanout HTTP, fanout admin, frontdoor admin. Nil for free
	// ports. FrontdoorAddr and the fixed ports are the first replica's;
	// other replicas get free ports.
	InternalPorts []int
	Ingests       int // default 1
	Fanouts       int // default 1
	// Frontdoors (default 1): processes "frontdoor-<i>", each serving the
	// API on its own address and routing watches over every fanout.
	Frontdoors int
	// CacheShards lays out the caches; nil is one shard owning everything,
	// with one replica (process "cache-0"). Shard i's replica j is process
	// "cache-<i>-<j>".
	CacheShards []CacheShard
	// InternalTLS runs every internal hop (frontdoor and fanout to the
	// caches, frontdoor to fanout) over mutual TLS with the dev CA.
	InternalTLS bool
	// NATSConfigFile, when set, is a nats-server configuration whose TLS
	// and authorization (users, permissions) the embedded NATS enforces;
	// the stack still sets its address, store and limits, and runs no
	// cluster. Give ingest and the caches their nats.* flags in Flags.
	NATSConfigFile string
	// EtcdTLS serves etcd's clients over mutual TLS with the dev CA
	// (EtcdEndpoint is https://; ingest and the caches get etcd.tls.*).
	EtcdTLS bool
	// Extra flags per service name ("ingest", "cache", "fanout", "frontdoor").
	Flags map[string][]string
	// Logs receives the services' output; nil writes it to Dir/logs.
	Logs io.Writer
	// Cluster mode: an existing cluster's etcd instead of the embedded one.
	Cluster ClusterEtcd
	// Upstream puts frontdoor in front of a cluster's kube-apiserver
	// (upstream.go); empty Kubeconfig: frontdoor serves alone.
	Upstream Upstream
	// NoSysmonAwake runs the services with the Go runtime's default sysmon
	// instead of service.SysmonAwake (SysmonEnv), as the load benchmark
	// does to tell what the setting does (herald-load -godebug).
	NoSysmonAwake bool
}

// ClusterEtcd is the etcd of an existing cluster (kube-apiserver's
// --etcd-servers, --etcd-cafile, --etcd-certfile, --etcd-keyfile) and how
// its values are encrypted (kube-apiserver's
// --encryption-provider-config). With Endpoints set no etcd is started:
// ingest and the caches read the cluster's, which Herald never writes.
type ClusterEtcd struct {
	Endpoints                 string // comma-separated client URLs
	CAFile, CertFile, KeyFile string // client TLS; empty for plain http://
	EncryptionConfig          string // EncryptionConfiguration file, for the caches
}

// flags are the etcd flags of ingest and the caches.
func (c ClusterEtcd) flags(endpoint string) []string {
	out := []string{"--etcd.endpoints=" + endpoint}
	for _, f := range []struct{ flag, file string }{{"ca-file", c.CAFile}, {"cert-file", c.CertFile}, {"key-file", c.KeyFile}} {
		if f.file != "" {
			out = append(out, "--etcd.tls."+f.flag+"="+f.file)
		}
	}
	return out
}

// CacheShard is one cache shard: what it owns and how many replicas serve it.
type CacheShard struct {
	// Resources: comma-separated resource IDs; empty for every resource not
	// owned by another shard (the "*" entry of the shard map).
	Resources string
	// Partitions of those resources, e.g. "0-7"; empty for all.
	Partitions string
	Replicas   int
}

// Stack is a running Herald.
type Stack struct {
	opts Options
	// Etcd is the embedded etcd (nil in cluster mode).
	Etcd         *embed.Etcd
	EtcdEndpoint string
	NATS         *natsserver.Server
	NATSURL      string
	PKI          *PKI
	Token        string
	// TokenFile holds Token in kube-apiserver's --token-auth-file format.
	TokenFile string
	// FrontdoorURL is frontdoor-0's; FrontdoorURLs are every replica's, in
	// order (frontdoor-<i> serves FrontdoorURLs[i]).
	FrontdoorURL  string
	FrontdoorURLs []string
	Kubeconfig    string

	mu    sync.Mutex
	procs []*Proc
}

// Proc is one service process.
type Proc struct {
	Name  string
	Bin   string
	Args  []string
	Addrs map[string]string // role -> address
	Admin string

	stack *Stack
	mu    sync.Mutex
	cmd   *exec.Cmd
	done  chan struct{}
}

// Start brings the whole stack up and waits until every service is ready.
func Start(ctx context.Context, opts Options) (_ *Stack, err error) {
	if opts.Ingests == 0 {
		opts.Ingests = 1
	}
	if opts.Fanouts == 0 {
		opts.Fanouts = 1
	}
	if opts.Frontdoors == 0 {
		opts.Frontdoors = 1
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, err
	}
	s := &Stack{opts: opts}
	defer func() {
		if err != nil {
			s.Stop()
		}
	}()
	if s.PKI, err = EnsurePKI(filepath.Join(opts.Dir, "pki")); err != nil {
		return nil, err
	}
	if opts.Cluster.Endpoints != "" {
		s.EtcdEndpoint = opts.Cluster.Endpoints
	} else if err := s.startEtcd(); err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	if err := s.startNATS(); err != nil {
		return nil, fmt.Errorf("nats: %w", err)
	}
	tokenFile := filepath.Join(opts.Dir, "tokens.csv")
	if s.Token, err = ensureToken(tokenFile); err != nil {
		return nil, err
	}
	s.TokenFile = tokenFile

	port := portAllocator(opts.InternalPorts)
	ingestAdmin := port()
	cacheGRPC := port()
	cacheAdmin := port()
	var ingestAdmins []string
	for i := range opts.Ingests {
		if i == 0 {
			ingestAdmins = append(ingestAdmins, ingestAdmin)
		} else {
			ingestAdmins = append(ingestAdmins, freeAddr())
		}
	}
	fanoutHTTP, fanoutAdmin := port(), port()
	frontAdmin := port()
	front := opts.FrontdoorAddr
	if front == "" {
		front = freeAddr()
	}

	for i, admin := range ingestAdmins {
		s.add(&Proc{Name: fmt.Sprintf("ingest-%d", i), Bin: "ingest", Admin: admin, Args: append(append(opts.Cluster.flags(s.EtcdEndpoint),
			"--nats.url="+s.NATSURL, "--admin.addr="+admin, "--progress-interval=200ms", "--election.lease-ttl=2s",
		), opts.Flags["ingest"]...)})
	}
	shardMap := s.addCaches(cacheGRPC, cacheAdmin)
	var cacheTLS, fanoutServerTLS, frontTLS []string
	scheme := "http://"
	if opts.InternalTLS {
		// Each component presents its own certificate (PKI.Component), and
		// each port admits only the components that use it.
		p := s.PKI
		client := func(component, prefix string) []string {
			crt, key := p.Component(component)
			return []string{"--" + prefix + ".tls.cert-file=" + crt, "--" + prefix + ".tls.key-file=" + key, "--" + prefix + ".tls.ca-file=" + p.CAFile}
		}
		server := func(component, prefix string) []string {
			crt, key := p.Component(component)
			return []string{"--" + prefix + ".tls.cert-file=" + crt, "--" + prefix + ".tls.key-file=" + key, "--" + prefix + ".tls.client-ca-file=" + p.CAFile}
		}
		cacheTLS = append(server("herald-cache", "grpc"), "--grpc.tls.allowed-client-names=herald-fanout,herald-frontdoor")
		fanoutServerTLS = slices.Concat(server("herald-fanout", "http"), []string{"--http.tls.allowed-client-names=herald-frontdoor"}, client("herald-fanout", "cache"))
		frontTLS = append(client("herald-frontdoor", "cache"), client("herald-frontdoor", "fanout")...)
		scheme = "https://"
	}
	for _, p := range s.procs {
		if p.Bin == "cache" {
			p.Args = append(p.Args, cacheTLS...)
		}
		if opts.EtcdTLS && (p.Bin == "cache" || p.Bin == "ingest") {
			p.Args = append(p.Args, "--etcd.tls.ca-file="+s.PKI.CAFile, "--etcd.tls.cert-file="+s.PKI.ClientCertFile, "--etcd.tls.key-file="+s.PKI.ClientKeyFile)
		}
	}
	var fanoutURLs []string
	for i := range opts.Fanouts {
		httpAddr, admin := fanoutHTTP, fanoutAdmin
		if i > 0 {
			httpAddr, admin = freeAddr(), freeAddr()
		}
		fanoutURLs = append(fanoutURLs, scheme+httpAddr)
		s.add(&Proc{Name: fmt.Sprintf("fanout-%d", i), Bin: "fanout", Admin: admin, Addrs: map[string]string{"http": httpAddr}, Args: append([]string{
			"--cache.shards=" + shardMap, "--http.addr=" + httpAddr, "--admin.addr=" + admin,
		}, append(fanoutServerTLS, opts.Flags["fanout"]...)...)})
	}
	// Every frontdoor routes watches over every fanout (each balances its
	// own watches over them; see frontdoor's fanoutPool).
	for i := range opts.Frontdoors {
		addr, admin := front, frontAdmin
		if i > 0 {
			addr, admin = freeAddr(), freeAddr()
		}
		s.add(&Proc{Name: fmt.Sprintf("frontdoor-%d", i), Bin: "frontdoor", Admin: admin, Addrs: map[string]string{"https": addr}, Args: append(append([]string{
			"--addr=" + addr, "--admin.addr=" + admin, "--cache.shards=" + shardMap,
			"--fanout.addrs=" + strings.Join(fanoutURLs, ","), "--tls.cert-file=" + s.PKI.CertFile, "--tls.key-file=" + s.PKI.KeyFile,
		}, opts.Upstream.flags(tokenFile)...), append(frontTLS, opts.Flags["frontdoor"]...)...)})
		s.FrontdoorURLs = append(s.FrontdoorURLs, "https://"+addr)
	}
	s.FrontdoorURL = s.FrontdoorURLs[0]

	for _, p := range s.procs {
		if err := p.Start(); err != nil {
			return nil, err
		}
	}
	for _, p := range s.procs {
		if err := p.WaitReady(ctx, 60*time.Second); err != nil {
			return nil, err
		}
	}
	s.Kubeconfig = filepath.Join(opts.Dir, "kubeconfig")
	if opts.Upstream.Kubeconfig != "" {
		err = s.writeUpstreamKubeconfig()
	} else {
		err = os.WriteFile(s.Kubeconfig, s.kubeconfig(), 0o600)
	}
	if err != nil {
		return nil, err
	}
	if err := s.writeStackJSON(); err != nil {
		return nil, err
	}
	return s, nil
}

// addCaches adds the cache processes and returns the shard map naming them.
// Every cache gets the whole map and its own target, and owns exactly what
// the map routes to it.
func (s *Stack) addCaches(firstGRPC, firstAdmin string) string {
	shards := s.opts.CacheShards
	if len(shards) == 0 {
		shards = []CacheShard{{Replicas: 1}}
	}
	type proc struct {
		name, grpc, admin string
		shard             int
	}
	var procs []proc
	targets := make([]string, len(shards))
	var entries []string
	for i, sh := range shards {
		var addrs []string
		for j := range max(sh.Replicas, 1) {
			p := proc{name: fmt.Sprintf("cache-%d-%d", i, j), grpc: freeAddr(), admin: freeAddr(), shard: i}
			if i == 0 && j == 0 {
				p.grpc, p.admin = firstGRPC, firstAdmin
			}
			if len(s.opts.CacheShards) == 0 {
				p.name = "cache-0"
			}
			addrs = append(addrs, p.grpc)
			procs = append(procs, p)
		}
		targets[i] = "static:///" + strings.Join(addrs, ",")
		if sh.Resources == "" {
			entries = append(entries, "*="+targets[i])
			continue
		}
		for _, r := range strings.Split(sh.Resources, ",") {
			spec := r
			if sh.Partitions != "" {
				spec += "/" + sh.Partitions
			}
			entries = append(entries, spec+"="+targets[i])
		}
	}
	shardMap := strings.Join(entries, ";")
	etcd := s.opts.Cluster.flags(s.EtcdEndpoint)
	if s.opts.Cluster.EncryptionConfig != "" {
		etcd = append(etcd, "--encryption-config="+s.opts.Cluster.EncryptionConfig)
	}
	for _, p := range procs {
		s.add(&Proc{Name: p.name, Bin: "cache", Admin: p.admin, Addrs: map[string]string{"grpc": p.grpc}, Args: append(append(slices.Clone(etcd),
			"--nats.url="+s.NATSURL, "--grpc.addr="+p.grpc, "--admin.addr="+p.admin,
			"--cache.shards="+shardMap, "--shard.target="+targets[p.shard],
		), s.opts.Flags["cache"]...)})
	}
	return shardMap
}

func (s *Stack) add(p *Proc) {
	p.stack = s
	s.procs = append(s.procs, p)
}

// Proc returns the named process (e.g. "ingest-0").
func (s *Stack) Proc(name string) *Proc {
	for _, p := range s.procs {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// Procs lists the processes in start order.
func (s *Stack) Procs() []*Proc { return s.procs }

func (s *Stack) startEtcd() error {
	var tlsFiles *TLSFiles
	if s.opts.EtcdTLS {
		tlsFiles = &TLSFiles{Cert: s.PKI.InternalCertFile, Key: s.PKI.InternalKeyFile, CA: s.PKI.CAFile}
	}
	e, endpoint, err := StartEtcd(s.opts.Dir, s.opts.EtcdAddr, tlsFiles)
	if err != nil {
		return err
	}
	s.Etcd, s.EtcdEndpoint = e, endpoint
	return nil
}

// StartEtcd starts a one-member embedded etcd with its data in dir/etcd and
// its log in dir/etcd.log, serving clients on clientAddr (a free loopback
// port if empty), and returns it once it is ready, with its client URL.
// Tests that need etcd alone (the history checker's) start it this way too.
// With clientTLS, clients must use https and present a certificate signed by
// clientTLS.CA.
func StartEtcd(dir, clientAddr string, clientTLS *TLSFiles) (*embed.Etcd, string, error) {
	scheme := "http"
	if clientTLS != nil {
		scheme = "https"
	}
	cfg, cu := etcdConfig(dir, clientAddr, scheme)
	if clientTLS != nil {
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: clientTLS.Cert, KeyFile: clientTLS.Key,
			TrustedCAFile: clientTLS.CA, ClientCertAuth: true}
	}
	e, err := startEtcd(cfg)
	if err != nil {
		return nil, "", err
	}
	return e, cu.String(), nil
}

// StartClusterEtcd starts an etcd like a cluster's (its data in dir/etcd):
// clients need TLS and a client certificate from p's CA, as kube-apiserver's
// etcd does. It returns the settings of cluster mode that reach it (client
// certificate p's internal client one); tests add the EncryptionConfiguration.
func StartClusterEtcd(dir string, p *PKI) (*embed.Etcd, ClusterEtcd, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, ClusterEtcd{}, err
	}
	e, endpoint, err := StartEtcd(dir, "", &TLSFiles{Cert: p.InternalCertFile, Key: p.InternalKeyFile, CA: p.CAFile})
	if err != nil {
		return nil, ClusterEtcd{}, err
	}
	return e, ClusterEtcd{Endpoints: endpoint, CAFile: p.CAFile, CertFile: p.ClientCertFile, KeyFile: p.ClientKeyFile}, nil
}

// etcdConfig is a one-member etcd serving clients on clientAddr (a free
// loopback port if empty) with scheme.
func etcdConfig(dir, clientAddr, scheme string) (*embed.Config, *url.URL) {
	cfg := embed.NewConfig()
	cfg.Name = "herald-dev"
	cfg.Dir = filepath.Join(dir, "etcd")
	if clientAddr == "" {
		clientAddr = freeAddr()
	}
	peer := freeAddr()
	cu, _ := url.Parse(scheme + "://" + clientAddr)
	pu, _ := url.Parse("http://" + peer)
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{filepath.Join(dir, "etcd.log")}
	cfg.ListenMetricsUrls = nil
	return cfg, cu
}

// TLSFiles are the PEM files of a TLS endpoint that requires client
// certificates.
type TLSFiles struct{ Cert, Key, CA string }

// startEtcd starts etcd with cfg and waits until it is ready (it has a
// leader and serves clients), closing it if it is not ready in 30s.
func startEtcd(cfg *embed.Config) (*embed.Etcd, error) {
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, errors.New("etcd did not become ready in 30s")
	}
}

func (s *Stack) startNATS() error {
	ns, err := StartNATS(s.opts.Dir, s.opts.NATSAddr, s.opts.NATSConfigFile)
	if err != nil {
		return err
	}
	s.NATS, s.NATSURL = ns, ns.ClientURL()
	return nil
}

// StartNATS starts an embedded NATS server with JetStream, its store in
// dir/nats, listening on addr (a free loopback port if empty), and returns
// it once it accepts connections. Tests that need NATS alone (the history
// checker's) start it this way too. A configFile (nats-server's format) adds
// its TLS, accounts and permissions; its cluster settings are ignored.
func StartNATS(dir, addr, configFile string) (*natsserver.Server, error) {
	host, port := "127.0.0.1", -1
	if addr != "" {
		h, p, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		host = h
		port, _ = strconv.Atoi(p)
	}
	opts := &natsserver.Options{}
	if configFile != "" {
		if err := opts.ProcessConfigFile(configFile); err != nil {
			return nil, err
		}
		opts.Cluster, opts.Routes, opts.RoutesStr = natsserver.ClusterOpts{}, nil, ""
	}
	opts.ServerName, opts.Host, opts.Port, opts.HTTPPort = "herald-dev", host, port, 0
	opts.JetStream, opts.StoreDir, opts.MaxPayload = true, filepath.Join(dir, "nats"), 8<<20
	opts.NoSigs, opts.NoLog = true, true
	ns, err := natsserver.NewServer(opts)
	if err != nil {
		return nil, err
	}
	go ns.Start()
	if !ns.ReadyForConnections(30 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("nats did not become ready in 30s")
	}
	return ns, nil
}

// RestartNATS stops the NATS server and starts it again on the same port
// and store (JetStream state survives).
func (s *Stack) RestartNATS() error {
	s.NATS.Shutdown()
	s.NATS.WaitForShutdown()
	u, _ := url.Parse(s.NATSURL)
	s.opts.NATSAddr = u.Host
	return s.startNATS()
}

// RestartEtcd stops the embedded etcd and starts it again on the same
// addresses and data (a member outage).
func (s *Stack) RestartEtcd() error {
	if s.Etcd == nil {
		return errors.New("restart: etcd is external")
	}
	cfg := s.Etcd.Config()
	s.Etcd.Close()
	e, err := startEtcd(&cfg)
	if err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	s.Etcd = e
	return nil
}

// Stop stops every process (SIGTERM, then SIGKILL after 10s), NATS and etcd.
func (s *Stack) Stop() {
	var wg sync.WaitGroup
	for i := len(s.procs) - 1; i >= 0; i-- {
		p := s.procs[i]
		wg.Add(1)
		go func() { defer wg.Done(); p.Stop() }()
	}
	wg.Wait()
	if s.NATS != nil {
		s.NATS.Shutdown()
		s.NATS.WaitForShutdown()
	}
	if s.Etcd != nil {
		s.Etcd.Close()
	}
}

// Start launches the process.
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	cmd := exec.Command(filepath.Join(p.stack.opts.BinDir, p.Bin), p.Args...)
	// As the manifests run them: sysmon kept out of its deep sleep (unless
	// told otherwise).
	cmd.Env = SysmonEnv(os.Environ(), !p.stack.opts.NoSysmonAwake)
	out := p.stack.opts.Logs
	if out == nil {
		dir := filepath.Join(p.stack.opts.Dir, "logs")
		os.MkdirAll(dir, 0o755)
		f, err := os.OpenFile(filepath.Join(dir, p.Name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		out = f
	}
	cmd.Stdout, cmd.Stderr = out, out
	// Children die with the stack, even if it is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", p.Name, err)
	}
	p.cmd = cmd
	done := make(chan struct{})
	p.done = done
	go func() { cmd.Wait(); close(done) }()
	return nil
}

// Pid is the process id (0 when not running).
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Pause freezes the process (SIGSTOP), as a long GC pause or a partition
// would: it keeps its state but does nothing, not even lease keep-alives.
func (p *Proc) Pause() { p.sendOnly(syscall.SIGSTOP) }

// Resume unfreezes a paused process (SIGCONT).
func (p *Proc) Resume() { p.sendOnly(syscall.SIGCONT) }

func (p *Proc) sendOnly(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		p.cmd.Process.Signal(sig)
	}
}

// Kill kills the process with SIGKILL and waits for it to exit.
func (p *Proc) Kill() { p.signal(syscall.SIGKILL, 0) }

// Stop asks the process to stop (SIGTERM) and kills it after 10s.
func (p *Proc) Stop() { p.signal(syscall.SIGTERM, 10*time.Second) }

func (p *Proc) signal(sig syscall.Signal, grace time.Duration) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(sig)
	if grace > 0 {
		select {
		case <-done:
			return
		case <-time.After(grace):
			cmd.Process.Kill()
		}
	}
	<-done
}

// Restart stops the process (SIGKILL when kill) and starts it again with the
// same arguments.
func (p *Proc) Restart(kill bool) error {
	if kill {
		p.Kill()
	} else {
		p.Stop()
	}
	return p.Start()
}

// WaitReady polls the process's /readyz until it answers 200.
func (p *Proc) WaitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	client := &http.Client{Timeout: time.Second}
	for {
		p.mu.Lock()
		done := p.done
		p.mu.Unlock()
		select {
		case <-done:
			return fmt.Errorf("%s exited before becoming ready (see its log)", p.Name)
		default:
		}
		resp, err := client.Get("http://" + p.Admin + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s", p.Name, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TLSTransport trusts the dev CA and sends no credentials.
func (s *Stack) TLSTransport() *http.Transport {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(s.PKI.CAPEM)
	return &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 100}
}

// HTTPClient returns a client that trusts the dev CA and sends the admin
// token.
func (s *Stack) HTTPClient() *http.Client {
	return &http.Client{Transport: &tokenTransport{token: s.Token, base: s.TLSTransport()}}
}

type tokenTransport struct {
	token string
	base  http.RoundTripper
}

func (t *tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if r.Header.Get("Authorization") == "" {
		r.Header.Set("Authorization", "Bearer "+t.token)
	}
	return t.base.RoundTrip(r)
}

func (s *Stack) kubeconfig() []byte {
	return []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: herald
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: herald-admin
  user:
    token: %s
contexts:
- name: herald
  context:
    cluster: herald
    user: herald-admin
current-context: herald
`, s.FrontdoorURL, base64.StdEncoding.EncodeToString(s.PKI.CAPEM), s.Token))
}

func (s *Stack) writeStackJSON() error {
	type entry struct {
		Name      string            `json:"name"`
		PID       int               `json:"pid"`
		Addresses map[string]string `json:"addresses"`
	}
	self := os.Getpid()
	etcdPID := self
	if s.Etcd == nil {
		etcdPID = 0 // the cluster's etcd, not ours
	}
	out := []entry{
		{Name: "etcd", PID: etcdPID, Addresses: map[string]string{"client": s.EtcdEndpoint}},
		{Name: "nats", PID: self, Addresses: map[string]string{"client": s.NATSURL}},
	}
	for _, p := range s.procs {
		addrs := map[string]string{"admin": p.Admin}
		for k, v := range p.Addrs {
			addrs[k] = v
		}
		out = append(out, entry{Name: p.Name, PID: p.Pid(), Addresses: addrs})
	}
	b, _ := json.MarshalIndent(map[string]any{"processes": out, "kubeconfig": s.Kubeconfig}, "", "  ")
	return os.WriteFile(filepath.Join(s.opts.Dir, "stack.json"), append(b, '\n'), 0o644)
}

// ensureToken returns the admin token from the token file, creating both if
// missing.
func ensureToken(path string) (string, error) {
	if b, err := os.ReadFile(path); err == nil {
		if tok, _, ok := strings.Cut(strings.TrimSpace(string(b)), ","); ok && tok != "" {
			return tok, nil
		}
	}
	buf := make([]byte, 24)
	rand.Read(buf)
	tok := hex.EncodeToString(buf)
	line := tok + ",herald-admin,herald-admin,\"system:masters\"\n"
	return tok, os.WriteFile(path, []byte(line), 0o600)
}

// freeAddr returns a loopback address with a port that was free a moment
// ago. Ports come from below Linux's ephemeral range (32768-60999), so the
// many outgoing connections of a running stack cannot take one between
// this check and the service binding it; and no port is handed out twice
// by this process.
func freeAddr() string {
	portsMu.Lock()
	defer portsMu.Unlock()
	for {
		port := 20000 + mrand.IntN(12000)
		if portsGiven[port] {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		l.Close()
		portsGiven[port] = true
		return l.Addr().String()
	}
}

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

func portAllocator(fixed []int) func() string {
	i := 0
	return func() string {
		defer func() { i++ }()
		if i < len(fixed) {
			return "127.0.0.1:" + strconv.Itoa(fixed[i])
		}
		return freeAddr()
	}
}
