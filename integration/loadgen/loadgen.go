// Package loadgen is Herald's load generator: it opens many watch streams
// against a Kubernetes-style API (Herald's frontdoor or kube-apiserver),
// writes pods into etcd at a fixed rate, and measures what the watchers
// receive: delivery latency, deliveries per second, missing and duplicated
// events, the CPU of the serving processes per 1,000 deliveries, and memory
// per idle watcher.
//
// Watchers model a fleet of separate processes (kubelets, kube-proxies,
// controllers): by default each has its own connection (HTTP/1.1, or one
// HTTP/2 connection of its own), so no watcher shares a connection's flow
// control, buffers or TLS records with another. Multiplexing many watchers
// on one HTTP/2 connection is an extra, labelled workload (Workload.Mux),
// with the same number of streams per connection on every system.
//
// The client is kept cheap so that it does not starve the servers it shares
// the machine with: an event is never decoded as JSON; only its type,
// metadata.resourceVersion and the write time the writer embedded in an
// annotation are picked out of the line. Where the machine has the cores
// for it, the client also runs on CPUs of its own, away from every server
// process (CPUPlan).
//
// Latency is the receive time minus the time taken just before the etcd Put,
// so it includes etcd's commit. Every watcher starts at one known revision
// and is checked afterwards against the writer's own record of which
// revisions it should have seen.
package loadgen

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"herald.dev/libs/service"
)

// WrittenAtAnnotation holds the write time (Unix nanoseconds) of every pod
// the writer puts.
const WrittenAtAnnotation = "herald.dev/written-at"

// Workload is one load shape.
type Workload struct {
	Name string
	// Watchers is how many watch streams are open.
	Watchers int
	// Kubelet makes watcher i watch only the pods of one node
	// (spec.nodeName: node-<i> when there are as many watchers as nodes,
	// spread over the nodes otherwise), one user per node as kubelets are;
	// otherwise every watcher watches every pod cluster-wide (broadcast).
	Kubelet bool
	// OneUser gives every watcher the same user (a DaemonSet's pods share
	// its ServiceAccount) instead of one per node or 10 in all.
	OneUser bool
	// WritesPerSec into etcd, for Duration.
	WritesPerSec int
	Duration     time.Duration
	// Warmup writes at the same rate before the measured Duration; their
	// events are not counted.
	Warmup time.Duration
	// Settle writes at the same rate before the watchers open, so that
	// servers whose buffers grow with the write history see their steady
	// state: kube-apiserver's watch cache starts at 100 events and doubles
	// while it holds less than about 75 s of events, and sizes each new
	// watcher's buffer from it (about a second's worth, at least 10).
	Settle time.Duration
	// Mux, when > 0, multiplexes Mux watchers on each HTTP/2 connection;
	// 0 gives every watcher its own connection (Proto).
	Mux int
	// Proto of a watcher's own connection: "http1" (default) or "http2".
	Proto string
	// Protobuf: the pods are stored as kube-apiserver stores them by
	// default (protobuf, Pods.Protobuf), kube-apiserver runs with its
	// default protobuf storage, and the watchers ask for
	// application/vnd.kubernetes.protobuf, as kubelets do. Otherwise
	// everything is JSON.
	Protobuf bool
	// Replicas, when > 1, is how many fanout and how many frontdoor
	// processes Herald runs (the watchers spread round-robin over the
	// frontdoors, Target.BaseURLs); kube-apiserver stays one process
	// unless KubeReplicas says otherwise.
	Replicas int
	// Fleet is the shape of a fleet of clients deployed with one
	// credential: every watcher presents the same bearer token, of
	// FleetUser in FleetGroup, outside system:masters, so that each
	// system's RBAC authorizer decides it by FleetRBAC's grant
	// (kube-apiserver runs with --authorization-mode=RBAC, Herald's
	// frontdoor with FleetPolicy). And the writes follow the opening: the
	// warm-up starts as soon as the last watcher opened, with no memory
	// per idle watcher or idle CPU measured in between (their pauses and
	// forced GCs would stand between the opening and the writes).
	Fleet bool
	ScaleOutWorkload
}

// Encoding names the workload's storage and wire encoding, for reports.
func (w Workload) Encoding() string {
	if w.Protobuf {
		return "protobuf"
	}
	return "JSON"
}

