package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"herald.dev/integration/stack"
)

// TestNonReadingListClientsAreCut: 100 LIST clients (100 users, one
// connection each) ask for a 1 MiB list and never read it, over HTTP/1.1
// and then HTTP/2. With --max-requests-inflight=100 they hold every slot
// (another LIST gets 429) and frontdoor holds their bodies; each is cut
// (its body ends in an error) --write-timeout after its first byte, and
// not before, counted once; the slots return (a new LIST succeeds) and
// frontdoor's heap returns near its baseline.
//
// Nothing here depends on how long the 100 responses take to start (on a
// loaded machine, longer than the write timeout): no response can be cut
// before writeTimeout after the round began, since each deadline counts
// from a first byte sent after its request; so the slots are checked at a
// moment known to come before that, and each later sample of the slots
// and cuts is checked against every client's own request and first-byte
// times.
func TestNonReadingListClientsAreCut(t *testing.T) {
	const (
		clients      = 100
		pods         = 500
		writeTimeout = 10 * time.Second
		// lateness is how long past its deadline a cut response may still
		// hold its slot on a loaded machine (the timer, the handler's
		// return).
		lateness = 10 * time.Second
	)
	e := startStack(t, stack.Options{Flags: map[string][]string{"frontdoor": {
		"--write-timeout=" + writeTimeout.String(), "--reload-interval=200ms",
		"--max-requests-inflight=" + strconv.Itoa(clients), "--max-requests-inflight-per-user=" + strconv.Itoa(clients),
	}}})
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	front := e.Proc("frontdoor-0")

	// 500 pods of ~2 KiB: a 1 MiB list, several times what the sockets
	// buffer for a client that stops reading (nonReadingClient: ~100 KiB
	// over HTTP/1.1, 64 KiB windows over HTTP/2). That the writes block is
	// checked below: a response whose write completes releases its slot
	// before its deadline and is not counted as cut.
	pad := strings.Repeat("x", 2<<10)
	const bodyBytes = pods * 2 << 10
	for i := 0; i < pods; i += 100 {
		var ops []clientv3.Op
		for j := i; j < i+100; j++ {
			name := fmt.Sprintf("big-%04d", j)
			ops = append(ops, clientv3.OpPut("/registry/pods/bulk/"+name, strings.Replace(podJSON("bulk", name, "node-1", j), `"labels"`, `"annotations":{"pad":"`+pad+`"},"labels"`, 1)))
		}
		if _, err := e.etcd.Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	var list podList
	for {
		if code := e.get(t, "/api/v1/pods", &list); code == http.StatusOK && len(list.Items) == pods {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the cache never listed %d pods (last LIST: %d)", pods, len(list.Items))
		case <-time.After(100 * time.Millisecond): // polling a condition with a deadline
		}
	}
	var users []string
	for i := range clients {
		users = append(users, fmt.Sprintf("reader-%d-token,reader-%d,u-%d,\"system:masters\"", i, i, i))
	}
	addTokens(t, e, users...)
	heap0 := heapAfterGC(t, front)
	t.Logf("frontdoor heap after GC: %.1f MiB before the clients", float64(heap0)/(1<<20))

	inflight := func() float64 {
		return metricLabeled(t, front, "apiserver_current_inflight_requests", `request_kind="readOnly"`)
	}
	cuts := func() float64 { return metric(t, front, "herald_frontdoor_response_write_timeouts_total") }
	for _, proto := range []string{"HTTP/1.1", "HTTP/2.0"} {
		cuts0 := cuts()
		// Every client on its own connection, with the smallest buffers.
		type client struct {
			sent, started time.Time // before the request; once the response's header arrived
			body          io.ReadCloser
			failed        string
		}
		cs := make([]client, clients)
		var nStarted atomic.Int64
		var wg sync.WaitGroup
		began := time.Now()
		// No deadline is armed before a first byte, sent after its request:
		// until firstCut every slot a client took is still held.
		firstCut := began.Add(writeTimeout)
		for i := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := &cs[i]
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.FrontdoorURL+"/api/v1/pods", nil)
				req.Header.Set("Authorization", fmt.Sprintf("Bearer reader-%d-token", i))
				c.sent = time.Now()
				resp, err := nonReadingClient(e, proto).Do(req)
				c.started = time.Now()
				switch {
				case err != nil:
					c.failed = err.Error()
				case resp.StatusCode != http.StatusOK || resp.Proto != proto:
					c.failed = fmt.Sprintf("%d over %s", resp.StatusCode, resp.Proto)
					resp.Body.Close()
				default:
					c.body = resp.Body
					nStarted.Add(1)
				}
			}()
		}
		allStarted := make(chan struct{})
		go func() { wg.Wait(); close(allStarted) }()
		// Wait for every response to start, but check the slots while no
		// response can have been cut yet, however slowly they start.
		select {
		case <-allStarted:
		case <-time.After(time.Until(began.Add(writeTimeout / 2))): // a deadline, not a synchronization
		}

		// Every client holds a slot (the responses that started hold their
		// bodies, the others are being fetched): another LIST is refused.
		for n := inflight(); n != clients; n = inflight() {
			if n > clients || time.Now().After(firstCut) {
				t.Fatalf("%s: %v request slots in use, want %d (within the write timeout after the %d requests: the machine too loaded to admit them?)", proto, n, clients, clients)
			}
			time.Sleep(20 * time.Millisecond) // polling a metric with a deadline
		}
		resp, err := e.http.Get(e.FrontdoorURL + "/api/v1/namespaces/bulk/pods?limit=1")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests {
			t.Errorf("%s: a LIST while %d clients hold the slots (%d responses started, %s after the requests, before any deadline): %d, want 429",
				proto, clients, nStarted.Load(), time.Since(began).Round(time.Millisecond), resp.StatusCode)
		}
		// The started responses' bodies are held, as long as none can
		// have been cut.
		held := nStarted.Load()
		heapStuck := heapAfterGC(t, front)
		if time.Now().Before(firstCut) {
			if heapStuck-heap0 < held*bodyBytes/2 {
				t.Errorf("%s: frontdoor heap %.1f MiB while %d clients are stuck: the bodies are not held, the test proves nothing", proto, float64(heapStuck)/(1<<20), held)
			}
		} else {
			held = 0
		}

		select {
		case <-allStarted:
		case <-ctx.Done():
			t.Fatalf("%s: the responses never started", proto)
		}
		var lastStart time.Time
		for _, c := range cs {
			if c.failed != "" {
				t.Fatalf("%s: a client failed: %s", proto, c.failed)
			}
			if c.started.After(lastStart) {
				lastStart = c.started
			}
		}
		count := func(f func(c client) bool) (n int) {
			for _, c := range cs {
				if f(c) {
					n++
				}
			}
			return n
		}

		// Each response is cut at its own deadline: not before (its slot is
		// held, not counted as cut), not long after (its slot is free).
		for {
			t0 := time.Now()
			n, cut := inflight(), cuts()-cuts0
			t1 := time.Now()
			due := count(func(c client) bool { return !c.sent.Add(writeTimeout).After(t1) })
			if cut > float64(due) {
				t.Fatalf("%s: %v responses cut %s after the requests, only %d can have reached the write timeout", proto, cut, t1.Sub(began).Round(time.Millisecond), due)
			}
			if n < float64(clients-due) {
				t.Fatalf("%s: %v request slots in use %s after the requests, want at least the %d whose write timeout cannot have passed: a non-reading client's response completed (does its body fit the socket buffers?)",
					proto, n, t1.Sub(began).Round(time.Millisecond), clients-due)
			}
			if open := count(func(c client) bool { return c.started.Add(writeTimeout + lateness).After(t0) }); n > float64(open) {
				t.Fatalf("%s: %v request slots in use %s after the requests, only %d responses started less than write-timeout %s + %s ago", proto, n, t0.Sub(began).Round(time.Millisecond), open, writeTimeout, lateness)
			}
			if t0.After(lastStart.Add(writeTimeout+lateness)) && cut < clients {
				t.Fatalf("%s: %v write timeouts counted %s after the last response started, want %d", proto, cut, t0.Sub(lastStart).Round(time.Millisecond), clients)
			}
			if n == 0 && cut >= clients {
				if cut != clients {
					t.Errorf("%s: %v write timeouts counted, want %d", proto, cut, clients)
				}
				break
			}
			time.Sleep(50 * time.Millisecond) // polling metrics with a deadline (the last start + write-timeout + lateness, checked above)
		}
		freed := time.Since(lastStart)
		for _, c := range cs {
			if n, err := io.Copy(io.Discard, c.body); err == nil || errors.Is(err, io.EOF) {
				t.Fatalf("%s: a body was read whole (%d bytes) after the deadline; want a cut", proto, n)
			}
			c.body.Close()
		}
		if code := e.get(t, "/api/v1/pods", &list); code != http.StatusOK || len(list.Items) != pods {
			t.Fatalf("%s: LIST after the cut: %d with %d items", proto, code, len(list.Items))
		}
		heap1 := heapAfterGC(t, front)
		t.Logf("%s: %d non-reading clients, every response started %s after the requests; %d bodies held: frontdoor heap after GC %.1f MiB; every slot free %s after the last response started (write-timeout %s), heap %.1f MiB",
			proto, clients, lastStart.Sub(began).Round(time.Millisecond), held, float64(heapStuck)/(1<<20), freed.Round(time.Millisecond), writeTimeout, float64(heap1)/(1<<20))
		if heap1-heap0 > clients*bodyBytes/4 {
			t.Errorf("%s: frontdoor heap %.1f MiB after the cut, %.1f MiB before the clients", proto, float64(heap1)/(1<<20), float64(heap0)/(1<<20))
		}
	}
}

