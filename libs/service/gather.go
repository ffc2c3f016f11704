package service

import (
	"net"
	"sync"
	"time"
)

// GatherWrites returns a listener whose connections gather writes that
// closely follow one another into one write to the socket (see gatherConn).
// hold 0 returns ln itself.
func GatherWrites(ln net.Listener, hold time.Duration) net.Listener {
	if hold <= 0 {
		return ln
	}
	return &gatherListener{Listener: ln, hold: hold}
}

type gatherListener struct {
	net.Listener
	hold time.Duration
}

func (l *gatherListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return newGatherConn(c, l.hold, time.Now, time.AfterFunc), nil
}

// gatherMax bounds what a connection holds: at that many bytes it is written
// at once.
const gatherMax = 64 << 10

// gatherBufs are the buffers of what connections hold, taken when a
// connection starts holding and returned once it is written: an idle
// connection holds none.
var gatherBufs = sync.Pool{New: func() any { b := make([]byte, 0, gatherMax+16<<10); return &b }}

// gatherConn is a server's end of a connection that carries many streams
// (an HTTP/2 connection from frontdoor to a fanout replica). A write that
// comes less than hold after the connection was last written to is held
// and goes out with the writes that follow it, in one write, hold after
// that last write (or once gatherMax bytes are held).
//
// Why: net/http's HTTP/2 server writes each frame it has for a stream as
// it comes, through a 4 KB buffer, so a connection carrying a hundred busy
// watches gets one or two small socket writes per frame; on loopback or a
// LAN each write costs the sender a system call and the receiver a wake-up
// and a read. Held for a millisecond, they go out several frames at a time.
//
// A quiet connection is written to at once: the first write after hold
// without writes passes straight through, so a single event is never
// delayed. Bytes keep their order (nothing passes while something is held),
// a held write reports success, and the error of a write that was held is
// returned by the next Write (HTTP/2 then ends the connection, as for any
// write error). Close writes what is held first (a GOAWAY, say).
type gatherConn struct {
	net.Conn
	hold      time.Duration
	now       func() time.Time
	afterFunc func(time.Duration, func()) *time.Timer

	mu    sync.Mutex
	buf   *[]byte   // what is held; nil when nothing is
	last  time.Time // when the socket was last written to
	timer *time.Timer
	armed bool
	err   error
}

func newGatherConn(c net.Conn, hold time.Duration, now func() time.Time, afterFunc func(time.Duration, func()) *time.Timer) *gatherConn {
	return &gatherConn{Conn: c, hold: hold, now: now, afterFunc: afterFunc}
}

func (c *gatherConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	now := c.now()
	if c.buf == nil && now.Sub(c.last) >= c.hold {
		c.last = now
		n, err := c.Conn.Write(b)
		c.err = err
		return n, err
	}
	if c.buf == nil {
		c.buf = gatherBufs.Get().(*[]byte)
	}
	*c.buf = append(*c.buf, b...)
	if len(*c.buf) >= gatherMax {
		if err := c.flushLocked(); err != nil {
			return 0, err
		}
		return len(b), nil
	}
	if !c.armed {
		c.armed = true
		c.timer = c.afterFunc(c.hold-now.Sub(c.last), c.flush)
	}
	return len(b), nil
}

// flush writes what is held (the timer's).
func (c *gatherConn) flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed = false
	if c.err == nil {
		c.flushLocked()
	}
}

func (c *gatherConn) flushLocked() error {
	if c.buf == nil {
		return nil
	}
	c.last = c.now()
	_, c.err = c.Conn.Write(*c.buf)
	if cap(*c.buf) <= 2*gatherMax {
		*c.buf = (*c.buf)[:0]
		gatherBufs.Put(c.buf)
	}
	c.buf = nil
	return c.err
}

// Close writes what is held (bounded by closeFlush), then closes the
// connection. A write in progress (blocked on a peer that does not read) is
// not waited for: closing the socket is what ends it.
func (c *gatherConn) Close() error {
	if c.mu.TryLock() {
		if c.timer != nil {
			c.timer.Stop()
			c.armed = false
		}
		if c.err == nil && c.buf != nil {
			c.Conn.SetWriteDeadline(c.now().Add(closeFlush))
			c.flushLocked()
		}
		c.err = net.ErrClosed
		c.mu.Unlock()
	}
	return c.Conn.Close()
}

// closeFlush bounds how long Close tries to write what is held.
const closeFlush = time.Second
