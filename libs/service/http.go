package service

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"
)

// ServerProtocols are the protocols of Herald's internal HTTP servers:
// HTTP/1.1, HTTP/2 over TLS, and HTTP/2 in plaintext (h2c, prior
// knowledge). HTTP/2 lets frontdoor carry many watches over one connection:
// per-connection HTTP/1.1 buffers would cost every idle watcher ~11 KB.
func ServerProtocols() *http.Protocols {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetHTTP2(true)
	p.SetUnencryptedHTTP2(true)
	return p
}

// ClientProtocols are the protocols of a client of ServerProtocols: HTTP/2
// only, h2c in plaintext, so that requests to one server share
// connections.
func ClientProtocols() *http.Protocols {
	p := new(http.Protocols)
	p.SetHTTP2(true)
	p.SetUnencryptedHTTP2(true)
	return p
}

// AcceptsGzip reports whether the request's Accept-Encoding names gzip.
func AcceptsGzip(r *http.Request) bool {
	for _, p := range strings.Split(r.Header.Get("Accept-Encoding"), ",") {
		if enc, _, _ := strings.Cut(strings.TrimSpace(p), ";"); enc == "gzip" {
			return true
		}
	}
	return false
}

// GzipResponse marks the response as gzipped (Content-Encoding, Vary) and
// returns the writer of its body, at the fastest level: Herald compresses
// to save bandwidth on large bodies, never at the cost of latency. Call it
// before WriteHeader; Close the writer to end the body.
func GzipResponse(w http.ResponseWriter) *gzip.Writer {
	w.Header().Set("Content-Encoding", "gzip")
	w.Header().Add("Vary", "Accept-Encoding")
	gz, _ := gzip.NewWriterLevel(w, gzip.BestSpeed) // BestSpeed is a valid level: no error
	return gz
}

// HTTPServer runs an http.Server as the parts of a lifecycle: Listen in
// starting (an address in use fails the start), Serve in running, Shutdown
// in stopping.
//
// Requests' contexts derive from a base context that Shutdown cancels
// first: watches never finish on their own, so they end at once (clients
// resume elsewhere) while other requests get Grace to finish.
type HTTPServer struct {
	Server *http.Server
	Addr   string
	// TLS: serve TLS with Server.TLSConfig.
	TLS bool
	// Grace bounds how long Shutdown waits for requests in flight.
	Grace time.Duration
	// WriteHold: connections gather writes that follow their last write
	// by less than this into one (GatherWrites); 0: every write at once.
	WriteHold time.Duration

	ln         net.Listener
	cancelBase context.CancelFunc
	served     chan error
}

// Listen opens the listening socket.
func (h *HTTPServer) Listen() error {
	ln, err := net.Listen("tcp", h.Addr)
	if err != nil {
		return fmt.Errorf("listener: %w", err)
	}
	h.ln = GatherWrites(ln, h.WriteHold)
	return nil
}

// ListenAddr is the address listened on, once Listen has returned.
func (h *HTTPServer) ListenAddr() string { return h.ln.Addr().String() }

// Serve serves until ctx ends (nil) or serving fails.
func (h *HTTPServer) Serve(ctx context.Context) error {
	base, cancel := context.WithCancel(context.Background())
	h.cancelBase = cancel
	h.Server.BaseContext = func(net.Listener) context.Context { return base }
	h.served = make(chan error, 1)
	go func() {
		var err error
		if h.TLS {
			err = h.Server.ServeTLS(h.ln, "", "")
		} else {
			err = h.Server.Serve(h.ln)
		}
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		h.served <- err
	}()
	select {
	case <-ctx.Done():
		return nil
	case err := <-h.served:
		h.served <- err
		return err
	}
}

// Shutdown ends the requests in flight (watches at once, others within
// Grace) and closes the listener.
func (h *HTTPServer) Shutdown() error {
	if h.cancelBase == nil { // Serve never ran
		if h.ln != nil {
			return h.ln.Close()
		}
		return nil
	}
	h.cancelBase()
	ctx, cancel := context.WithTimeout(context.Background(), h.Grace)
	defer cancel()
	err := h.Server.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		err = h.Server.Close()
	}
	<-h.served
	return err
}
