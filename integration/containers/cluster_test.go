package containers

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tcnetwork "github.com/testcontainers/testcontainers-go/network"
	"github.com/testcontainers/testcontainers-go/wait"
	clientv3 "go.etcd.io/etcd/client/v3"

	"herald.dev/integration/stack"
	"herald.dev/libs/kube"
)

// Admin (or health) ports the suite reaches from the host, per group.
const (
	etcdClient  = "2379/tcp"
	etcdMetrics = "2381/tcp"
	natsMonitor = "8222/tcp"
	ingestAdmin = "9090/tcp"
	cacheAdmin  = "9100/tcp"
	fanoutAdmin = "9200/tcp"
	frontHTTPS  = "6443/tcp"
	frontAdmin  = "9300/tcp"
)

// node is one container: its own alias (name) and its group's shared alias,
// which is how replicas are found (DNS round robin, like a Service).
type node struct {
	name, group string
	health      string // container port of the readiness endpoint
	ctr         *testcontainers.DockerContainer
}

// cluster is one running Herald in containers.
type cluster struct {
	id     string
	images string // "<repo>/%s:<tag>"
	net    *testcontainers.DockerNetwork
	docker *testcontainers.DockerClient
	pki    *stack.PKI
	token  string
	dir    string
	etcd   *clientv3.Client

	shards   []cacheShard // the cache shards, each two replicas
	shardMap string       // --cache.shards of fanout and frontdoor

	mu    sync.Mutex
	nodes map[string]*node
}

// requireDocker skips (or, under CI=true, fails) without a Docker engine,
// and fails when the images of `make images` are missing.
func requireDocker(t *testing.T, images string) *testcontainers.DockerClient {
	t.Helper()
	if os.Getenv("TESTCONTAINERS_RYUK_DISABLED") == "" {
		t.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true") // no registry here: Ryuk's image cannot be pulled
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dc, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err == nil {
		_, err = dc.Ping(ctx, client.PingOptions{})
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and no Docker engine: %v", err)
		}
		t.Skipf("SKIP: no Docker engine (%v); the container suite needs one", err)
	}
	t.Cleanup(func() { dc.Close() })
	for _, name := range []string{"etcd", "nats-server", "ingest", "cache", "fanout", "frontdoor"} {
		if _, err := dc.ImageInspect(ctx, fmt.Sprintf(images, name)); err != nil {
			t.Fatalf("image %s is missing: run `make images` (or `make e2e`): %v", fmt.Sprintf(images, name), err)
		}
	}
	return dc
}

// imagePattern is "<repo>/%s:<tag>" from HERALD_IMAGE_REPO and
// HERALD_IMAGE_TAG (set by make e2e; defaults match make images).
func imagePattern() string {
	repo, tag := os.Getenv("HERALD_IMAGE_REPO"), os.Getenv("HERALD_IMAGE_TAG")
	if repo == "" {
		repo = "herald"
	}
	if tag == "" {
		tag = "dev"
	}
	return repo + "/%s:" + tag
}

