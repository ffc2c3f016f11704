package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	clientv3 "go.etcd.io/etcd/client/v3"

	"herald.dev/integration/checker"
	"herald.dev/integration/stack"
	"herald.dev/libs/stream"
)

// relister is a watch client that behaves as a client-go informer: it
// lists, watches from the list's resourceVersion, resumes a broken watch
// from the last resourceVersion it received (events and bookmarks), and on
// 410 Gone lists again. Each list starts a segment; check verifies that the
// list matched etcd at its revision and that within the segment every
// change arrived once, in order: a gap is either visible (410, relist) or a
// failure.
type relister struct {
	e        *env
	path     string // the list path, e.g. /api/v1/namespaces/x/pods
	prefix   string // the resource's etcd prefix, e.g. /registry/pods/
	keys     string // the etcd prefix of what path lists, e.g. /registry/pods/x/
	mu       sync.Mutex
	segments []*segment
	rv       int64
	changed  chan struct{}
}

// segment is what a relister saw from one list until the next.
type segment struct {
	from   int64    // the list's resourceVersion
	items  []string // the list's items, "namespace/name@resourceVersion", sorted
	to     int64    // the last resourceVersion received
	events []checker.WatchEvent
}

func (e *env) relister(ctx context.Context, path, prefix, keys string) *relister {
	c := &relister{e: e, path: path, prefix: prefix, keys: keys, changed: make(chan struct{}, 1)}
	go c.run(ctx)
	return c
}

func (c *relister) run(ctx context.Context) {
	list := true
	for ctx.Err() == nil {
		if list {
			var l podList
			if code := c.e.get(nopT{}, c.path, &l); code != 200 {
				sleepCtx(ctx, 100*time.Millisecond)
				continue
			}
			seg := &segment{}
			seg.from, _ = strconv.ParseInt(l.Metadata.ResourceVersion, 10, 64)
			seg.to = seg.from
			seg.items = itemVersions(l.Items)
			c.mu.Lock()
			c.segments = append(c.segments, seg)
			c.rv = seg.from
			c.mu.Unlock()
			list = false
		}
		c.mu.Lock()
		rv := c.rv
		c.mu.Unlock()
		code, evs := c.e.openWatch(nopT{}, ctx, c.path+"?watch=true&allowWatchBookmarks=true&resourceVersion="+strconv.FormatInt(rv, 10))
		if code != 200 {
			sleepCtx(ctx, 100*time.Millisecond)
			continue
		}
		for ev := range evs {
			c.mu.Lock()
			seg := c.segments[len(c.segments)-1]
			switch ev.Type {
			case "ERROR":
				var st status
				json.Unmarshal(ev.Object, &st)
				if st.Code == 410 {
					list = true
				}
			case "BOOKMARK":
				if r, _ := strconv.ParseInt(ev.meta().Metadata.ResourceVersion, 10, 64); r > c.rv {
					c.rv, seg.to = r, r
				}
			default:
				we := ev.toCheck()
				seg.events = append(seg.events, we)
				c.rv, seg.to = we.RV, we.RV
			}
			c.mu.Unlock()
			select {
			case c.changed <- struct{}{}:
			default:
			}
		}
	}
}

// itemVersions are a list's items as "namespace/name@resourceVersion",
// sorted.
func itemVersions(items []json.RawMessage) []string {
	var out []string
	for _, raw := range items {
		m := watchEvent{Object: raw}.meta().Metadata
		out = append(out, m.Namespace+"/"+m.Name+"@"+m.ResourceVersion)
	}
	sort.Strings(out)
	return out
}

