package upstream

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"
)

// Long-running forwarded requests (cluster mode): watches of what Herald
// does not serve, exec, attach, port-forward, logs and proxy stream for as
// long as the client, kube-apiserver or the kubelet keep them open, so the
// write-timeout that bounds every other response from its first byte
// (statusRecorder) would cut them at their first write after it. They are
// recognized exactly as kube-apiserver recognizes them (its LongRunningFunc,
// pkg/controlplane/apiserver), and bounded by rules of their own:
//
//   - each write (and the flush that sends it) must complete within
//     write-timeout, so a client that stops reading is still cut, however
//     long the stream has run; an idle stream has no deadline (HTTP/2
//     would reset an idle stream at a deadline left armed, so it is
//     cleared after every write);
//   - the whole request lasts at most upstream.long-running-timeout; then
//     the response ends as the upstream's end would (cleanly: a watch
//     client watches again, kubectl logs -f returns), and an upgraded
//     stream (exec, attach, port-forward) is closed.
//
// kube-apiserver's own limits still apply upstream (a watch's timeout,
// the kubelet's streaming idle timeout).

// ErrStreamLifetime ends a forwarded long-running request that reached
// upstream.long-running-timeout.
var ErrStreamLifetime = errors.New("long-running request reached upstream.long-running-timeout")

// StreamWriter is a long-running response's writer: every write and flush
// must complete within timeout of its start; between writes there is no
// deadline. An upgraded connection (Hijack) keeps the rule for its writes.
type StreamWriter struct {
	rec      http.ResponseWriter
	rc       *http.ResponseController
	timeout  time.Duration
	deadline time.Time // of the write under way; zero between writes
	timedOut atomic.Bool
}

// NewStreamWriter bounds each write of rec's long-running response by
// timeout.
func NewStreamWriter(rec http.ResponseWriter, timeout time.Duration) *StreamWriter {
	return &StreamWriter{rec: rec, rc: http.NewResponseController(rec), timeout: timeout}
}

func (w *StreamWriter) Header() http.Header { return w.rec.Header() }

// WriteHeader sends nothing yet but an informational answer (HTTP/1.1
// writes a 1xx at once): the final header goes out with the next flush.
func (w *StreamWriter) WriteHeader(code int) {
	if code >= 100 && code < 200 {
		w.arm()
		w.rec.WriteHeader(code)
		w.disarm()
		return
	}
	w.rec.WriteHeader(code)
}

func (w *StreamWriter) Write(b []byte) (int, error) {
	w.deadline = time.Time{} // one left by a write not flushed is not this write's
	w.arm()
	n, err := w.rec.Write(b)
	if err != nil {
		w.failed()
	}
	return n, err
}

// FlushError sends what was written (the proxy flushes after every write);
// the write's deadline is cleared once it has gone out.
func (w *StreamWriter) FlushError() error {
	w.arm()
	if err := w.rc.Flush(); err != nil {
		w.failed()
		return err
	}
	w.disarm()
	return nil
}

func (w *StreamWriter) Unwrap() http.ResponseWriter { return w.rec }

// Hijack hands an upgraded connection (exec, attach, port-forward) to the
// proxy, with each write to the client bounded by timeout.
func (w *StreamWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := w.rc.Hijack()
	if err != nil {
		return nil, nil, err
	}
	return &writeDeadlineConn{Conn: c, timeout: w.timeout, timedOut: &w.timedOut}, brw, nil
}

func (w *StreamWriter) arm() {
	if w.deadline.IsZero() {
		w.deadline = time.Now().Add(w.timeout)
		// Unsupported only by writers that are not a connection's (tests).
		_ = w.rc.SetWriteDeadline(w.deadline)
	}
}

func (w *StreamWriter) disarm() {
	if !w.deadline.IsZero() {
		w.deadline = time.Time{}
		_ = w.rc.SetWriteDeadline(time.Time{})
	}
}

func (w *StreamWriter) failed() {
	if !w.deadline.IsZero() && !time.Now().Before(w.deadline) {
		w.timedOut.Store(true)
	}
}

// writeDeadlineConn bounds each write to an upgraded connection by
// timeout. A connection's deadline only affects the I/O under way and
// later, so a deadline that passed while the stream was idle is harmless:
// the next write sets its own first.
type writeDeadlineConn struct {
	net.Conn
	timeout  time.Duration
	timedOut *atomic.Bool
}

func (c *writeDeadlineConn) Write(b []byte) (int, error) {
	if err := c.Conn.SetWriteDeadline(time.Now().Add(c.timeout)); err != nil {
		return 0, err
	}
	n, err := c.Conn.Write(b)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		c.timedOut.Store(true)
	}
	return n, err
}

// endAtLifetime makes a forwarded response end cleanly (io.EOF) when its
// request reached upstream.long-running-timeout, rather than with the
// read error the cancellation gives, which would abort the client's
// stream as if the upstream had failed.
type endAtLifetime struct {
	io.ReadCloser
	ctx context.Context
}

func (b *endAtLifetime) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF && context.Cause(b.ctx) == ErrStreamLifetime {
		return n, io.EOF
	}
	return n, err
}

// TimedOut reports whether a write failed past its deadline.
func (w *StreamWriter) TimedOut() bool { return w.timedOut.Load() }
