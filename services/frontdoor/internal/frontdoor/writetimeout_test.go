package frontdoor

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"

	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// bigCache answers every LIST with 8 MiB of pods: more than the socket
// buffers of a loopback connection hold (at most 4 MiB sent, plus the small
// receive buffer of the test's clients).
type bigCache struct{ fakeCache }

func (bigCache) List(context.Context, *heraldv1.ListRequest, ...grpc.CallOption) (*heraldv1.ListResponse, error) {
	item := []byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"ns1","resourceVersion":"7","annotations":{"pad":"` + strings.Repeat("x", 8<<10) + `"}}}`)
	items := make([][]byte, 1024)
	for i := range items {
		items[i] = item
	}
	return &heraldv1.ListResponse{Revision: 7, Items: items}, nil
}

// nonReadingClient sends requests over proto and never reads the
// response's body: a TCP receive buffer of 4 KiB, and over HTTP/2 the
// smallest flow-control windows, which are never replenished.
func nonReadingClient(proto string) *http.Client {
	tr := &http.Transport{
		TLSClientConfig:    &tls.Config{InsecureSkipVerify: true}, // the test's own server
		DisableCompression: true,                                  // a gzipped body would fit the buffers
		Protocols:          new(http.Protocols),
		HTTP2:              &http.HTTP2Config{MaxReceiveBufferPerConnection: 64 << 10, MaxReceiveBufferPerStream: 64 << 10},
		DialContext: (&net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
			return c.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		}}).DialContext,
	}
	if proto == "HTTP/2.0" {
		tr.Protocols.SetHTTP2(true)
	} else {
		tr.Protocols.SetHTTP1(true)
	}
	return &http.Client{Transport: tr}
}

// TestWriteTimeout: LIST clients that stop reading a large response are cut
// after write-timeout, over HTTP/1.1 and HTTP/2; their request slots
// return, and each cut is counted.
func TestWriteTimeout(t *testing.T) {
	const clients, timeout = 4, 300 * time.Millisecond
	s, _ := testServer(t, "", func(c *Config) { c.WriteTimeout = timeout })
	s.cache = bigCache{}
	srv := s.HTTPServer()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.ServeTLS(ln, "", "")
	defer srv.Close()
	url := "https://" + ln.Addr().String() + "/api/v1/pods"

	for i, proto := range []string{"HTTP/1.1", "HTTP/2.0"} {
		var bodies []io.ReadCloser
		var sent []time.Time // before each request: its deadline cannot pass before sent+timeout
		for range clients {
			req, _ := http.NewRequest(http.MethodGet, url, nil)
			req.Header.Set("Authorization", "Bearer "+tokAdmin)
			sent = append(sent, time.Now())
			resp, err := nonReadingClient(proto).Do(req)
			if err != nil {
				t.Fatalf("%s: %v", proto, err)
			}
			if resp.StatusCode != 200 || resp.Proto != proto {
				t.Fatalf("%s: %d over %s", proto, resp.StatusCode, resp.Proto)
			}
			bodies = append(bodies, resp.Body)
		}
		began := time.Now()
		// A slot is released before its cut is counted: wait for both.
		want := float64(clients * (i + 1))
		for {
			inUse, cut := s.requests.InUse(), testutil.ToFloat64(s.m.writeTimeouts)
			now := time.Now()
			due := 0
			for _, at := range sent {
				if !at.Add(timeout).After(now) {
					due++
				}
			}
			if cut-float64(clients*i) > float64(due) {
				t.Fatalf("%s: %v responses cut, only %d can have reached the write timeout", proto, cut-float64(clients*i), due)
			}
			if inUse == 0 && cut >= want {
				if cut != want {
					t.Fatalf("%s: %v write timeouts counted, want %v", proto, cut, want)
				}
				break
			}
			if time.Since(began) > 10*time.Second {
				t.Fatalf("%s: %d request slots still held, %v write timeouts counted (want %v) %s after the clients stopped reading (write-timeout %s)", proto, inUse, cut, want, time.Since(began), timeout)
			}
			time.Sleep(10 * time.Millisecond) // polling a condition with a deadline
		}
		for _, b := range bodies {
			n, err := io.Copy(io.Discard, b)
			if err == nil || errors.Is(err, io.EOF) {
				t.Fatalf("%s: the body was read whole (%d bytes) after the deadline; want a cut", proto, n)
			}
			b.Close()
		}
	}
}