// nonReadingClient sends requests over proto (HTTP/1.1 or HTTP/2.0)
// without asking for gzip (a compressed body would fit the buffers), into
// an 8 KiB socket receive buffer and, over HTTP/2, 64 KiB flow-control
// windows that are replenished only as the body is read. Its 1 KiB
// segments (TCP_MAXSEG) keep the server's send buffer from growing (on
// loopback's 64 KiB segments Linux lets it grow to megabytes): frontdoor
// has ~100 KiB in flight, not 3 MiB, before its writes block.
func nonReadingClient(e *env, proto string) *http.Client {
	tr := e.TLSTransport()
	tr.DisableCompression = true
	tr.Protocols = new(http.Protocols)
	if proto == "HTTP/2.0" {
		tr.Protocols.SetHTTP2(true)
	} else {
		tr.Protocols.SetHTTP1(true)
	}
	tr.HTTP2 = &http.HTTP2Config{MaxReceiveBufferPerConnection: 64 << 10, MaxReceiveBufferPerStream: 64 << 10}
	tr.DialContext = (&net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) {
			syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
			syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_MAXSEG, 1024)
		})
	}}).DialContext
	return &http.Client{Transport: tr}
}

// heapAfterGC is a process's live heap: two collections (the second frees
// what sync.Pools kept through the first), then go_memstats_heap_alloc_bytes.
func heapAfterGC(t *testing.T, p *stack.Proc) int64 {
	t.Helper()
	for range 2 {
		resp, err := http.Get("http://" + p.Admin + "/debug/pprof/heap?gc=1")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return int64(metric(t, p, "go_memstats_heap_alloc_bytes"))
}
