package frontdoor

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"herald.dev/libs/service"
)

// TestWatchThroughTLSServer: a watch served as in production
// (Server.HTTPServer behind service.HTTPServer, TLS), over HTTP/1.1, whose
// stream is detached from net/http, and over HTTP/2, whose is not: the
// response is the one net/http would send (the replica's status and
// headers; HTTP/1.1: chunked, Connection: close); every event reaches the
// client at once, in order; the server's shutdown ends the watch cleanly
// (the client sees the end of the stream, not an error) and ends the
// upstream watch; the watch's slots, its replica's open count and the
// open-watch gauge are released.
func TestWatchThroughTLSServer(t *testing.T) { testWatchThroughTLSServer(t) }

func testWatchThroughTLSServer(t *testing.T) {
	for _, proto := range []string{"HTTP/1.1", "HTTP/2.0"} {
		t.Run(proto, func(t *testing.T) {
			next := make(chan string)
			ended := make(chan struct{}, 1)
			var replicaAuditID atomic.Value
			fan := newFanoutFake(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer func() { ended <- struct{}{} }()
				replicaAuditID.Store(r.Header.Get("Audit-ID"))
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("X-Replica", "fanout-0")
				w.WriteHeader(http.StatusOK)
				http.NewResponseController(w).Flush()
				for {
					select {
					case line := <-next:
						w.Write([]byte(line))
						http.NewResponseController(w).Flush()
					case <-r.Context().Done():
						return
					}
				}
			}))
			defer fan.Close()
			s, _ := testServer(t, fan.URL, nil)
			srv := &service.HTTPServer{Server: s.HTTPServer(), Addr: "127.0.0.1:0", TLS: true, Grace: 5 * time.Second}
			if err := srv.Listen(); err != nil {
				t.Fatal(err)
			}
			go srv.Serve(context.Background())
			stopped := false
			defer func() {
				if !stopped {
					srv.Shutdown()
				}
			}()

			tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, Protocols: new(http.Protocols)} // the test's own server
			if proto == "HTTP/2.0" {
				tr.Protocols.SetHTTP2(true)
			} else {
				tr.Protocols.SetHTTP1(true)
			}
			defer tr.CloseIdleConnections()
			req, _ := http.NewRequest(http.MethodGet, "https://"+srv.ListenAddr()+"/api/v1/namespaces/ns1/pods?watch=true", nil)
			req.Header.Set("Authorization", "Bearer "+tokAlice)
			req.Header.Set("Audit-ID", "watch-audit-id")
			resp, err := (&http.Client{Transport: tr}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 || resp.Proto != proto || resp.Header.Get("Content-Type") != "application/json" ||
				resp.Header.Get("X-Replica") != "fanout-0" || resp.Header.Get("Date") == "" {
				t.Fatalf("response: %d %s %v", resp.StatusCode, resp.Proto, resp.Header)
			}
			// The client's audit ID is echoed, and stays with frontdoor.
			if got := resp.Header.Values("Audit-Id"); len(got) != 1 || got[0] != "watch-audit-id" || replicaAuditID.Load() != "" {
				t.Errorf("Audit-Id %q, the replica saw %q; want the client's, and none", got, replicaAuditID.Load())
			}
			if proto == "HTTP/1.1" && (!resp.Close || len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked") {
				t.Fatalf("HTTP/1.1 response: close %v, transfer encoding %v; want a chunked stream on a closing connection", resp.Close, resp.TransferEncoding)
			}
			b := s.fanout.backends[0]
			if b.open.Load() != 1 || s.watches.InUse() != 1 || testutil.ToFloat64(s.m.longrunning) != 1 {
				t.Fatalf("while open: replica count %d, watch slots %d, gauge %v; want 1 each", b.open.Load(), s.watches.InUse(), testutil.ToFloat64(s.m.longrunning))
			}
			br := bufio.NewReader(resp.Body)
			for i := range 3 {
				line := fmt.Sprintf(`{"type":"ADDED","object":{"metadata":{"resourceVersion":"%d"}}}`+"\n", i+1)
				next <- line // the next is sent only once this one is read: no event waits for another
				if got, err := br.ReadString('\n'); err != nil || got != line {
					t.Fatalf("event %d: %q, %v; want %q", i, got, err, line)
				}
			}

			shutdown := make(chan error, 1)
			go func() { shutdown <- srv.Shutdown() }()
			stopped = true
			rest, err := io.ReadAll(br)
			if err != nil || len(rest) != 0 {
				t.Fatalf("after shutdown: %q, %v; want a clean end of the stream", rest, err)
			}
			<-ended // the upstream watch ended too
			if err := <-shutdown; err != nil {
				t.Fatal(err)
			}
			if !s.WaitWatches(10 * time.Second) {
				t.Fatal("detached watches still running after shutdown")
			}
			if b.open.Load() != 0 || s.watches.InUse() != 0 || s.requests.InUse() != 0 || testutil.ToFloat64(s.m.longrunning) != 0 {
				t.Fatalf("after the watch: replica count %d, watch slots %d, request slots %d, gauge %v; want 0 each",
					b.open.Load(), s.watches.InUse(), s.requests.InUse(), testutil.ToFloat64(s.m.longrunning))
			}
			fan.servedAs(t)
		})
	}
}

