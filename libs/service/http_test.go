package service

import (
	"compress/gzip"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"google.golang.org/grpc"
)

func TestAcceptsGzip(t *testing.T) {
	for _, tc := range []struct {
		header string
		want   bool
	}{
		{"", false},
		{"gzip", true},
		{"deflate, gzip;q=0.5", true},
		{" br , gzip ", true},
		{"gzipx", false},
		{"identity", false},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("Accept-Encoding", tc.header)
		if got := AcceptsGzip(r); got != tc.want {
			t.Errorf("Accept-Encoding %q: %v, want %v", tc.header, got, tc.want)
		}
	}
}

func TestGzipResponse(t *testing.T) {
	w := httptest.NewRecorder()
	gz := GzipResponse(w)
	io.WriteString(gz, "hello")
	gz.Close()
	if w.Header().Get("Content-Encoding") != "gzip" || w.Header().Get("Vary") != "Accept-Encoding" {
		t.Errorf("headers %v", w.Header())
	}
	zr, err := gzip.NewReader(w.Body)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(zr); string(b) != "hello" {
		t.Errorf("body %q", b)
	}
}

// HTTPServer's stop ends long requests (watches) at once through their
// context, and serves HTTP/2 in plaintext to ClientProtocols clients.
func TestHTTPServerLifecycle(t *testing.T) {
	ctx := within(t)
	inWatch := make(chan struct{})
	h := &HTTPServer{Addr: "127.0.0.1:0", Grace: 10 * time.Second, Server: &http.Server{
		Protocols: ServerProtocols(),
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Proto", r.Proto)
			w.WriteHeader(http.StatusOK)
			http.NewResponseController(w).Flush()
			if r.URL.Path == "/watch" {
				close(inWatch)
				<-r.Context().Done()
			}
		}),
	}}
	svc := NewService("http", func(context.Context) error { return h.Listen() }, h.Serve, func(error) error { return h.Shutdown() })
	if err := svc.StartAsync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := svc.AwaitRunning(ctx); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{Protocols: ClientProtocols()}}
	resp, err := client.Get("http://" + h.ListenAddr() + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Header.Get("X-Proto") != "HTTP/2.0" {
		t.Errorf("protocol %q, want HTTP/2.0 (h2c)", resp.Header.Get("X-Proto"))
	}
	watch, err := client.Get("http://" + h.ListenAddr() + "/watch")
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Body.Close()
	<-inWatch
	svc.StopAsync()
	if err := svc.AwaitTerminated(ctx); err != nil {
		t.Fatal(err)
	}
	// Stop returned within the test's bound, well before Grace: the watch
	// ended with its context.
	io.ReadAll(watch.Body)
	if _, err := net.Dial("tcp", h.ListenAddr()); err == nil {
		t.Error("still listening after the stop")
	}
}

func TestHTTPServerAddressInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	h := &HTTPServer{Addr: ln.Addr().String(), Server: &http.Server{}}
	if err := h.Listen(); err == nil {
		t.Error("listening on an address in use")
	}
	if err := h.Shutdown(); err != nil {
		t.Error(err)
	}
}

// CacheConns are ready once every target has been reached, and stay ready.
func TestCacheConnsConnected(t *testing.T) {
	ctx := within(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	go srv.Serve(ln)
	defer srv.Stop()

	conns := NewCacheConns(nil, 1<<20)
	defer conns.Close()
	if err := conns.Connected(); err != nil {
		t.Errorf("no target: %v", err)
	}
	conn, err := conns.Dial(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := conns.Dial(ln.Addr().String()); again != conn {
		t.Error("a second Dial of a target made a second connection")
	}
	for conns.Connected() != nil {
		if !conn.WaitForStateChange(ctx, conn.GetState()) {
			t.Fatalf("never connected: %v", conns.Connected())
		}
	}
	srv.Stop()
	if err := conns.Connected(); err != nil {
		t.Errorf("a shard lost after it was reached made the client unready: %v", err)
	}
	if _, err := conns.Dial("127.0.0.1:1"); err != nil {
		t.Fatal(err)
	}
	if err := conns.Connected(); err == nil {
		t.Error("ready with a shard never reached")
	}
}