// Connections describes how the workload's watchers connect, for reports.
func (w Workload) Connections() string {
	if w.Mux > 0 {
		return fmt.Sprintf("HTTP/2, %d watchers multiplexed per connection", w.Mux)
	}
	if w.Proto == "http2" {
		return "one HTTP/2 connection per watcher"
	}
	return "one HTTP/1.1 connection per watcher"
}

// Target is a system under test.
type Target struct {
	Name string
	// BaseURL serves the lists and metrics; watcher i watches through
	// BaseURLs[i mod len(BaseURLs)] (its resumes too), or BaseURL when
	// BaseURLs is empty.
	BaseURL  string
	BaseURLs []string
	CAFile   string
	// Token returns the bearer token watcher i uses.
	Token func(i int) string
	// AdminToken reads metrics and lists.
	AdminToken string
	// CPU lists the processes whose CPU is the target's: every server
	// process, etcd included.
	CPU []NamedPid
	// Mem lists the processes whose memory per watcher is measured, with a
	// function that returns their Go heap in use after a forced GC.
	Mem []MemProc
	// Profile, if set, is called when the writes start with the window's
	// length and runs in the background (CPU profiles).
	Profile func(ctx context.Context, d time.Duration)
	// OpenWatches, if set, returns how many client watches the target still
	// serves; a run waits for 0 before measuring memory.
	OpenWatches func(ctx context.Context) (float64, error)
	// IdleProfile, if set, is called with every watcher open and idle
	// (heap profiles).
	IdleProfile func(ctx context.Context)
	// Stages are the target's own latency histograms, in pipeline order,
	// read over the measured writes (optional).
	Stages []Stage
	// Terminated, if set, returns the target's count of watches it closed
	// on its own (apiserver_terminated_watchers_total: a watcher too slow
	// for its buffer), summed over its processes.
	Terminated func(ctx context.Context) (float64, error)
	// Hops, if set, receives the spans of every event (Herald's processes
	// export them to it): the run reports each hop's share of the
	// measured events' latency.
	Hops *HopTracer
	// History, if set, returns the size of the target's event history for
	// pods (kube-apiserver: watch_cache_capacity), read when the
	// watchers open.
	History func(ctx context.Context) (float64, error)
	// EtcdMetrics: the base URLs of the etcd members whose /metrics count
	// the target's watch streams and watchers on etcd (optional).
	EtcdMetrics []string
}

// NamedPid is a process to account CPU for.
type NamedPid struct {
	Name string
	Pid  int
}

// MemProc is a process to measure memory per watcher in.
type MemProc struct {
	Name string
	Pid  int
	Heap func(ctx context.Context) (uint64, error)
	// Watchers, if set, returns how many of the watches this process holds
	// (one of several replicas holds a share); its growth is divided by
	// that instead of by every open watcher.
	Watchers func(ctx context.Context) (float64, error)
}

// watchURL is the base URL watcher i watches through.
func (t *Target) watchURL(i int) string {
	if len(t.BaseURLs) == 0 {
		return t.BaseURL
	}
	return t.BaseURLs[i%len(t.BaseURLs)]
}

// NewHTTPClient is the load client's HTTP/2 client for a target's admin
// requests (lists, metrics): it trusts caFile.
func NewHTTPClient(caFile string) (*http.Client, error) {
	pool, err := service.LoadCertPool(caFile)
	if err != nil {
		return nil, err
	}
	tr := &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: pool},
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 100,
		DisableCompression:  true,
	}
	return &http.Client{Transport: tr}, nil
}

// WatchClients returns the HTTP client of each of n watchers of w, trusting
// caFile: with w.Mux > 0, every Mux consecutive watchers share one client
// that holds one HTTP/2 connection (the servers' stream limits are above
// Mux); otherwise each watcher has a client of its own, holding one
// connection (w.Proto), which its resumes reuse as client-go's would. close
// closes every connection.
func WatchClients(caFile string, w Workload, n int) (clients []*http.Client, close func(), err error) {
	return watchClients(caFile, w, n, nil)
}

