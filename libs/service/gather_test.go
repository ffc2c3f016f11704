package service

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"
)

// recordConn records every write that reaches the socket.
type recordConn struct {
	net.Conn
	mu     sync.Mutex
	writes [][]byte
	fail   error
	closed bool
}

func (r *recordConn) Write(b []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return 0, r.fail
	}
	r.writes = append(r.writes, bytes.Clone(b))
	return len(b), nil
}

func (r *recordConn) Close() error { r.closed = true; return nil }

func (r *recordConn) SetWriteDeadline(time.Time) error { return nil }

// fakeTimer stands in for the connection's timer: it records each wait and
// fires when the test says so.
type fakeTimer struct {
	waits []time.Duration
	fn    func()
}

func (f *fakeTimer) newTimer(d time.Duration, fn func()) gatherTimer {
	f.waits = append(f.waits, d)
	f.fn = fn
	return f
}

func (f *fakeTimer) Reset(d time.Duration) bool { f.waits = append(f.waits, d); return false }
func (f *fakeTimer) Stop() bool                 { return false }

func newTestGather(hold time.Duration) (*gatherConn, *recordConn, *time.Time, *fakeTimer) {
	rec := &recordConn{}
	now := time.Unix(1000, 0)
	ft := &fakeTimer{}
	c := newGatherConn(rec, hold, func() time.Time { return now }, ft.newTimer)
	return c, rec, &now, ft
}

func TestGatherQuietWriteGoesAtOnce(t *testing.T) {
	c, rec, now, ft := newTestGather(time.Millisecond)
	for i := range 3 {
		if n, err := c.Write([]byte{byte(i)}); n != 1 || err != nil {
			t.Fatalf("write %d: %d, %v", i, n, err)
		}
		if len(rec.writes) != i+1 {
			t.Fatalf("write %d after a quiet hold was not written at once: %d socket writes", i, len(rec.writes))
		}
		*now = now.Add(time.Millisecond)
	}
	if len(ft.waits) != 0 {
		t.Fatalf("a quiet connection armed a timer: %v", ft.waits)
	}
}

func TestGatherBusyWritesGoTogether(t *testing.T) {
	c, rec, now, ft := newTestGather(time.Millisecond)
	c.Write([]byte("a")) // quiet: at once
	*now = now.Add(200 * time.Microsecond)
	c.Write([]byte("bc"))
	*now = now.Add(300 * time.Microsecond)
	c.Write([]byte("def"))
	if len(rec.writes) != 1 {
		t.Fatalf("busy writes reached the socket before the hold ended: %q", rec.writes)
	}
	if len(ft.waits) != 1 || ft.waits[0] != 800*time.Microsecond {
		t.Fatalf("timer waits %v, want one of 800µs (the rest of the hold after the last socket write)", ft.waits)
	}
	ft.fn()
	if len(rec.writes) != 2 || string(rec.writes[1]) != "bcdef" {
		t.Fatalf("socket writes %q, want [a bcdef]", rec.writes)
	}
	// Right after that write the connection is busy again.
	c.Write([]byte("g"))
	if len(rec.writes) != 2 || len(ft.waits) != 2 || ft.waits[1] != time.Millisecond {
		t.Fatalf("socket writes %q, timer waits %v", rec.writes, ft.waits)
	}
	// Once it has been quiet for the hold, the timer's write goes first and
	// a new write goes straight through, in order.
	ft.fn()
	*now = now.Add(time.Millisecond)
	c.Write([]byte("h"))
	if got := fmt.Sprintf("%q", rec.writes); got != `["a" "bcdef" "g" "h"]` {
		t.Fatalf("socket writes %s", got)
	}
}

func TestGatherWritesAtTheBound(t *testing.T) {
	c, rec, now, ft := newTestGather(time.Millisecond)
	c.Write([]byte("x"))
	chunk := bytes.Repeat([]byte("y"), 4096)
	for range gatherMax / len(chunk) {
		*now = now.Add(time.Microsecond)
		if len(rec.writes) != 1 {
			t.Fatalf("written before the bound: %d socket writes", len(rec.writes))
		}
		c.Write(chunk)
	}
	if len(rec.writes) != 2 || len(rec.writes[1]) != gatherMax {
		t.Fatalf("socket writes of %d bytes at the bound, want one of %d", len(rec.writes[len(rec.writes)-1]), gatherMax)
	}
	// The timer armed before the bound still fires, and writes what was
	// held after it.
	*now = now.Add(time.Microsecond)
	c.Write([]byte("z"))
	if len(rec.writes) != 2 || len(ft.waits) != 1 {
		t.Fatalf("after the bound: %d socket writes, timer waits %v", len(rec.writes), ft.waits)
	}
	ft.fn()
	if len(rec.writes) != 3 || string(rec.writes[2]) != "z" {
		t.Fatalf("the pending timer did not write what was held after the bound: %d socket writes", len(rec.writes))
	}
}

