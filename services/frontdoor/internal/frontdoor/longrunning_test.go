package frontdoor

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// streamingKube is fakeKube whose pod logs and watches stream: lines
// lines (0: until the request ends), one every interval, each flushed, or
// (chunk > 0) chunk-byte writes back to back. ended receives each streamed
// request's end.
type streamingKube struct {
	*fakeKube
	lines    int
	interval time.Duration
	chunk    int
	ended    chan struct{}
}

func newStreamingKube(t *testing.T, lines int, interval time.Duration) *streamingKube {
	k := &streamingKube{fakeKube: &fakeKube{}, lines: lines, interval: interval, ended: make(chan struct{}, 16)}
	k.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		streams := strings.HasSuffix(r.URL.Path, "/log") || r.URL.Query().Get("watch") == "true"
		if !streams || r.Header.Get("Authorization") != "Bearer "+heraldToken {
			k.serve(w, r)
			return
		}
		defer func() { k.ended <- struct{}{} }()
		w.Header().Set("Content-Type", "text/plain")
		rc := http.NewResponseController(w)
		for i := 1; k.lines == 0 || i <= k.lines; i++ {
			if i > 1 && k.chunk == 0 {
				select {
				case <-time.After(k.interval): // the stream's pace, not synchronization
				case <-r.Context().Done():
					return
				}
			}
			var err error
			if k.chunk > 0 {
				_, err = w.Write(bytes.Repeat([]byte{'x'}, k.chunk))
			} else {
				_, err = fmt.Fprintf(w, "line %d\n", i)
			}
			if err != nil || rc.Flush() != nil {
				return
			}
		}
	}))
	t.Cleanup(k.srv.Close)
	return k
}

// serveTLS runs s on a real listener (deadlines are the connection's).
func serveTLS(t *testing.T, s *Server) string {
	t.Helper()
	srv := s.HTTPServer()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	return "https://" + ln.Addr().String()
}

func clientFor(proto string) *http.Client {
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, Protocols: new(http.Protocols)} // the test's own server
	if proto == "HTTP/2.0" {
		tr.Protocols.SetHTTP2(true)
	} else {
		tr.Protocols.SetHTTP1(true)
	}
	return &http.Client{Transport: tr}
}

// forwardedStreams are long-running requests frontdoor forwards: a pod's
// log (followed) and a watch of a resource the cache does not hold.
var forwardedStreams = []string{
	"/api/v1/namespaces/ns1/pods/p/log?follow=true",
	"/apis/example.com/v1/namespaces/ns1/widgets?watch=true",
}

// TestForwardedStreamOutlivesWriteTimeout (issue 53, point 5): a forwarded
// long-running response that writes regularly, or after idle gaps longer
// than write-timeout, arrives whole over HTTP/1.1 and HTTP/2, however
// much longer than write-timeout it lasts; nothing is counted as a write
// timeout.
func TestForwardedStreamOutlivesWriteTimeout(t *testing.T) {
	const timeout = time.Second
	for _, pace := range []struct {
		name     string
		lines    int
		interval time.Duration
	}{
		{"regular", 10, 300 * time.Millisecond}, // 2.7 s
		{"idle-gaps", 3, 1400 * time.Millisecond},
	} {
		t.Run(pace.name, func(t *testing.T) {
			t.Parallel()
			k := newStreamingKube(t, pace.lines, pace.interval)
			s := clusterServer(t, k.srv.URL, k.caPEM(), func(c *Config) { c.WriteTimeout = timeout })
			base := serveTLS(t, s)
			var want strings.Builder
			for i := 1; i <= pace.lines; i++ {
				fmt.Fprintf(&want, "line %d\n", i)
			}
			for _, proto := range []string{"HTTP/1.1", "HTTP/2.0"} {
				for _, path := range forwardedStreams {
					req, _ := http.NewRequest(http.MethodGet, base+path, nil)
					req.Header.Set("Authorization", "Bearer "+tokAdmin)
					start := time.Now()
					resp, err := clientFor(proto).Do(req)
					if err != nil {
						t.Fatalf("%s %s: %v", proto, path, err)
					}
					b, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 || resp.Proto != proto || err != nil || string(b) != want.String() {
						t.Errorf("%s %s: %d over %s after %s, read error %v, got %d of %d lines:\n%s",
							proto, path, resp.StatusCode, resp.Proto, time.Since(start).Round(time.Millisecond), err,
							strings.Count(string(b), "\n"), pace.lines, b)
					}
				}
			}
			if n := testutil.ToFloat64(s.m.writeTimeouts); n != 0 {
				t.Errorf("%v write timeouts counted", n)
			}
		})
	}
}

// TestForwardedStreamSlowReader: a client that stops reading a forwarded
// long-running response is still cut, within write-timeout of the write
// that blocks, and the upstream request ends with it.
func TestForwardedStreamSlowReader(t *testing.T) {
	const timeout = 300 * time.Millisecond
	k := newStreamingKube(t, 0, 0)
	k.chunk = 32 << 10
	s := clusterServer(t, k.srv.URL, k.caPEM(), func(c *Config) { c.WriteTimeout = timeout })
	base := serveTLS(t, s)
	for i, proto := range []string{"HTTP/1.1", "HTTP/2.0"} {
		req, _ := http.NewRequest(http.MethodGet, base+forwardedStreams[i], nil)
		req.Header.Set("Authorization", "Bearer "+tokAdmin)
		resp, err := nonReadingClient(proto).Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %v %v", proto, resp, err)
		}
		select {
		case <-k.ended:
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: the upstream stream still runs 20 s after the client stopped reading (write-timeout %s)", proto, timeout)
		}
		if n, err := io.Copy(io.Discard, resp.Body); err == nil {
			t.Errorf("%s: the endless stream ended cleanly after %d bytes; want a cut", proto, n)
		}
		resp.Body.Close()
		// The handler counts the cut once it returns (after the upstream's
		// end): poll that with a deadline.
		for deadline := time.Now().Add(10 * time.Second); testutil.ToFloat64(s.m.writeTimeouts) != float64(i+1); {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %v write timeouts counted, want %d", proto, testutil.ToFloat64(s.m.writeTimeouts), i+1)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
