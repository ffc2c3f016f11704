package watchsession

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// serve starts an h2c server (as a fanout replica's) whose sessions serve
// h; nil sessions: a server without them, h answering everything.
func serve(t *testing.T, sessions bool, h http.Handler) (*httptest.Server, *Server) {
	t.Helper()
	if !sessions {
		return serveHandler(t, h, nil), nil
	}
	mux := &Server{Handler: h}
	return serveHandler(t, mux, mux), mux
}

// serveHandler serves root over HTTP/2 on a test server; mux, if not nil,
// shuts down with it.
func serveHandler(t *testing.T, root http.Handler, mux *Server) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(root)
	srv.Config.Protocols = serverProtocols()
	if mux != nil {
		srv.Config.RegisterOnShutdown(mux.Shutdown)
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

func client(t *testing.T, maxStreams int) (*Client, *countingTransport) {
	ct := &countingTransport{rt: &http.Transport{Protocols: clientProtocols()}}
	c := &Client{Transport: ct, MaxStreams: maxStreams, Retry: time.Hour}
	t.Cleanup(c.Close)
	return c, ct
}

// countingTransport counts the requests that went on their own HTTP/2
// stream, by method.
type countingTransport struct {
	rt    http.RoundTripper
	mu    sync.Mutex
	count map[string]int
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	if c.count == nil {
		c.count = map[string]int{}
	}
	c.count[r.Method]++
	c.mu.Unlock()
	return c.rt.RoundTrip(r)
}

func (c *countingTransport) requests(method string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.count[method]
}

func get(t *testing.T, c *Client, ctx context.Context, url string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// lines writes n numbered lines, each flushed, the first after the head.
func lines(n int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Path", r.URL.Path)
		w.Header().Set("X-Accept", r.Header.Get("Accept"))
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		for i := range n {
			fmt.Fprintf(w, "%s %d %s\n", r.URL.Query().Get("name"), i, strings.Repeat("x", i%5000))
			if err := rc.Flush(); err != nil {
				return
			}
		}
	})
}

// TestStreams: many concurrent streams over sessions, more of them than a
// session carries, each get their own head and every byte of their own
// body, in order; none goes on its own HTTP/2 stream.
func TestStreams(t *testing.T) {
	const streams, perStream = 40, 300
	srv, _ := serve(t, true, lines(perStream))
	c, ct := client(t, 16)
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for i := range streams {
		wg.Go(func() {
			name := "w" + strconv.Itoa(i)
			resp := get(t, c, context.Background(), srv.URL+"/api/v1/pods?name="+name)
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Path") != "/api/v1/pods" || resp.Header.Get("X-Accept") != "application/json" {
				errs <- fmt.Errorf("%s: head %d %v", name, resp.StatusCode, resp.Header)
				return
			}
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(nil, 1<<20)
			n := 0
			for sc.Scan() {
				if want := fmt.Sprintf("%s %d %s", name, n, strings.Repeat("x", n%5000)); sc.Text() != want {
					errs <- fmt.Errorf("%s: line %d is %.40q", name, n, sc.Text())
					return
				}
				n++
			}
			if sc.Err() != nil || n != perStream {
				errs <- fmt.Errorf("%s: %d lines, %v", name, n, sc.Err())
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := ct.requests(http.MethodGet); n != 0 {
		t.Errorf("%d requests on their own stream, want 0", n)
	}
	if n := ct.requests(http.MethodPost); n < streams/16 {
		t.Errorf("%d sessions for %d streams of at most 16, want at least %d", n, streams, streams/16)
	}
}

// TestStatusPassesThrough: a response that is not 200 keeps its status,
// headers and body.
func TestStatusPassesThrough(t *testing.T) {
	srv, _ := serve(t, true, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusGone)
		io.WriteString(w, `{"kind":"Status","code":410}`)
	}))
	c, _ := client(t, 8)
	resp := get(t, c, context.Background(), srv.URL+"/x")
	defer resp.Body.Close()
	if resp.Request == nil || resp.Request.URL.Path != "/x" {
		t.Fatalf("the response's request: %v", resp.Request)
	}
	body, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusGone || resp.Header.Get("Content-Type") != "application/json" || string(body) != `{"kind":"Status","code":410}` || err != nil {
		t.Fatalf("got %d %v %q %v", resp.StatusCode, resp.Header, body, err)
	}
}

