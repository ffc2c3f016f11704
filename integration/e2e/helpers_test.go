package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	clientv3 "go.etcd.io/etcd/client/v3"

	"herald.dev/integration/checker"
	"herald.dev/integration/stack"
	"herald.dev/libs/kube"
)

var binDir string

func TestMain(m *testing.M) { stack.RunTests(m, &binDir) }

// env is one running stack and clients to its parts.
type env struct {
	*stack.Stack
	etcd *clientv3.Client
	js   jetstream.JetStream
	http *http.Client
	logs string
}

// testContext is a test's context: it ends after d (so that a hung stack
// fails the test instead of the whole run) or when the test ends.
func testContext(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func startStack(t *testing.T, opts stack.Options) *env {
	t.Helper()
	dir := t.TempDir()
	opts.Dir, opts.BinDir = dir, binDir
	logPath := filepath.Join(dir, "services.log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	opts.Logs = f
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	s, err := stack.Start(ctx, opts)
	if err != nil {
		f.Close()
		b, _ := os.ReadFile(logPath)
		t.Fatalf("starting the stack: %v\n%s", err, tail(string(b), 60))
	}
	e := &env{Stack: s, http: s.HTTPClient(), logs: logPath}
	t.Cleanup(func() {
		s.Stop()
		f.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("service logs (tail):\n%s", tail(string(b), 80))
		}
	})
	cluster := opts.Cluster
	if opts.EtcdTLS {
		// The stack's own etcd requires client certificates from its CA.
		cluster = stack.ClusterEtcd{Endpoints: s.EtcdEndpoint, CAFile: s.PKI.CAFile, CertFile: s.PKI.ClientCertFile, KeyFile: s.PKI.ClientKeyFile}
	}
	e.etcd = newEtcdClient(t, cluster, s.EtcdEndpoint)
	if opts.NATSConfigFile != "" {
		return e // NATS admits only the services' users: no e.js
	}
	nc, err := nats.Connect(s.NATSURL, nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	e.js, _ = jetstream.New(nc)
	return e
}

// newEtcdClient is a client of the stack's etcd (the cluster's, over
// mutual TLS, in cluster mode), closed when the test ends.
func newEtcdClient(t testing.TB, cluster stack.ClusterEtcd, endpoint string) *clientv3.Client {
	t.Helper()
	cfg := clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second}
	if cluster.CAFile != "" {
		cfg.TLS = clusterTLS(t, cluster)
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// builtinGroups are the API groups of the built-in registry, sorted, and the
// number of its apps/v1 resources.
func builtinGroups() (groups []string, apps int) {
	for _, r := range kube.DefaultResources() {
		if r.Group != "" && !slices.Contains(groups, r.Group) {
			groups = append(groups, r.Group)
		}
		if r.Group == "apps" {
			apps++
		}
	}
	slices.Sort(groups)
	return groups, apps
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// podJSON is a pod as kube-apiserver stores it (no resourceVersion).
func podJSON(ns, name, node string, gen int) string {
	b, _ := json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": name, "namespace": ns, "labels": map[string]string{"gen": strconv.Itoa(gen % 3)}},
		"spec":     map[string]any{"nodeName": node, "containers": []map[string]any{{"name": "c", "image": "img"}}},
		"status":   map[string]any{"phase": "Running", "observedGeneration": gen},
	})
	return string(b)
}

// put writes a pod and returns the event a watcher must see.
func (e *env) put(t testing.TB, ctx context.Context, ns, name, value string, created bool) checker.WatchEvent {
	t.Helper()
	resp, err := e.etcd.Put(ctx, "/registry/pods/"+ns+"/"+name, value)
	if err != nil {
		t.Fatal(err)
	}
	typ := "MODIFIED"
	if created {
		typ = "ADDED"
	}
	return checker.WatchEvent{Type: typ, Key: ns + "/" + name, RV: resp.Header.Revision}
}

func (e *env) del(t testing.TB, ctx context.Context, ns, name string) checker.WatchEvent {
	t.Helper()
	resp, err := e.etcd.Delete(ctx, "/registry/pods/"+ns+"/"+name)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Deleted != 1 {
		t.Fatalf("delete %s/%s deleted %d keys", ns, name, resp.Deleted)
	}
	return checker.WatchEvent{Type: "DELETED", Key: ns + "/" + name, RV: resp.Header.Revision}
}

// watchEvent is one decoded line of a watch stream.
type watchEvent struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
}

type objMeta struct {
	Kind     string `json:"kind"`
	Code     int    `json:"code"`
	Reason   string `json:"reason"`
	Message  string `json:"message"`
	Metadata struct {
		Name            string            `json:"name"`
		Namespace       string            `json:"namespace"`
		ResourceVersion string            `json:"resourceVersion"`
		Annotations     map[string]string `json:"annotations"`
	} `json:"metadata"`
}

func (w watchEvent) meta() objMeta {
	var m objMeta
	json.Unmarshal(w.Object, &m)
	return m
}

func (w watchEvent) toCheck() checker.WatchEvent {
	m := w.meta()
	rv, _ := strconv.ParseInt(m.Metadata.ResourceVersion, 10, 64)
	return checker.WatchEvent{Type: w.Type, Key: m.Metadata.Namespace + "/" + m.Metadata.Name, RV: rv}
}

// openWatch starts a watch through frontdoor and returns its events. The
// channel closes when the stream ends.
func (e *env) openWatch(t testing.TB, ctx context.Context, path string) (int, <-chan watchEvent) {
	t.Helper()
	return e.openWatchAt(t, ctx, e.FrontdoorURL, path)
}

// openWatchAt is openWatch through the frontdoor at base.
func (e *env) openWatchAt(t testing.TB, ctx context.Context, base, path string) (int, <-chan watchEvent) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
	ch := make(chan watchEvent, 100000)
	resp, err := e.http.Do(req)
	if err != nil {
		t.Fatal(err)
		close(ch)
		return 0, ch
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Logf("watch %s: %d %s", path, resp.StatusCode, b)
		close(ch)
		return resp.StatusCode, ch
	}
	go func() {
		defer close(ch)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			var ev watchEvent
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				ch <- watchEvent{Type: "DECODE-ERROR", Object: json.RawMessage(strconv.Quote(sc.Text()))}
				return
			}
			ch <- ev
		}
	}()
	return resp.StatusCode, ch
}