// TestShutdownCutsWatchNotRead: at shutdown, a detached watch whose client
// has stopped reading (its stream's write blocked) is cut once the
// shutdown grace period has passed (net/http no longer tracks its
// connection, so its Close would not), and everything it held is released.
func TestShutdownCutsWatchNotRead(t *testing.T) { testShutdownCutsWatchNotRead(t) }

func testShutdownCutsWatchNotRead(t *testing.T) {
	const grace = 300 * time.Millisecond
	line := []byte(`{"type":"ADDED","object":{"pad":"` + strings.Repeat("x", 64<<10) + `"}}` + "\n")
	var written atomic.Int64
	fan := newFanoutFake(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for r.Context().Err() == nil {
			if _, err := w.Write(line); err != nil {
				return
			}
			http.NewResponseController(w).Flush()
			written.Add(int64(len(line)))
		}
	}))
	defer fan.Close()
	s, _ := testServer(t, fan.URL, func(c *Config) { c.ShutdownGracePeriod = grace })
	srv := &service.HTTPServer{Server: s.HTTPServer(), Addr: "127.0.0.1:0", TLS: true, Grace: grace}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	go srv.Serve(context.Background())
	req, _ := http.NewRequest(http.MethodGet, "https://"+srv.ListenAddr()+"/api/v1/namespaces/ns1/pods?watch=true", nil)
	req.Header.Set("Authorization", "Bearer "+tokAlice)
	resp, err := nonReadingClient("HTTP/1.1").Do(req)
	if err != nil || resp.StatusCode != 200 || !resp.Close {
		t.Fatalf("watch: %v, %v (want a detached HTTP/1.1 stream)", resp, err)
	}
	defer resp.Body.Close()
	// The stream's write is blocked once the replica's writes are (flow
	// control: frontdoor no longer reads them) while the stream holds a
	// copy buffer.
	last := int64(-1)
	eventually(t, "the stream's write to block", func() bool {
		n := written.Load()
		stalled := n == last && n > 0 && s.fanout.buffers.lent.Load() == 1
		last = n
		time.Sleep(50 * time.Millisecond) // the replica's writes, sampled over an interval
		return stalled
	})
	began := time.Now()
	if err := srv.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if !s.WaitWatches(10 * time.Second) {
		t.Fatal("the watch was not cut after the grace period")
	}
	if took := time.Since(began); took < grace {
		t.Fatalf("the watch was cut after %s, before the grace period (%s)", took, grace)
	}
	b := s.fanout.backends[0]
	if b.open.Load() != 0 || s.watches.InUse() != 0 || s.fanout.buffers.lent.Load() != 0 {
		t.Fatalf("after the cut: replica count %d, watch slots %d, buffers lent %d; want 0 each", b.open.Load(), s.watches.InUse(), s.fanout.buffers.lent.Load())
	}
	fan.servedAs(t)
}