// TestSlowReaderStopsOnlyItself: a stream whose body is not read stops
// once its window is sent (its write waits, and fails at its write
// deadline), while another stream of the same session goes on.
func TestSlowReaderStopsOnlyItself(t *testing.T) {
	blocked := make(chan error, 1)
	chunk := bytes.Repeat([]byte("y"), 64<<10)
	srv, _ := serve(t, true, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("name") != "slow" {
			lines(2000).ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		sent := 0
		for sent < window {
			n, err := w.Write(chunk)
			sent += n
			if err != nil {
				blocked <- fmt.Errorf("write failed after %d bytes: %v", sent, err)
				return
			}
		}
		// The window is used: the next write waits for credit that never
		// comes, until its deadline.
		rc.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
		_, err := w.Write(chunk)
		blocked <- err
	}))
	c, _ := client(t, 8)
	slow := get(t, c, context.Background(), srv.URL+"/x?name=slow")
	defer slow.Body.Close()
	if err := <-blocked; !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the slow stream's write past its window: %v, want the deadline", err)
	}
	fast := get(t, c, context.Background(), srv.URL+"/x?name=fast")
	defer fast.Body.Close()
	n, err := io.Copy(io.Discard, fast.Body)
	if err != nil || n < 2000 {
		t.Fatalf("the other stream: %d bytes, %v", n, err)
	}
	// What the slow one sent is all there, and ends with its failure.
	got, _ := io.Copy(io.Discard, slow.Body)
	if got != window {
		t.Fatalf("slow stream delivered %d bytes, want its window %d", got, window)
	}
}

// TestWriteAfterDeadline: once its deadline has passed, a write fails even
// with credit to spare, as on a connection.
func TestWriteAfterDeadline(t *testing.T) {
	got := make(chan error, 1)
	srv, _ := serve(t, true, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "before\n")
		http.NewResponseController(w).SetWriteDeadline(time.Now().Add(-time.Second))
		_, err := io.WriteString(w, "after\n")
		got <- err
	}))
	c, _ := client(t, 8)
	resp := get(t, c, context.Background(), srv.URL+"/x")
	defer resp.Body.Close()
	if err := <-got; !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write past the deadline: %v", err)
	}
	if b, _ := io.ReadAll(resp.Body); string(b) != "before\n" {
		t.Fatalf("body %q, want what was written before the deadline", b)
	}
}

// TestAbortBeforeHead: a handler that aborts before its head fails the
// request (as a reset HTTP/2 stream does, so that it is retried
// elsewhere), and the session goes on.
func TestAbortBeforeHead(t *testing.T) {
	srv, _ := serve(t, true, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("name") == "abort" {
			panic(http.ErrAbortHandler)
		}
		io.WriteString(w, "ok\n")
	}))
	c, ct := client(t, 8)
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/x?name=abort", nil)
	if resp, err := c.RoundTrip(req); err == nil {
		resp.Body.Close()
		t.Fatalf("aborted before its head: %d, want an error", resp.StatusCode)
	}
	resp := get(t, c, context.Background(), srv.URL+"/x")
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "ok\n" || err != nil || ct.requests(http.MethodPost) != 1 {
		t.Fatalf("next request: %q %v, %d sessions", b, err, ct.requests(http.MethodPost))
	}
}