// Close does not wait on a write blocked by a peer that does not read: it
// ends it within closeFlush, and the write reports the failure.
func TestGatherCloseEndsABlockedWrite(t *testing.T) {
	server, client := net.Pipe() // nothing reads client
	defer client.Close()
	c := newGatherConn(server, time.Millisecond, time.Now, realTimer)
	failed := make(chan error, 1)
	go func() {
		_, err := c.Write([]byte("never read"))
		failed <- err
	}()
	// Close may come before the write starts; either way it returns and the
	// write fails.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-failed; err == nil {
		t.Fatal("a write to a peer that never read succeeded")
	}
}

func TestGatherCloseWritesWhatIsHeld(t *testing.T) {
	c, rec, now, _ := newTestGather(time.Millisecond)
	c.Write([]byte("a"))
	*now = now.Add(time.Microsecond)
	c.Write([]byte("goaway"))
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if len(rec.writes) != 2 || string(rec.writes[1]) != "goaway" || !rec.closed {
		t.Fatalf("socket writes %q, closed %v", rec.writes, rec.closed)
	}
	if _, err := c.Write([]byte("late")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after close: %v", err)
	}
}

func TestGatherHeldWriteErrorIsReturnedNext(t *testing.T) {
	c, rec, now, ft := newTestGather(time.Millisecond)
	c.Write([]byte("a"))
	*now = now.Add(time.Microsecond)
	if _, err := c.Write([]byte("b")); err != nil {
		t.Fatalf("held write: %v", err)
	}
	boom := errors.New("connection reset")
	rec.fail = boom
	ft.fn()
	if !rec.closed {
		t.Fatal("the timer's write failed and the connection was left open")
	}
	if _, err := c.Write([]byte("c")); !errors.Is(err, boom) {
		t.Fatalf("write after a held write failed: %v, want %v", err, boom)
	}
}

// Close writes what a failed write left held (TLS makes its last writes fail
// with a past deadline just before it closes): with its own deadline, once.
func TestGatherCloseRetriesWhatAFailedWriteLeft(t *testing.T) {
	c, rec, now, ft := newTestGather(time.Millisecond)
	c.Write([]byte("a"))
	*now = now.Add(time.Microsecond)
	c.Write([]byte("alert"))
	rec.fail = os.ErrDeadlineExceeded
	ft.fn()
	rec.fail = nil
	rec.closed = false
	c.Close()
	if got := fmt.Sprintf("%q", rec.writes); got != `["a" "alert"]` || !rec.closed {
		t.Fatalf("socket writes %s, closed %v", got, rec.closed)
	}
}

// TestGatherHTTP2 serves many concurrent HTTP/2 streams over one gathering
// h2c connection, each streaming numbered chunks as a watch does, and checks
// every stream receives all of its bytes in order (a held write that was
// never sent would hang the test).
func TestGatherHTTP2(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const streams, chunks = 50, 200
	srv := &http.Server{
		Protocols: ServerProtocols(),
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			for i := range chunks {
				fmt.Fprintf(w, "%s-%d\n", r.URL.Path, i)
				http.NewResponseController(w).Flush()
			}
		}),
	}
	counted := &countingListener{Listener: ln}
	go srv.Serve(GatherWrites(counted, 2*time.Millisecond))
	t.Cleanup(func() { srv.Close() })
	tr := &http.Transport{Protocols: ClientProtocols()}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make(chan error, streams)
	for s := range streams {
		go func() {
			path := fmt.Sprintf("/s%d", s)
			req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+ln.Addr().String()+path, nil)
			resp, err := client.Do(req)
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			if resp.ProtoMajor != 2 {
				errs <- fmt.Errorf("%s: %s, want HTTP/2", path, resp.Proto)
				return
			}
			got, err := io.ReadAll(resp.Body)
			if err != nil {
				errs <- fmt.Errorf("%s: %w", path, err)
				return
			}
			var want bytes.Buffer
			for i := range chunks {
				fmt.Fprintf(&want, "%s-%d\n", path, i)
			}
			if !bytes.Equal(got, want.Bytes()) {
				errs <- fmt.Errorf("%s: got %d bytes, not the %d sent in order", path, len(got), want.Len())
				return
			}
			errs <- nil
		}()
	}
	for range streams {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// Every chunk was flushed as a frame of its own; the sockets got them
	// gathered.
	conns, writes := counted.counts()
	if writes >= streams*chunks {
		t.Fatalf("%d connections, %d socket writes for %d frames", conns, writes, streams*chunks)
	}
}

// countingListener counts its connections and their writes.
type countingListener struct {
	net.Listener
	mu            sync.Mutex
	conns, writes int
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.conns++
	l.mu.Unlock()
	return &countingConn{Conn: c, l: l}, nil
}

func (l *countingListener) counts() (conns, writes int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conns, l.writes
}

type countingConn struct {
	net.Conn
	l *countingListener
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.l.mu.Lock()
	c.l.writes++
	c.l.mu.Unlock()
	return c.Conn.Write(b)
}