// listMatchesEtcd checks that a LIST of the pods of namespace ns serves
// etcd's state at the list's revision.
func (e *env) listMatchesEtcd(t *testing.T, ctx context.Context, ns string) {
	t.Helper()
	var l podList
	e.get(t, "/api/v1/namespaces/"+ns+"/pods", &l)
	lr, _ := strconv.ParseInt(l.Metadata.ResourceVersion, 10, 64)
	if got, want := itemVersions(l.Items), e.etcdNames(t, ctx, "/registry/pods/"+ns+"/", lr, nil); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("LIST of %s at %d: %v, etcd has %v", ns, lr, got, want)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// check waits until the client has reached revision rev and verifies every
// segment against etcd; it returns the number of lists (1: never relisted).
func (c *relister) check(t *testing.T, ctx context.Context, rev int64) int {
	t.Helper()
	for {
		c.mu.Lock()
		reached := c.rv >= rev
		c.mu.Unlock()
		if reached {
			break
		}
		select {
		case <-ctx.Done():
			c.mu.Lock()
			defer c.mu.Unlock()
			t.Fatalf("%s: client stuck at revision %d (want %d) after %d lists", c.path, c.rv, rev, len(c.segments))
		case <-c.changed:
		case <-time.After(200 * time.Millisecond):
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, seg := range c.segments {
		existed := map[string]bool{}
		resp, err := c.e.etcd.Get(ctx, c.keys, clientv3.WithPrefix(), clientv3.WithRev(seg.from))
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		for _, kv := range resp.Kvs {
			existed[string(kv.Key)] = true
			want = append(want, checker.KeyName(c.prefix, string(kv.Key))+"@"+strconv.FormatInt(kv.ModRevision, 10))
		}
		sort.Strings(want)
		if fmt.Sprint(seg.items) != fmt.Sprint(want) {
			t.Errorf("%s: list %d at %d: %v, etcd has %v", c.path, i, seg.from, seg.items, want)
		}
		history, err := checker.EtcdHistory(ctx, c.e.etcd, c.keys, seg.from+1, seg.to)
		if err != nil {
			t.Fatal(err)
		}
		for _, err := range checker.CheckWatch(checker.ExpectedEvents(c.prefix, history, existed), seg.events) {
			t.Errorf("%s: segment %d (%d, %d]: %v", c.path, i, seg.from, seg.to, err)
		}
	}
	return len(c.segments)
}

// TestLargeObjects: objects between the stream's largest message and
// etcd's request limit (a 1.4 MiB ConfigMap) are delivered like any other,
// under churn: GET and LIST serve every version as soon as it is written,
// and a watch sees every version, and the delete, once, in order.
func TestLargeObjects(t *testing.T) {
	e := startStack(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	from := e.rev(t, ctx)
	client := e.relister(ctx, "/api/v1/namespaces/big/configmaps", "/registry/configmaps/", "/registry/configmaps/big/")
	wctx, wcancel := context.WithCancel(ctx)
	churn := &writer{e: e, ns: "churn"}
	churned := make(chan struct{})
	go func() { defer close(churned); churn.run(wctx, 100000, nil) }()
	defer func() { wcancel(); <-churned }()
	_, watch := e.openWatch(t, ctx, "/api/v1/namespaces/big/configmaps?watch=true&resourceVersion="+strconv.FormatInt(from, 10))

	const size = 1400 << 10
	configMap := func(name string, version, n int) string {
		b, _ := json.Marshal(map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": name, "namespace": "big"},
			"data":     map[string]string{"version": strconv.Itoa(version), "blob": strings.Repeat(string(rune('a'+version%26)), n)},
		})
		return string(b)
	}
	type cm struct {
		Metadata struct {
			Name            string `json:"name"`
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
		Data map[string]string `json:"data"`
	}
	versionOf := func(c cm) string {
		return fmt.Sprintf("%s v%s @%s (%d bytes)", c.Metadata.Name, c.Data["version"], c.Metadata.ResourceVersion, len(c.Data["blob"]))
	}
	wantOf := func(name string, version int, rev int64, n int) string {
		return fmt.Sprintf("%s v%d @%d (%d bytes)", name, version, rev, n)
	}
	var want []string // every version, as the watch must see it
	for v := range 8 {
		var rev int64
		if v == 5 {
			// A transaction: the large change shares its revision with a
			// small one.
			resp, err := e.etcd.Txn(ctx).Then(
				clientv3.OpPut("/registry/configmaps/big/big", configMap("big", v, size)),
				clientv3.OpPut("/registry/configmaps/big/small", configMap("small", v, 10)),
			).Commit()
			if err != nil {
				t.Fatal(err)
			}
			rev = resp.Header.Revision
		} else {
			resp, err := e.etcd.Put(ctx, "/registry/configmaps/big/big", configMap("big", v, size))
			if err != nil {
				t.Fatal(err)
			}
			rev = resp.Header.Revision
		}
		typ := "MODIFIED"
		if v == 0 {
			typ = "ADDED"
		}
		want = append(want, typ+" "+wantOf("big", v, rev, size))
		if v == 5 {
			want = append(want, "ADDED "+wantOf("small", v, rev, 10))
		}
		// GET and LIST are consistent reads: they serve this version now.
		var got cm
		if code := e.get(t, "/api/v1/namespaces/big/configmaps/big", &got); code != 200 || versionOf(got) != wantOf("big", v, rev, size) {
			t.Fatalf("GET after writing version %d at %d: %d %s", v, rev, code, versionOf(got))
		}
		var l struct {
			Items []cm `json:"items"`
		}
		if code := e.get(t, "/api/v1/namespaces/big/configmaps", &l); code != 200 || len(l.Items) == 0 || versionOf(l.Items[0]) != wantOf("big", v, rev, size) {
			t.Fatalf("LIST after writing version %d at %d: %d, %d items", v, rev, code, len(l.Items))
		}
	}
	resp, err := e.etcd.Delete(ctx, "/registry/configmaps/big/big")
	if err != nil {
		t.Fatal(err)
	}
	last := resp.Header.Revision
	want = append(want, "DELETED "+wantOf("big", 7, last, size))
	var got []string
	for len(got) < len(want) {
		select {
		case <-ctx.Done():
			t.Fatalf("watch saw %d of %d events:\n%s", len(got), len(want), strings.Join(got, "\n"))
		case ev, ok := <-watch:
			if !ok {
				t.Fatalf("watch ended after %d of %d events:\n%s", len(got), len(want), strings.Join(got, "\n"))
			}
			var c cm
			if err := json.Unmarshal(ev.Object, &c); err != nil {
				t.Fatalf("watch event %s: %v", ev.Type, err)
			}
			if ev.Type != "BOOKMARK" {
				got = append(got, ev.Type+" "+versionOf(c))
			}
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("watch saw\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if lists := client.check(t, ctx, last); lists != 1 {
		t.Errorf("the informer relisted %d times", lists-1)
	}
	if n := metric(t, e.Proc("ingest-0"), "herald_ingest_fragmented_changes_total"); n < 9 {
		t.Errorf("ingest fragmented %v changes, want at least 9", n)
	}
}

// purge empties the stream, as an operator's purge or max-age would.
func (e *env) purge(t *testing.T, ctx context.Context) {
	t.Helper()
	st, err := e.js.Stream(ctx, "HERALD")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(ctx); err != nil {
		t.Fatal(err)
	}
}

// settleStream returns once the stream has stored or refused every message
// the killed ingest had sent: NATS has dropped its connection, so it reads
// nothing more from it, and the stream has answered a publish sent after
// that. The stream takes in messages in order, and this one it refuses (it
// expects another stream), so it stores nothing the caches would read.
func (e *env) settleStream(t *testing.T, ctx context.Context) {
	t.Helper()
	waitUntil(t, ctx, "NATS to drop the killed ingest's connection", func() bool {
		cz, err := e.NATS.Connz(&natsserver.ConnzOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cz.Conns {
			if strings.HasPrefix(c.Name, "herald-ingest") {
				return false
			}
		}
		return true
	})
	_, err := e.js.Publish(ctx, stream.SubjectProgress, nil, jetstream.WithExpectStream("herald-test-barrier"))
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.ErrorCode(natsserver.JSStreamNotMatchErr) {
		t.Fatalf("barrier publish: %v, want the stream's refusal (expected stream does not match)", err)
	}
}

// TestStreamPurgedUnderLoad empties the stream twice under a write load:
// once while ingest runs, and once while it is down, so that it resumes on
// an empty stream whose last revision is lost. No watcher sees a gap
// silently: each gets every event or a 410 and relists, and LIST serves
// etcd's state.
func TestStreamPurgedUnderLoad(t *testing.T) {
	e := startStack(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var clients []*relister
	for range 3 {
		clients = append(clients, e.relister(ctx, "/api/v1/namespaces/purge/pods", "/registry/pods/", "/registry/pods/purge/"))
	}
	clients = append(clients, e.relister(ctx, "/api/v1/pods", "/registry/pods/", "/registry/pods/"))
	ing := e.Proc("ingest-0")
	w := &writer{e: e, ns: "purge"}
	w.run(ctx, 400, map[int]func(){
		100: func() { e.purge(t, ctx) },
		200: func() {
			ing.Kill()
			// What it sent before it died must not land after the purge.
			e.settleStream(t, ctx)
			e.purge(t, ctx)
		},
		// Writes 200..279 are in etcd only, after the stream's last
		// revision, which is gone.
		280: func() {
			if err := ing.Start(); err != nil {
				t.Error(err)
			}
		},
	})
	last := w.lastRev()
	for _, c := range clients {
		lists := c.check(t, ctx, last)
		t.Logf("%s: %d lists", c.path, lists)
	}
	e.listMatchesEtcd(t, ctx, "purge")
	if n := metric(t, ing, "herald_ingest_resyncs_total"); n != 1 {
		t.Errorf("ingest appended %v resync markers, want 1 (on the emptied stream)", n)
	}
}

// cutProxy is a TCP proxy that can cut every connection through it and
// refuse new ones: a network partition between one process and a server.
type cutProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]bool
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	t.Cleanup(func() { ln.Close(); p.setCut(true) })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(in)
		}
	}()
	return p
}

func (p *cutProxy) serve(in net.Conn) {
	out, err := net.Dial("tcp", p.target)
	if err != nil {
		in.Close()
		return
	}
	p.mu.Lock()
	if p.cut {
		p.mu.Unlock()
		in.Close()
		out.Close()
		return
	}
	p.conns[in], p.conns[out] = true, true
	p.mu.Unlock()
	go func() { io.Copy(out, in); out.Close() }()
	io.Copy(in, out)
	in.Close()
}

// setCut cuts (true) or restores (false) the link.
func (p *cutProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			c.Close()
		}
		p.conns = map[net.Conn]bool{}
	}
}

// TestConsumerGapResync cuts the cache off NATS while writes go on and the
// stream loses them (purged) before the cache reads them; when the link is
// back, the cache's consumer reads on from what the stream still holds. The
// cache notices the gap and rebuilds: it serves etcd's state, and every
// watcher gets every event or a 410 and relists.
func TestConsumerGapResync(t *testing.T) {
	e := startStack(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	u, err := url.Parse(e.NATSURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newCutProxy(t, u.Host)
	cache := e.Proc("cache-0")
	cache.Args = append(cache.Args, "--nats.url=nats://"+proxy.ln.Addr().String())
	if err := cache.Restart(false); err != nil {
		t.Fatal(err)
	}
	if err := cache.WaitReady(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	var clients []*relister
	for range 3 {
		clients = append(clients, e.relister(ctx, "/api/v1/namespaces/gap/pods", "/registry/pods/", "/registry/pods/gap/"))
	}
	w := &writer{e: e, ns: "gap"}
	w.run(ctx, 100, nil)
	for _, c := range clients {
		c.check(t, ctx, w.lastRev())
	}
	proxy.setCut(true)
	w.run(ctx, 100, nil) // the cache does not see these...
	e.streamReaches(t, ctx, w.lastRev())
	e.purge(t, ctx) // ...and the stream loses them
	w.run(ctx, 50, nil)
	e.streamReaches(t, ctx, w.lastRev())
	proxy.setCut(false)
	w.run(ctx, 50, nil)
	last := w.lastRev()
	for _, c := range clients {
		lists := c.check(t, ctx, last)
		if lists < 2 {
			t.Errorf("%s: never relisted, yet the cache lost its history", c.path)
		}
	}
	if n := metric(t, cache, "herald_cache_stream_gaps_total"); n != 1 {
		t.Errorf("cache counted %v stream gaps, want 1", n)
	}
	e.listMatchesEtcd(t, ctx, "gap")
}
