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
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

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
// body, in order.
func TestStreams(t *testing.T) {
	const streams, perStream = 40, 300
	srv, _ := serve(t, lines(perStream))
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
	if n := int(ct.dials.Load()); n < streams/16 {
		t.Errorf("%d sessions for %d streams of at most 16, want at least %d", n, streams, streams/16)
	}
}

// TestStatusPassesThrough: a response that is not 200 keeps its status,
// headers and body.
func TestStatusPassesThrough(t *testing.T) {
	srv, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusGone)
		io.WriteString(w, `{"kind":"Status","code":410}`)
	}))
	c, _ := client(t, 8)
	resp := get(t, c, context.Background(), srv.URL+"/x")
	defer resp.Body.Close()
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
	srv, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	srv, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	srv, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("name") == "abort" {
			panic(http.ErrAbortHandler)
		}
		io.WriteString(w, "ok\n")
	}))
	c, ct := client(t, 8)
	if resp, err := watch(c, context.Background(), srv.URL+"/x?name=abort"); err == nil {
		resp.Body.Close()
		t.Fatalf("aborted before its head: %d, want an error", resp.StatusCode)
	}
	resp := get(t, c, context.Background(), srv.URL+"/x")
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "ok\n" || err != nil || ct.dials.Load() != 1 {
		t.Fatalf("next request: %q %v, %d sessions", b, err, ct.dials.Load())
	}
}

// TestCancel: closing a body, or ending its request's context, ends the
// server's request context; the session stays for other streams.
func TestCancel(t *testing.T) {
	started := make(chan struct{}, 2)
	ended := make(chan struct{}, 2)
	srv, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	if n := ct.dials.Load(); n != 1 {
		t.Fatalf("%d sessions, want 1", n)
	}
}

// TestSessionEnds: when the server closes its sessions, a stream's body
// fails once what was sent is read, and the next request fails too (a
// closed server refuses sessions; frontdoor retries on another replica).
func TestSessionEnds(t *testing.T) {
	srv, mux := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	if late, err := watch(c, context.Background(), srv.URL+"/x"); err == nil {
		late.Body.Close()
		t.Fatalf("after Close: %d, want an error", late.StatusCode)
	}
	if n := ct.dials.Load(); n != 2 {
		t.Fatalf("%d sessions asked for, want 2", n)
	}
}

// TestConnectionLost: when the connection to the server breaks (the
// replica was killed), every stream of its sessions fails at once.
func TestConnectionLost(t *testing.T) {
	conns := &trackingListener{}
	srv := httptest.NewUnstartedServer(nil)
	mux := &Server{Handler: httpWatch{http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "first\n")
		http.NewResponseController(w).Flush()
		<-r.Context().Done()
	})}}
	srv.Config.Handler = mux
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

