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
	return newGatherConn(c, l.hold, time.Now, realTimer), nil
}

const (
	// gatherMax bounds what a connection holds: at that many bytes it is
	// written at once.
	gatherMax = 64 << 10
	// closeFlush bounds how long Close (and CloseWrite) may spend writing
	// what is held, and so how long a write blocked on a peer that does not
	// read delays them.
	closeFlush = 100 * time.Millisecond
)

// gatherBufs are the buffers of what connections hold, taken when a
// connection starts holding and returned once it is written: an idle
// connection holds none.
var gatherBufs = sync.Pool{New: func() any { b := make([]byte, 0, gatherMax+16<<10); return &b }}

// gatherTimer is the part of *time.Timer a gatherConn uses.
type gatherTimer interface {
	Reset(time.Duration) bool
	Stop() bool
}

func realTimer(d time.Duration, f func()) gatherTimer { return time.AfterFunc(d, f) }

// gatherConn is a server's end of a connection that carries many streams
// (an HTTP/2 connection from frontdoor to a fanout replica). A write that
// comes less than hold after the socket was last written to is held and
// goes out together with the writes that follow it, in one write, hold
// after that last socket write (at once when gatherMax bytes are held).
//
// Why: net/http's HTTP/2 server writes the frames it has for its streams as
// they come, through a 4 KB buffer, so a connection carrying a hundred busy
// watches gets one or two small socket writes per frame; on loopback or a
// LAN each write costs the sender a system call and the receiver a wake-up
// and a read. Held for a millisecond, they go out many frames at a time.
//
// A quiet connection is written to at once: the first write after hold
// without socket writes passes straight through (the rest of a frame that
// net/http writes in two pieces may wait up to hold). Bytes keep their
// order: nothing passes while something is held, and the wrapper has no
// ReadFrom, so net/http's HTTP/1 file responses (sendfile) cannot pass
// around what is held either. A held write reports success; when the
// timer's write of it fails, the connection is closed (HTTP/2 ends it as it
// would for its own failed write) and the error is returned by the next
// Write. Close and CloseWrite write what is held first (a GOAWAY, TLS's
// close alert), within closeFlush.
type gatherConn struct {
	net.Conn
	hold     time.Duration
	now      func() time.Time
	newTimer func(time.Duration, func()) gatherTimer

	mu    sync.Mutex
	buf   *[]byte   // what is held; nil when nothing is
	last  time.Time // when the socket was last written to
	timer gatherTimer
	armed bool // the timer will fire
	err   error
}

func newGatherConn(c net.Conn, hold time.Duration, now func() time.Time, newTimer func(time.Duration, func()) gatherTimer) *gatherConn {
	return &gatherConn{Conn: c, hold: hold, now: now, newTimer: newTimer}
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
		wait := c.hold - now.Sub(c.last)
		if c.timer == nil {
			c.timer = c.newTimer(wait, c.flush)
		} else {
			c.timer.Reset(wait)
		}
	}
	return len(b), nil
}

// flush is the timer's: it writes what is held, and closes the connection
// if that fails (nothing else would end a quiet connection that lost
// frames).
func (c *gatherConn) flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed = false
	if c.err == nil && c.flushLocked() != nil {
		c.Conn.Close()
	}
}

// flushLocked writes what is held. On failure it keeps what was not
// written (Close tries again under its own deadline: TLS sets a past one
// just before it closes) and records the error.
func (c *gatherConn) flushLocked() error {
	if c.buf == nil {
		return nil
	}
	c.last = c.now()
	n, err := c.Conn.Write(*c.buf)
	if err != nil {
		c.err = err
		*c.buf = (*c.buf)[:copy(*c.buf, (*c.buf)[n:])]
		return err
	}
	if cap(*c.buf) <= 2*gatherMax {
		*c.buf = (*c.buf)[:0]
		gatherBufs.Put(c.buf)
	}
	c.buf = nil
	return nil
}

// finish writes what is held under a fresh deadline of closeFlush (wall
// time: it is the socket's) and stops the timer; err is what later writes
// get. A write blocked on a peer that does not read ends at that deadline.
func (c *gatherConn) finish(err error) {
	c.Conn.SetWriteDeadline(time.Now().Add(closeFlush))
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timer != nil {
		c.timer.Stop()
		c.armed = false
	}
	if c.buf != nil {
		c.err = nil
		c.flushLocked()
	}
	c.err = err
}

// Close writes what is held, then closes the connection.
func (c *gatherConn) Close() error {
	c.finish(net.ErrClosed)
	return c.Conn.Close()
}

// CloseWrite writes what is held, then shuts down the writing side of the
// connection (net/http's HTTP/1 server does before it closes).
func (c *gatherConn) CloseWrite() error {
	c.finish(net.ErrClosed)
	c.Conn.SetWriteDeadline(time.Time{})
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