// startCluster starts the whole topology and waits until every container
// is ready.
func startCluster(t *testing.T) *cluster {
	t.Helper()
	images := imagePattern()
	c := &cluster{images: images, docker: requireDocker(t, images), nodes: map[string]*node{}, dir: t.TempDir()}
	var err error
	if c.shards, c.shardMap, err = cacheLayout(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	rand.Read(buf)
	c.id = hex.EncodeToString(buf)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	c.net, err = tcnetwork.New(ctx)
	if err != nil {
		t.Fatalf("network: %v", err)
	}
	t.Cleanup(func() { c.net.Remove(context.Background()) })
	if c.pki, err = stack.EnsurePKI(filepath.Join(c.dir, "pki")); err != nil {
		t.Fatal(err)
	}
	c.token = hex.EncodeToString(append(buf, buf...))

	// Stores first: members of each cluster start together (each waits for
	// quorum), then the services in the order of the data path.
	c.startAll(t, ctx, c.etcdSpec(0), c.etcdSpec(1), c.etcdSpec(2), c.natsSpec(0), c.natsSpec(1), c.natsSpec(2))
	c.etcd, err = clientv3.New(clientv3.Config{Endpoints: c.etcdEndpoints(ctx), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.etcd.Close() })
	c.startAll(t, ctx, c.ingestSpec(0), c.ingestSpec(1))
	var caches []spec
	for _, sh := range c.shards {
		caches = append(caches, c.cacheSpec(sh, 0), c.cacheSpec(sh, 1))
	}
	c.startAll(t, ctx, caches...)
	c.startAll(t, ctx, c.fanoutSpec(0), c.fanoutSpec(1), c.fanoutSpec(2))
	c.startAll(t, ctx, c.frontdoorSpec(0), c.frontdoorSpec(1))
	return c
}

// spec is what a node is started from.
type spec struct {
	name, group, image string
	args               []string
	ports              []string // container ports published on 127.0.0.1
	health, path       string   // readiness endpoint
	files              []testcontainers.ContainerFile
	binds              []string // host directories mounted (host:container)
}

func (c *cluster) etcdSpec(i int) spec {
	name := fmt.Sprintf("etcd-%d", i)
	return spec{name: name, group: "etcd", image: "etcd", ports: []string{etcdClient, etcdMetrics}, health: etcdMetrics, path: "/readyz",
		args: []string{
			"--name=" + name, "--data-dir=/var/lib/etcd/data",
			"--listen-client-urls=http://0.0.0.0:2379", "--advertise-client-urls=http://" + name + ":2379",
			"--listen-peer-urls=http://0.0.0.0:2380", "--initial-advertise-peer-urls=http://" + name + ":2380",
			"--listen-metrics-urls=http://0.0.0.0:2381",
			"--initial-cluster=etcd-0=http://etcd-0:2380,etcd-1=http://etcd-1:2380,etcd-2=http://etcd-2:2380",
			"--initial-cluster-state=new", "--initial-cluster-token=herald-e2e", "--log-level=warn",
		}}
}

func (c *cluster) natsSpec(i int) spec {
	name := fmt.Sprintf("nats-%d", i)
	return spec{name: name, group: "nats", image: "nats-server", ports: []string{natsMonitor}, health: natsMonitor, path: "/healthz",
		args: []string{
			"--name=" + name, "--jetstream", "--store_dir=/var/lib/nats", "--port=4222", "--http_port=8222",
			"--cluster_name=herald", "--cluster=nats://0.0.0.0:6222",
			"--routes=nats://nats-0:6222,nats://nats-1:6222,nats://nats-2:6222",
		}}
}

const (
	etcdEndpoints = "--etcd.endpoints=http://etcd-0:2379,http://etcd-1:2379,http://etcd-2:2379"
	natsURLs      = "--nats.url=nats://nats-0:4222,nats://nats-1:4222,nats://nats-2:4222"
)

func (c *cluster) ingestSpec(i int) spec {
	return spec{name: fmt.Sprintf("ingest-%d", i), group: "ingest", image: "ingest", ports: []string{ingestAdmin}, health: ingestAdmin, path: "/readyz",
		args: []string{etcdEndpoints, natsURLs, "--stream.replicas=3", "--admin.addr=:9090", "--election.lease-ttl=2s", "--progress-interval=200ms"}}
}

// cacheShard is one cache shard: what it owns, and the network alias its
// replicas share (the shard's gRPC target, like a headless Service).
type cacheShard struct {
	alias      string // "cache-a": replicas are cache-a-0, cache-a-1
	resources  string // --shard.resources ("" for every resource)
	partitions string // --shard.partitions
}

// cacheLayout is the 2x2 cache: two shards of two replicas. A cache owns
// the same partitions of every resource it owns, and neither frontdoor's
// merged LISTs nor fanout's merged watches drop objects outside a shard's
// partitions, so a shard must own exactly what the shard map routes to it
// (owning more would duplicate objects, not only waste memory). Hence:
//
//   - cache-a: partitions 0-7 of every resource. Cluster-scoped objects
//     (namespace "") hash to partition kube.Partition(""), which must be in
//     0-7, so nodes and namespaces live on cache-a whole.
//   - cache-b: partitions 8-15 of every namespaced resource.
//
// The shard map names both halves of each namespaced resource and sends the
// cluster-scoped ones ("*") to cache-a. It is validated with the parser the
// services use.
func cacheLayout() ([]cacheShard, string, error) {
	const lo, hi = "0-7", "8-15"
	reg, err := kube.NewRegistry(kube.DefaultPrefix, kube.DefaultResources())
	if err != nil {
		return nil, "", err
	}
	if p := kube.Partition(""); p > 7 {
		return nil, "", fmt.Errorf("cluster-scoped objects hash to partition %d, outside cache-a's %s", p, lo)
	}
	a, b := "dns:///cache-a:7100", "dns:///cache-b:7100"
	var namespaced, entries []string
	for _, r := range reg.Resources() {
		if r.Namespaced {
			namespaced = append(namespaced, r.ID())
			entries = append(entries, r.ID()+"/"+lo+"="+a, r.ID()+"/"+hi+"="+b)
		}
	}
	entries = append(entries, "*="+a)
	shardMap := strings.Join(entries, ";")
	if _, err := kube.ParseShardMap(shardMap, reg); err != nil {
		return nil, "", err
	}
	return []cacheShard{
		{alias: "cache-a", partitions: lo},
		{alias: "cache-b", resources: strings.Join(namespaced, ","), partitions: hi},
	}, shardMap, nil
}

// cacheSpec is replica i of a cache shard; the shard's replicas share its
// alias (group), which fanout and frontdoor resolve with dns:///.
func (c *cluster) cacheSpec(sh cacheShard, i int) spec {
	return spec{name: fmt.Sprintf("%s-%d", sh.alias, i), group: sh.alias, image: "cache", ports: []string{cacheAdmin}, health: cacheAdmin, path: "/readyz",
		args: []string{etcdEndpoints, natsURLs, "--grpc.addr=:7100", "--admin.addr=:9100", "--default-watch-cache-size=20000",
			"--shard.resources=" + sh.resources, "--shard.partitions=" + sh.partitions}}
}

// fanoutSpec: bookmarks every second, so a client notices a silent stream
// (a partitioned replica) quickly.
func (c *cluster) fanoutSpec(i int) spec {
	return spec{name: fmt.Sprintf("fanout-%d", i), group: "fanout", image: "fanout", ports: []string{fanoutAdmin}, health: fanoutAdmin, path: "/readyz",
		args: []string{"--cache.shards=" + c.shardMap, "--http.addr=:7200", "--admin.addr=:9200", "--bookmark-interval=1s", "--ring-size=20000"}}
}

// frontdoorSpec: watches are rebalanced over the fanout replicas every
// second (see scaleFanout).
func (c *cluster) frontdoorSpec(i int) spec {
	cert, _ := os.ReadFile(c.pki.CertFile)
	key, _ := os.ReadFile(c.pki.KeyFile)
	tokens := c.token + ",herald-admin,herald-admin,\"system:masters\"\n" + fleetTokens(c.token)
	files := []testcontainers.ContainerFile{
		{Reader: strings.NewReader(string(cert)), ContainerFilePath: "/etc/herald/tls/tls.crt", FileMode: 0o644},
		{Reader: strings.NewReader(string(key)), ContainerFilePath: "/etc/herald/tls/tls.key", FileMode: 0o644},
		{Reader: strings.NewReader(tokens), ContainerFilePath: "/etc/herald/auth/tokens.csv", FileMode: 0o644},
	}
	return spec{name: fmt.Sprintf("frontdoor-%d", i), group: "frontdoor", image: "frontdoor", ports: []string{frontHTTPS, frontAdmin}, health: frontAdmin, path: "/readyz", files: files,
		args: []string{
			"--addr=:6443", "--admin.addr=:9300", "--cache.shards=" + c.shardMap, "--fanout.addrs=http://fanout:7200", "--fanout.rebalance-interval=1s",
			"--tls.cert-file=/etc/herald/tls/tls.crt", "--tls.key-file=/etc/herald/tls/tls.key", "--token-auth-file=/etc/herald/auth/tokens.csv",
		}}
}

// startAll starts nodes concurrently and fails the test if any does not
// become ready.
func (c *cluster) startAll(t *testing.T, ctx context.Context, specs ...spec) {
	t.Helper()
	errs := make(chan error, len(specs))
	for _, s := range specs {
		go func() { errs <- c.start(t, ctx, s) }()
	}
	for range specs {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

func (c *cluster) start(t *testing.T, ctx context.Context, s spec) error {
	loopback := netip.MustParseAddr("127.0.0.1")
	req := testcontainers.ContainerRequest{
		Name:           "herald-e2e-" + c.id + "-" + s.name,
		Image:          fmt.Sprintf(c.images, s.image),
		Cmd:            s.args,
		ExposedPorts:   s.ports,
		Networks:       []string{c.net.Name},
		NetworkAliases: map[string][]string{c.net.Name: {s.name, s.group}},
		Files:          s.files,
		Labels:         map[string]string{"dev.herald.e2e": c.id},
		HostConfigModifier: func(hc *container.HostConfig) {
			hc.PortBindings = network.PortMap{}
			for _, p := range s.ports {
				hc.PortBindings[network.MustParsePort(p)] = []network.PortBinding{{HostIP: loopback}}
			}
			hc.Binds = append(hc.Binds, s.binds...)
		},
		WaitingFor: readyStrategy{port: s.health, path: s.path, timeout: 2 * time.Minute},
	}
	ctr, err := testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{ContainerRequest: req, Started: true})
	dc, _ := ctr.(*testcontainers.DockerContainer)
	if dc != nil {
		n := &node{name: s.name, group: s.group, health: s.health, ctr: dc}
		c.mu.Lock()
		c.nodes[s.name] = n
		c.mu.Unlock()
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("== %s (last lines)\n%s", s.name, n.logTail(40))
			}
			testcontainers.TerminateContainer(dc)
		})
	}
	if err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	return nil
}

