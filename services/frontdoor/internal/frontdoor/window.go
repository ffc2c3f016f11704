package frontdoor

import (
	"bufio"
	"encoding/binary"
	"net"
	"sync"
	"time"
)

// windowConn is frontdoor's end of a plaintext (h2c) HTTP/2 connection to a
// fanout replica. It holds back the flow-control WINDOW_UPDATE frames that
// net/http's HTTP/2 client writes and sends their sums less often.
//
// Why: the client returns window for every 4 KB a response body consumes,
// per stream and per connection, and flushes each update on its own (a
// constant in net/http, not configurable). A replica streaming ~1.5 KB
// events to a thousand watches gets about two updates for every three
// events: a write here and a read, a frame and a hand-off between
// goroutines in the replica's HTTP/2 server, for frames that change
// nothing while the windows (4 MB per stream, 1 GB per connection, see
// fanoutWindow) are nowhere near empty.
//
// The invariants that keep flow control correct:
//   - Every increment the client writes reaches the peer, summed with others
//     of the same stream: one stream's held increments go out as soon as
//     they reach holdStream (holdConn for the connection), at most an
//     eighth of the window the client advertised, so the peer always has
//     most of its window and can never stall on what is held.
//   - Everything held goes out with the first write after it has been held
//     for maxHold, so the peer's view of the windows lags by little and
//     the increments of streams that have ended do not pile up (the peer
//     ignores updates for closed streams, RFC 9113 section 6.9).
//   - Frames are written in the client's order; an update is only held
//     when its whole frame is in one write, and held updates are only
//     written between frames.
//
// Only for h2c: over TLS the frames are encrypted below net/http's reach.
type windowConn struct {
	net.Conn
	now func() time.Time

	mu      sync.Mutex
	preface int    // bytes of the client connection preface still to pass
	plain   bool   // what is written is not HTTP/2 (no preface): pass it as is
	hdr     []byte // a frame header split across writes, passed on already
	rest    int    // bytes of the current frame still to pass
	held    map[uint32]uint32
	full    int       // entries of held that reached their bound
	since   time.Time // when the oldest held increment was held
	out     []byte
}

const (
	// fanoutWindow: the receive windows frontdoor's HTTP/2 client
	// advertises to fanout replicas (net/http's defaults, set explicitly
	// because windowConn's bounds depend on them).
	fanoutStreamWindow = 4 << 20
	fanoutConnWindow   = 1 << 30
	holdStream         = fanoutStreamWindow / 8
	holdConn           = fanoutConnWindow / 8
	maxHold            = time.Second

	frameHeaderLen    = 9
	frameWindowUpdate = 0x8
	clientPreface     = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
)

func newWindowConn(c net.Conn, now func() time.Time) *windowConn {
	return &windowConn{Conn: c, now: now, preface: len(clientPreface), held: map[uint32]uint32{}, hdr: make([]byte, 0, frameHeaderLen)}
}

// readBuffer is the read buffer of frontdoor's h2c connections to fanout
// replicas: net/http's HTTP/2 client reads through a 4 KB buffer of its
// own, a system call per 4 KB; a replica writes many streams' frames at
// once (fanout's http.write-hold), read here a few calls per write. Each
// connection (up to 100 watches) keeps its buffer.
const readBuffer = 16 << 10

// bufferedConn reads its connection through a readBuffer-sized buffer.
// Reading never waits for more than the connection has: a read returns what
// is buffered, or what one read of the connection returns.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func newBufferedConn(c net.Conn) *bufferedConn {
	return &bufferedConn{Conn: c, r: bufio.NewReaderSize(c, readBuffer)}
}

func (c *bufferedConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// Write passes b on, less the WINDOW_UPDATE frames it holds, plus the held
// updates that are due. It reports len(b) written when the write of what
// is passed on succeeds.
func (w *windowConn) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.plain {
		return w.Conn.Write(b)
	}
	out := w.frames(w.out[:0], b)
	if w.plain {
		return w.Conn.Write(b)
	}
	if w.rest == 0 && len(w.hdr) == 0 && w.preface == 0 {
		out = w.due(out)
	}
	w.out = out[:0]
	if len(out) == 0 {
		return len(b), nil
	}
	if _, err := w.Conn.Write(out); err != nil {
		// net/http's HTTP/2 client treats any write error as the
		// connection's end (a sticky error), so what was held is moot.
		return 0, err
	}
	return len(b), nil
}

// frames appends to out what of b is passed on, holding the updates.
func (w *windowConn) frames(out, b []byte) []byte {
	for len(b) > 0 {
		switch {
		case w.preface > 0:
			n := min(w.preface, len(b))
			at := len(clientPreface) - w.preface
			if string(b[:n]) != clientPreface[at:at+n] {
				// Not an HTTP/2 client (the transport spoke HTTP/1 to
				// the replica): nothing to hold. What was passed on so
				// far was a prefix of the preface, in earlier writes.
				w.plain = true
				return out
			}
			out, b = append(out, b[:n]...), b[n:]
			w.preface -= n
		case w.rest > 0:
			n := min(w.rest, len(b))
			out, b = append(out, b[:n]...), b[n:]
			w.rest -= n
		case len(w.hdr) == 0 && len(b) >= frameHeaderLen+4 && b[3] == frameWindowUpdate && frameLen(b) == 4:
			id := binary.BigEndian.Uint32(b[5:9]) & (1<<31 - 1)
			incr := binary.BigEndian.Uint32(b[9:13]) & (1<<31 - 1)
			w.hold(id, incr)
			b = b[frameHeaderLen+4:]
		default:
			// A frame to pass on, its header perhaps split across writes.
			n := min(frameHeaderLen-len(w.hdr), len(b))
			w.hdr = append(w.hdr, b[:n]...)
			out, b = append(out, b[:n]...), b[n:]
			if len(w.hdr) == frameHeaderLen {
				w.rest = frameLen(w.hdr)
				w.hdr = w.hdr[:0]
			}
		}
	}
	return out
}

func frameLen(h []byte) int { return int(h[0])<<16 | int(h[1])<<8 | int(h[2]) }

func (w *windowConn) hold(id, incr uint32) {
	if len(w.held) == 0 {
		w.since = w.now()
	}
	was := w.held[id]
	w.held[id] = was + incr
	if bound := holdBound(id); was < bound && was+incr >= bound {
		w.full++
	}
}

func holdBound(id uint32) uint32 {
	if id == 0 {
		return holdConn
	}
	return holdStream
}

// due appends the held updates that are due: all of them once the oldest
// has waited maxHold, else those that reached their bound. It runs at every
// write that ends on a frame boundary, and a connection holds an update for
// each of its up to 100 streams: the map is only walked when something is
// due.
func (w *windowConn) due(out []byte) []byte {
	if len(w.held) == 0 {
		return out
	}
	all := w.now().Sub(w.since) >= maxHold
	if !all && w.full == 0 {
		return out
	}
	for id, incr := range w.held {
		if all || incr >= holdBound(id) {
			out = appendWindowUpdate(out, id, incr)
			delete(w.held, id)
		}
	}
	w.full = 0
	return out
}

func appendWindowUpdate(out []byte, id, incr uint32) []byte {
	out = append(out, 0, 0, 4, frameWindowUpdate, 0)
	out = binary.BigEndian.AppendUint32(out, id)
	return binary.BigEndian.AppendUint32(out, incr)
}