// TestCancel: closing a body, or ending its request's context, ends the
// server's request context; the session stays for other streams.
func TestCancel(t *testing.T) {
	started := make(chan struct{}, 2)
	ended := make(chan struct{}, 2)
	srv, _ := serve(t, true, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("name") == "short" {
			io.WriteString(w, "done\n")
			return
		}
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		started <- struct{}{}
		<-r.Context().Done()
		ended <- struct{}{}
	}))
	c, ct := client(t, 8)
	resp := get(t, c, context.Background(), srv.URL+"/x")
	<-started
	resp.Body.Close()
	<-ended

	ctx, cancel := context.WithCancel(context.Background())
	resp = get(t, c, ctx, srv.URL+"/x")
	<-started
	cancel()
	if _, err := resp.Body.Read(make([]byte, 1)); !errors.Is(err, context.Canceled) {
		t.Fatalf("read after the context ended: %v", err)
	}
	resp.Body.Close()
	<-ended

	resp = get(t, c, context.Background(), srv.URL+"/x?name=short")
	b, err := io.ReadAll(resp.Body)
	if string(b) != "done\n" || err != nil {
		t.Fatalf("after the cancels: %q %v", b, err)
	}
	if n := ct.requests(http.MethodPost); n != 1 {
		t.Fatalf("%d sessions, want 1", n)
	}
}

// TestSessionEnds: when the server closes its sessions, a stream's body
// fails once what was sent is read, and the next request fails too (a
// closed server refuses sessions; frontdoor retries on another replica).
func TestSessionEnds(t *testing.T) {
	srv, mux := serve(t, true, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "first\n")
		http.NewResponseController(w).Flush()
		<-r.Context().Done()
	}))
	c, ct := client(t, 8)
	resp := get(t, c, context.Background(), srv.URL+"/x")
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); line != "first\n" || err != nil {
		t.Fatalf("%q %v", line, err)
	}
	mux.Close()
	if _, err := br.ReadString('\n'); err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("read after the session ended: %v, want its failure", err)
	}
	resp.Body.Close()
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/x", nil)
	if late, err := c.RoundTrip(req); err == nil {
		late.Body.Close()
		t.Fatalf("after Close: %d, want an error", late.StatusCode)
	}
	if g, p := ct.requests(http.MethodGet), ct.requests(http.MethodPost); g != 0 || p != 2 {
		t.Fatalf("%d requests on their own stream and %d sessions asked for, want 0 and 2", g, p)
	}
}

// TestConnectionLost: when the connection to the server breaks (the
// replica was killed), every stream of its sessions fails at once.
func TestConnectionLost(t *testing.T) {
	conns := &trackingListener{}
	srv := httptest.NewUnstartedServer(nil)
	mux := &Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "first\n")
		http.NewResponseController(w).Flush()
		<-r.Context().Done()
	})}
	srv.Config.Handler = mux
	srv.Config.Protocols = serverProtocols()
	conns.Listener = srv.Listener
	srv.Listener = conns
	srv.Start()
	t.Cleanup(srv.Close)
	c, _ := client(t, 8)
	var bodies []*bufio.Reader
	for range 3 {
		resp := get(t, c, context.Background(), srv.URL+Path)
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		if line, err := br.ReadString('\n'); line != "first\n" || err != nil {
			t.Fatalf("%q %v", line, err)
		}
		bodies = append(bodies, br)
	}
	conns.closeAll()
	for i, br := range bodies {
		got := make(chan error, 1)
		go func() {
			_, err := br.ReadString('\n')
			got <- err
		}()
		select {
		case err := <-got:
			if err == nil || errors.Is(err, io.EOF) {
				t.Fatalf("stream %d after the connection broke: %v, want its failure", i, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("stream %d still open 10s after its connection broke", i)
		}
	}
}

// trackingListener records the connections it accepts, to break them.
type trackingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *trackingListener) closeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Close()
	}
}

// TestServerWithoutSessions: a server that answers the session's request
// with anything but a session gets every request on its own stream.
func TestServerWithoutSessions(t *testing.T) {
	srv, _ := serve(t, false, lines(3))
	c, ct := client(t, 8)
	for range 3 {
		resp := get(t, c, context.Background(), srv.URL+"/x?name=a")
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || strings.Count(string(b), "\n") != 3 {
			t.Fatalf("%q %v", b, err)
		}
	}
	if g, p := ct.requests(http.MethodGet), ct.requests(http.MethodPost); g != 3 || p != 1 {
		t.Fatalf("%d GETs on their own stream and %d sessions asked for, want 3 and 1", g, p)
	}
}