// node returns a started node by name.
func (c *cluster) node(t *testing.T, name string) *node {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[name]
	if n == nil {
		t.Fatalf("no node %s", name)
	}
	return n
}

// group returns the nodes of a group, by name.
func (c *cluster) group(group string) []*node {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*node
	for i := 0; i < 16; i++ {
		if n := c.nodes[fmt.Sprintf("%s-%d", group, i)]; n != nil {
			out = append(out, n)
		}
	}
	return out
}

// forget drops a node that was terminated on purpose (scale down).
func (c *cluster) forget(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.nodes, name)
}

// addr is the host address (127.0.0.1:port) a container port is published
// on right now; it changes when the container restarts.
func (n *node) addr(ctx context.Context, port string) (string, error) {
	p, err := n.ctr.MappedPort(ctx, port)
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + p.Port(), nil
}

func (c *cluster) etcdEndpoints(ctx context.Context) []string {
	var out []string
	for _, n := range c.group("etcd") {
		if a, err := n.addr(ctx, etcdClient); err == nil {
			out = append(out, "http://"+a)
		}
	}
	return out
}

// kill sends SIGKILL: no graceful shutdown.
func (c *cluster) kill(t *testing.T, ctx context.Context, n *node) {
	t.Helper()
	t.Logf("kill %s", n.name)
	if _, err := c.docker.ContainerKill(ctx, n.ctr.GetContainerID(), client.ContainerKillOptions{Signal: "KILL"}); err != nil {
		t.Fatalf("kill %s: %v", n.name, err)
	}
}