// collect reads events (skipping bookmarks) until one reaches rv.
func collect(t testing.TB, ctx context.Context, ch <-chan watchEvent, rv int64) []checker.WatchEvent {
	t.Helper()
	var got []checker.WatchEvent
	for {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for resourceVersion %d; got %d events, last %+v", rv, len(got), lastOf(got))
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("watch ended before resourceVersion %d; got %d events, last %+v", rv, len(got), lastOf(got))
			}
			if ev.Type == "BOOKMARK" {
				continue
			}
			if ev.Type == "ERROR" || ev.Type == "DECODE-ERROR" {
				t.Fatalf("watch error event: %s", ev.Object)
			}
			c := ev.toCheck()
			got = append(got, c)
			if c.RV >= rv {
				return got
			}
		}
	}
}

func lastOf(evs []checker.WatchEvent) checker.WatchEvent {
	if len(evs) == 0 {
		return checker.WatchEvent{}
	}
	return evs[len(evs)-1]
}

// getRaw GETs path through frontdoor and returns the status and the body
// (without a trailing newline).
func (e *env) getRaw(t testing.TB, path string) (int, string) {
	t.Helper()
	resp, err := e.http.Get(e.FrontdoorURL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSuffix(string(b), "\n")
}

// get performs a GET through frontdoor and decodes the JSON body into out.
func (e *env) get(t testing.TB, path string, out any) int {
	t.Helper()
	code, body := e.getRaw(t, path)
	b := []byte(body)
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("GET %s: %d, body not JSON: %s", path, code, b)
		}
	}
	return code
}

type podList struct {
	Kind     string `json:"kind"`
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
		Continue        string `json:"continue"`
	} `json:"metadata"`
	Items []json.RawMessage `json:"items"`
}

// metric scrapes one unlabeled or labeled sample from a process's /metrics.
func metric(t testing.TB, p *stack.Proc, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + p.Admin + "/metrics")
	if err != nil {
		t.Fatal(err)
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var sum float64
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, name+" ") || strings.HasPrefix(line, name+"{") {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			sum += v
		}
	}
	return sum
}

// metricLabeled sums the samples of name whose labels contain labels.
func metricLabeled(t testing.TB, p *stack.Proc, name, labels string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + p.Admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var sum float64
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		all := true
		for _, l := range strings.Split(labels, ",") {
			all = all && strings.Contains(line, l)
		}
		if all {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			sum += v
		}
	}
	return sum
}