// TestOtherPathsGoToFallback: a request at another path goes to
// Fallback; one at Path that does not upgrade to a session is refused.
func TestOtherPathsGoToFallback(t *testing.T) {
	mux := &Server{Handler: httpWatch{lines(2)}, Fallback: lines(2)}
	srv := serveHandler(t, mux, mux)
	for _, tc := range []struct {
		path   string
		status int
		body   string
	}{
		{"/api/v1/pods?name=a", http.StatusOK, "a 0 \na 1 x\n"},
		{Path, http.StatusUpgradeRequired, "watchsession: a session is an HTTP/1.1 GET upgrading to " + Protocol + "\n"},
	} {
		resp, err := http.Get(srv.URL + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != tc.status || string(b) != tc.body {
			t.Fatalf("GET %s: %d %q %v, want %d %q", tc.path, resp.StatusCode, b, err, tc.status, tc.body)
		}
	}
}

// TestShutdownEndsSessions: after Shutdown, a stream opened on a session
// fails at once (the client retries it elsewhere), the session ends once
// its streams have, and a session asked for afterwards is refused.
func TestShutdownEndsSessions(t *testing.T) {
	stop := make(chan struct{})
	srv, mux := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		select {
		case <-stop:
			io.WriteString(w, "bye\n")
		case <-r.Context().Done():
		}
	}))
	c, _ := client(t, 8)
	resp := get(t, c, context.Background(), srv.URL+"/x")
	mux.Shutdown()
	if late, err := watch(c, context.Background(), srv.URL+"/x"); err == nil {
		late.Body.Close()
		t.Fatalf("a stream opened after Shutdown: %d, want an error", late.StatusCode)
	}
	close(stop)
	b, err := io.ReadAll(resp.Body)
	if string(b) != "bye\n" || err != nil {
		t.Fatalf("%q %v", b, err)
	}
	resp.Body.Close()
	c2, _ := client(t, 8)
	if late, err := watch(c2, context.Background(), srv.URL+"/x"); err == nil {
		late.Body.Close()
		t.Fatalf("after Shutdown: %d, want the session refused", late.StatusCode)
	}
	if !mux.Wait(10 * time.Second) {
		t.Fatal("sessions still served 10s after their streams ended")
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
		{"open that is not a request", appendFrame(nil, frameOpen, 1, []byte{0x0a, 0x05, 'a'})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, _ := serve(t, lines(1))
			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			io.WriteString(conn, "GET "+Path+" HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: "+Protocol+"\r\n\r\n")
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
				t.Fatalf("upgrade: %v %v", resp, err)
			}
			conn.Write(tc.frame)
			// The server closes the connection (with a reset if what it
			// did not read was still there).
			rest, err := io.ReadAll(br)
			if len(rest) != 0 || err != nil && !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("the session sent %q (%v), want an end and nothing", rest, err)
			}
		})
	}
}

// TestTraceFrames: a trace context written before an event's bytes reaches
// the client's trace hook, in order, from the read that returns those
// bytes (and not one before), and is no byte of the body.
func TestTraceFrames(t *testing.T) {
	srv, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := w.(SegmentWriter)
		w.WriteHeader(http.StatusOK)
		sw.WriteSegments([]Segment{{B: []byte("plain\n")}})
		sw.WriteSegments([]Segment{{Trace: "tp-1"}, {B: []byte("traced 1\n")}, {B: []byte("plain\n")}, {Trace: "tp-2"}, {B: []byte("traced 2\n")}})
	}))
	c, _ := client(t, 8)
	resp := get(t, c, context.Background(), srv.URL+"/x")
	defer resp.Body.Close()
	var got []string
	var body []byte
	resp.Body.(interface{ SetTraceHook(func(string)) }).SetTraceHook(func(tp string) {
		got = append(got, fmt.Sprintf("%s at %d", tp, len(body)))
	})
	buf := make([]byte, 4)
	for {
		n, err := resp.Body.Read(buf)
		body = append(body, buf[:n]...)
		if err != nil {
			break
		}
	}
	if string(body) != "plain\ntraced 1\nplain\ntraced 2\n" {
		t.Fatalf("body %q", body)
	}
	// The hook runs within the read (of 4 bytes) that returns the event's
	// first byte (at 6 and 21): the reads from 4 and from 20.
	if want := []string{"tp-1 at 4", "tp-2 at 20"}; !slices.Equal(got, want) {
		t.Fatalf("trace hook calls %q, want %q", got, want)
	}
}

// TestTLS: a session to an https server (one that also speaks HTTP/2, as
// fanout's port does) upgrades a TLS connection negotiated as HTTP/1.1.
func TestTLS(t *testing.T) {
	mux := &Server{Handler: httpWatch{lines(3)}}
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	c := &Client{TLS: srv.Client().Transport.(*http.Transport).TLSClientConfig, MaxStreams: 8}
	t.Cleanup(c.Close)
	resp := get(t, c, context.Background(), srv.URL+"/x?name=a")
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || string(b) != "a 0 \na 1 x\na 2 xx\n" {
		t.Fatalf("%q %v", b, err)
	}
}