// stop stops a node gracefully (SIGTERM, SIGKILL after 10s).
func (c *cluster) stop(t *testing.T, ctx context.Context, n *node) {
	t.Helper()
	t.Logf("stop %s", n.name)
	grace := 10 * time.Second
	if err := n.ctr.Stop(ctx, &grace); err != nil {
		t.Fatalf("stop %s: %v", n.name, err)
	}
}

// restart starts a stopped or killed node and waits until it is ready
// (Start runs the container's readiness strategy again).
func (c *cluster) restart(t *testing.T, ctx context.Context, n *node) {
	t.Helper()
	t.Logf("start %s", n.name)
	if err := n.ctr.Start(ctx); err != nil {
		t.Fatalf("start %s: %v", n.name, err)
	}
	if n.group == "etcd" {
		c.etcd.SetEndpoints(c.etcdEndpoints(ctx)...)
	}
}

// disconnect cuts a node off the network (every peer, every client).
func (c *cluster) disconnect(t *testing.T, ctx context.Context, n *node) {
	t.Helper()
	t.Logf("partition %s", n.name)
	if _, err := c.docker.NetworkDisconnect(ctx, c.net.ID, client.NetworkDisconnectOptions{Container: n.ctr.GetContainerID(), Force: true}); err != nil {
		t.Fatalf("disconnect %s: %v", n.name, err)
	}
}

