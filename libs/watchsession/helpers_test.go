package watchsession

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync/atomic"
	"testing"

	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// httpWatch serves a stream's watch with an http.Handler, as a request
// for the path in the request's resource, with its name as the name
// parameter and its Accept header: the tests' handlers are written so.
type httpWatch struct{ h http.Handler }

func (hw httpWatch) ServeWatch(ctx context.Context, w http.ResponseWriter, req *heraldv1.WatchStreamRequest) {
	r := httptest.NewRequest(http.MethodGet, req.Resource+"?name="+url.QueryEscape(req.Name), nil).WithContext(ctx)
	r.Header.Set("Accept", req.Accept)
	hw.h.ServeHTTP(w, r)
}

// serve starts a server (as a fanout replica's) whose sessions serve h.
func serve(t testing.TB, h http.Handler) (*httptest.Server, *Server) {
	t.Helper()
	mux := &Server{Handler: httpWatch{h}}
	return serveHandler(t, mux, mux), mux
}

// serveHandler serves root on a test server (HTTP/1.1 and h2c, as fanout
// does); mux, if not nil, shuts down with it.
func serveHandler(t testing.TB, root http.Handler, mux *Server) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(root)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	if mux != nil {
		srv.Config.RegisterOnShutdown(mux.Shutdown)
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// wire counts a client's sessions (connections dialled) and the bytes it
// read from them.
type wire struct {
	dials atomic.Int32
	bytes atomic.Int64
}

func (w *wire) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	w.dials.Add(1)
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, n: &w.bytes}, nil
}

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func client(t *testing.T, maxStreams int) (*Client, *wire) {
	return newClient(t, maxStreams, 0)
}

func newClient(t *testing.T, maxStreams, window int) (*Client, *wire) {
	w := &wire{}
	c := &Client{Dial: w.dial, MaxStreams: maxStreams, SharedWindow: window}
	t.Cleanup(c.Close)
	return c, w
}

// watch opens a stream for the watch at rawURL: its path is the request's
// resource, its name parameter the request's name.
func watch(c *Client, ctx context.Context, rawURL string) (*http.Response, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	return c.Watch(ctx, u, &heraldv1.WatchStreamRequest{Resource: u.Path, Name: u.Query().Get("name"), Accept: "application/json"})
}

func get(t *testing.T, c *Client, ctx context.Context, rawURL string) *http.Response {
	t.Helper()
	resp, err := watch(c, ctx, rawURL)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// fakeServer is a server that upgrades a session, answering window (""
// for none), and then runs serve on the connection: a replica that breaks
// the protocol.
func fakeServer(t *testing.T, window string, serve func(conn net.Conn, br *bufio.Reader)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				br := bufio.NewReader(conn)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				req.Body.Close()
				head := "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + Protocol + "\r\n"
				if window != "" {
					head += WindowHeader + ": " + window + "\r\n"
				}
				if _, err := conn.Write([]byte(head + "\r\n")); err != nil {
					return
				}
				serve(conn, br)
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

// readOpen reads a stream's open frame from a client.
func readOpen(br *bufio.Reader) error {
	_, _, n, err := readHeader(br)
	if err == nil {
		_, err = br.Discard(n)
	}
	return err
}