// watchClients is WatchClients whose connections, when local is set, are
// dialed from that address: each child process of a set dials from an
// address of its own, so that their connections to one server port do
// not share one address's ephemeral ports.
func watchClients(caFile string, w Workload, n int, local net.IP) (clients []*http.Client, close func(), err error) {
	pool, err := service.LoadCertPool(caFile)
	if err != nil {
		return nil, nil, err
	}
	newClient := func(h2 bool) *http.Client {
		p := new(http.Protocols)
		if h2 {
			p.SetHTTP2(true)
		} else {
			p.SetHTTP1(true)
		}
		tr := &http.Transport{
			TLSClientConfig:     &tls.Config{RootCAs: pool},
			Protocols:           p,
			MaxIdleConnsPerHost: 1,
			DisableCompression:  true,
		}
		if local != nil {
			tr.DialContext = (&net.Dialer{LocalAddr: &net.TCPAddr{IP: local}, Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
		}
		return &http.Client{Transport: tr}
	}
	clients = make([]*http.Client, n)
	for i := range clients {
		switch {
		case w.Mux > 0 && i%w.Mux != 0:
			clients[i] = clients[i-i%w.Mux]
		case w.Mux > 0:
			clients[i] = newClient(true)
		default:
			clients[i] = newClient(w.Proto == "http2")
		}
	}
	return clients, func() {
		for i, c := range clients {
			if w.Mux == 0 || i%w.Mux == 0 {
				c.CloseIdleConnections()
			}
		}
	}, nil
}

// Get does an authenticated GET and returns the body of a 200.
func Get(ctx context.Context, c *http.Client, url, token string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	// Uncompressed: a gzipped answer makes the server allocate a
	// compressor (promhttp's is ~1-2 MB) that it keeps pooled through the
	// next forced GC, and the heap a measurement reads after it would
	// count the load client's own scrape as the server's memory.
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %.200s", url, resp.Status, body)
	}
	return body, nil
}

// WaitListRV waits until a LIST of pods through the target reflects at
// least revision rev.
func WaitListRV(ctx context.Context, c *http.Client, t *Target, rev int64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		body, err := Get(ctx, c, t.BaseURL+"/api/v1/pods?limit=1", t.AdminToken)
		if err == nil {
			var l struct {
				Metadata struct {
					ResourceVersion string `json:"resourceVersion"`
				} `json:"metadata"`
			}
			if err = json.Unmarshal(body, &l); err == nil {
				got, _ := strconv.ParseInt(l.Metadata.ResourceVersion, 10, 64)
				if got >= rev {
					return nil
				}
				err = fmt.Errorf("list at revision %d, want %d", got, rev)
			}
		}
		last = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s: pods not at revision %d after %s: %v", t.Name, rev, timeout, last)
}

// HeapFromMetrics returns a Heap function that forces a GC through
// /debug/pprof/heap?gc=1 and reads go_memstats_heap_inuse_bytes from
// /metrics, both under base.
func HeapFromMetrics(c *http.Client, base, token string) func(ctx context.Context) (uint64, error) {
	return func(ctx context.Context) (uint64, error) {
		if _, err := Get(ctx, c, base+"/debug/pprof/heap?gc=1", token); err != nil {
			return 0, err
		}
		body, err := Get(ctx, c, base+"/metrics", token)
		if err != nil {
			return 0, err
		}
		for _, line := range strings.Split(string(body), "\n") {
			if rest, ok := strings.CutPrefix(line, "go_memstats_heap_inuse_bytes "); ok {
				v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
				return uint64(v), err
			}
		}
		return 0, fmt.Errorf("%s/metrics: no go_memstats_heap_inuse_bytes", base)
	}
}

// MetricSum fetches base+"/metrics" and sums the samples of metric whose
// labels contain every one of match (e.g. `verb="WATCH"`).
func MetricSum(ctx context.Context, c *http.Client, base, token, metric string, match ...string) (float64, error) {
	body, err := Get(ctx, c, base+"/metrics", token)
	if err != nil {
		return 0, err
	}
	var sum float64
	found := false
lines:
	for _, line := range strings.Split(string(body), "\n") {
		rest, ok := strings.CutPrefix(line, metric)
		if !ok || rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		for _, m := range match {
			if !strings.Contains(rest, m) {
				continue lines
			}
		}
		f := strings.Fields(rest)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %q: %w", metric, line, err)
		}
		sum += v
		found = true
	}
	if !found {
		return 0, fmt.Errorf("%s/metrics: no %s", base, metric)
	}
	return sum, nil
}