// connect heals a partition, with the node's aliases.
func (c *cluster) connect(t *testing.T, ctx context.Context, n *node) {
	t.Helper()
	t.Logf("heal %s", n.name)
	if _, err := c.docker.NetworkConnect(ctx, c.net.ID, client.NetworkConnectOptions{
		Container: n.ctr.GetContainerID(), EndpointConfig: &network.EndpointSettings{Aliases: []string{n.name, n.group}},
	}); err != nil {
		t.Fatalf("connect %s: %v", n.name, err)
	}
}

// metric sums the samples of one metric on a node's admin port.
func (n *node) metric(ctx context.Context, name string) (float64, error) {
	return n.metricWhere(ctx, name)
}

// metricWhere sums the samples of one metric whose labels contain every
// one of labels (`verb="list"`).
func (n *node) metricWhere(ctx context.Context, name string, labels ...string) (float64, error) {
	a, err := n.addr(ctx, n.health)
	if err != nil {
		return 0, err
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+a+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if (strings.HasPrefix(line, name+" ") || strings.HasPrefix(line, name+"{")) && containsAll(line, labels) {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			sum += v
		}
	}
	return sum, sc.Err()
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// ready reports whether a node's readiness endpoint answers 200.
func (n *node) ready(ctx context.Context) bool {
	a, err := n.addr(ctx, n.health)
	if err != nil {
		return false
	}
	return get200(ctx, "http://"+a+"/readyz") == nil
}

func (n *node) logTail(lines int) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rc, err := n.ctr.Logs(ctx)
	if err != nil {
		return err.Error()
	}
	defer rc.Close()
	b, _ := io.ReadAll(rc)
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// httpClient trusts the test CA and sends the admin token.
func (c *cluster) httpClient() *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.pki.CAPEM)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 16}
	return &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+c.token)
		return tr.RoundTrip(r)
	})}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// frontdoorURL is the base URL of frontdoor i right now.
func (c *cluster) frontdoorURL(ctx context.Context, i int) (string, error) {
	fds := c.group("frontdoor")
	if len(fds) == 0 {
		return "", fmt.Errorf("no frontdoor")
	}
	a, err := fds[i%len(fds)].addr(ctx, frontHTTPS)
	if err != nil {
		return "", err
	}
	return "https://" + a, nil
}

// waitFor polls cond every 100ms until it holds or the timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		<-tick.C
	}
}

// readyStrategy waits until GET path on the container port, published on
// 127.0.0.1, answers 200. (The engine's own host detection is not used:
// ports are published on loopback only.)
type readyStrategy struct {
	port, path string
	timeout    time.Duration
}

var _ wait.Strategy = readyStrategy{}

func (r readyStrategy) WaitUntilReady(ctx context.Context, target wait.StrategyTarget) error {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		if p, err := target.MappedPort(ctx, r.port); err != nil {
			last = err
		} else if last = get200(ctx, "http://127.0.0.1:"+p.Port()+r.path); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("GET %s on %s: %w (last: %v)", r.path, r.port, ctx.Err(), last)
		case <-tick.C:
		}
	}
}

func get200(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}