// TestOtherPathsGoToHandler: a request on its own HTTP/2 stream (a
// frontdoor that fell back to a watch per stream) reaches Handler as it
// came; a GET at Path is not a session.
func TestOtherPathsGoToHandler(t *testing.T) {
	srv, _ := serve(t, true, lines(2))
	rt := &http.Transport{Protocols: clientProtocols()}
	t.Cleanup(rt.CloseIdleConnections)
	for _, tc := range []struct {
		method, path string
		status       int
		body         string
	}{
		{http.MethodGet, "/api/v1/pods?name=a", http.StatusOK, "a 0 \na 1 x\n"},
		{http.MethodGet, Path, http.StatusMethodNotAllowed, "watchsession: POST over HTTP/2 only\n"},
	} {
		req, err := http.NewRequest(tc.method, srv.URL+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != tc.status || string(b) != tc.body {
			t.Fatalf("%s %s: %d %q %v, want %d %q", tc.method, tc.path, resp.StatusCode, b, err, tc.status, tc.body)
		}
		if resp.ProtoMajor != 2 {
			t.Fatalf("%s %s: HTTP/%d, want HTTP/2", tc.method, tc.path, resp.ProtoMajor)
		}
	}
}

// TestShutdownEndsSessions: after Shutdown, a stream opened on a session
// fails at once (the client retries it elsewhere), the session ends once
// its streams have, and a session asked for afterwards is refused.
func TestShutdownEndsSessions(t *testing.T) {
	stop := make(chan struct{})
	srv, mux := serve(t, true, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		select {
		case <-stop:
			io.WriteString(w, "bye\n")
		case <-r.Context().Done():
		}
	}))
	c, ct := client(t, 8)
	resp := get(t, c, context.Background(), srv.URL+"/x")
	mux.Shutdown()
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/x", nil)
	if late, err := c.RoundTrip(req); err == nil {
		late.Body.Close()
		t.Fatalf("a stream opened after Shutdown: %d, want an error", late.StatusCode)
	}
	close(stop)
	b, err := io.ReadAll(resp.Body)
	if string(b) != "bye\n" || err != nil {
		t.Fatalf("%q %v", b, err)
	}
	resp.Body.Close()
	c2, ct2 := client(t, 8)
	if late, err := c2.RoundTrip(req); err == nil {
		late.Body.Close()
		t.Fatalf("after Shutdown: %d, want the session refused", late.StatusCode)
	}
	if ct.requests(http.MethodGet)+ct2.requests(http.MethodGet) != 0 {
		t.Fatal("a refused session's request went on its own stream")
	}
}

// TestBadFrames: frames a peer may not send end the session.
func TestBadFrames(t *testing.T) {
	for _, tc := range []struct {
		name  string
		frame []byte
	}{
		{"unknown type", appendFrame(nil, 99, 1, nil)},
		{"data from the client", appendFrame(nil, frameData, 1, []byte("x"))},
		{"oversized open", appendFrame(nil, frameOpen, 1, make([]byte, maxHead+1))},
		{"credit of 3 bytes", appendFrame(nil, frameCredit, 1, []byte{0, 0, 1})},
		{"open that is not a request", appendFrame(nil, frameOpen, 1, []byte("hello\r\n\r\n"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, _ := serve(t, true, lines(1))
			tr := &http.Transport{Protocols: clientProtocols()}
			req, _ := http.NewRequest(http.MethodPost, srv.URL+Path, bytes.NewReader(tc.frame))
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			rest, err := io.ReadAll(resp.Body)
			if err != nil || len(rest) != 0 {
				t.Fatalf("the session sent %q (%v), want a clean end and nothing", rest, err)
			}
		})
	}
}

// serverProtocols and clientProtocols are fanout's and frontdoor's
// (libs/service): h2c in plaintext.
func serverProtocols() *http.Protocols {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetHTTP2(true)
	p.SetUnencryptedHTTP2(true)
	return p
}

func clientProtocols() *http.Protocols {
	p := new(http.Protocols)
	p.SetHTTP2(true)
	p.SetUnencryptedHTTP2(true)
	return p
}
