// Package watchsession carries many watch responses from a fanout replica
// to frontdoor over one connection (a session), each watch a stream of it.
//
// Why: a broadcast watch is written every pacing interval. As an HTTP/2
// stream per watch, net/http handed each write from its handler to the
// connection's serve loop and, above 4 KB, to a goroutine of its own, then
// walked its streams to schedule the frame, and frontdoor's client woke a
// reader per stream: those hand-offs, not the bytes, were most of fanout's
// CPU and a fifth of frontdoor's in a 1,000-watcher broadcast. In a session,
// a watch's write is appended to the session's buffer, and one writer sends
// what every watch appended meanwhile in one write; frontdoor's one reader
// per session hands each watch its bytes.
//
// A session is a connection to the replica's HTTP port (TCP, or TLS with
// the port's peer allowlist) that frontdoor upgrades with one HTTP/1.1
// request (GET Path, Upgrade: Protocol); from the 101 on, it carries frames
// both ways and nothing else, so the session's credits are its only flow
// control (BenchmarkTransport: a third of the CPU of the same frames as an
// HTTP/2 body, whose flow control and framing ran under the credits; gRPC
// costs as much as HTTP/2). Each watch is a stream of the session, numbered
// by frontdoor:
//
//	frontdoor -> fanout   open   the watch (a heraldv1.WatchStreamRequest)
//	                      credit the bytes of data the stream may send more
//	                      cancel the client left (or the watch is shed)
//	fanout -> frontdoor   head   the response's head (a heraldv1.WatchStreamHead)
//	                      data   bytes of the body
//	                      end    the body's end (empty) or why it failed
//	                      shared bytes that streams of the session refer to
//	                      refs   bytes of the body: shared bytes, by number
//	                      forget shared bytes up to a number are forgotten
//	                      trace  the trace context (W3C traceparent) of the
//	                             event whose bytes follow (Segment.Trace)
//
// Shared bytes: a watch event's encoding is the same for every watch of the
// session that sees it, and a broadcast sends it to hundreds of them. A
// shared frame carries it once, numbered (1, 2, ... in the order sent; the
// frame's stream field is its number), and each stream's refs frame names
// the numbers whose bytes are its body's next bytes. Both ends keep the
// latest shared bytes, up to the session's window of bytes (frontdoor asks
// for one, WindowHeader; fanout answers with the one it uses) and one
// number per windowPerShared of them, and forget the oldest first, at the
// same frame: fanout refers only to bytes frontdoor still holds, and sends
// them again otherwise. So the window bounds how far apart, in bytes of
// shared events, the watches of a session can be and still have each event
// cross once: a broadcast past the machine's capacity spreads its watches
// out, and a window they outgrow sends every event again for each of them.
// A window is the most a session keeps, not what it keeps while quiet:
// fanout forgets the oldest shared bytes no stream referred to for a while
// (Server.SharedIdle) and tells frontdoor in a forget frame, in order with
// every other frame, so that an idle session keeps none and a busy one
// about what its streams still refer to.
//
// Flow control is per stream, by credit: a stream sends at most window
// bytes of its body that frontdoor has not read yet (a refs frame counts
// the bytes it refers to; shared frames belong to no stream), so a client
// that does not read stops its own watch (its fanout watcher falls behind
// and is closed once the ring passes it) and no other.
package watchsession

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync/atomic"
	"time"
)

// Path is the session endpoint of a fanout replica.
const Path = "/.herald/watchsession/v1"

// Protocol is what a session's request upgrades its connection to.
const Protocol = "herald-watchsession/1"

type frameType uint8

const (
	frameOpen frameType = iota + 1
	frameCredit
	frameCancel
	frameHead
	frameData
	frameEnd
	frameShared
	frameRefs
	frameForget
	frameTrace
)

// frameNames names each frame type, in the order of their numbers.
var frameNames = [...]string{frameOpen: "open", frameCredit: "credit", frameCancel: "cancel", frameHead: "head",
	frameData: "data", frameEnd: "end", frameShared: "shared", frameRefs: "refs", frameForget: "forget", frameTrace: "trace"}

func (t frameType) String() string {
	if int(t) < len(frameNames) && frameNames[t] != "" {
		return frameNames[t]
	}
	return fmt.Sprintf("frame type %d", uint8(t))
}

// headerLen: a frame is its type (1 byte), its stream (4) and its payload's
// length (4), big-endian, then the payload.
const headerLen = 9

const (
	// window is the data a stream may send that the client has not read
	// yet.
	window = 4 << 20
	// creditStep: the client credits what it read once it is this much
	// (one frame per step, not per read). Up to creditStep-1 bytes read
	// stay uncredited for as long as nothing more arrives.
	creditStep = window / 8
	// wholeMax is the largest write a stream sends whole
	// (SegmentWriter): the credit it waits for is sure to come once the
	// client has read everything before it, since at most creditStep-1
	// bytes then stay uncredited. A larger one goes in pieces, each
	// waiting for what the client's reading of the last returns.
	wholeMax = window - creditStep
	// maxHead bounds an open or head frame.
	maxHead = 64 << 10
	// maxData bounds a data frame: a longer write is sent in pieces.
	maxData = 256 << 10
	// maxEnd bounds what an end frame says of a failure.
	maxEnd = 1 << 10
	// maxSessionStreams bounds a session's open streams (frontdoor opens
	// at most 500).
	maxSessionStreams = 10000
	// DefaultSharedWindow is the window of a session whose request does
	// not name one: at 100 events/s of 1.5 KB, the last 3 s of them.
	DefaultSharedWindow = 512 << 10
	// MaxSharedWindow bounds the window a session may use (each end keeps
	// up to that much); DefaultSharedWindow is the least.
	MaxSharedWindow = 256 << 20
	// windowPerShared: a window keeps one number per this many of its
	// bytes at most (2,048 for the default window), bounding the
	// bookkeeping of small shared bytes.
	windowPerShared = 256
	// minShared: shorter shared bytes are sent as data (a reference and
	// its bookkeeping would cost about as much).
	minShared = 128
	// maxRefs bounds a refs frame.
	maxRefs = 1024
	// maxTrace bounds a trace frame (a traceparent is 55 bytes).
	maxTrace = 256
)

// WindowHeader, on a session's request, is the window of shared bytes (in
// bytes) frontdoor asks for; on the response, the one fanout uses, at most
// the one asked for (a request past MaxSharedWindow gets that), which
// frontdoor then keeps too. Without it on the request, the session's window
// is DefaultSharedWindow.
const WindowHeader = "Herald-Watchsession-Shared-Window"

// DefaultSharedIdle is how long, at least, the oldest shared bytes stay
// kept with no stream referring to them (Server.SharedIdle's default): longer than a
// broadcast's watches lag behind each other unless the machine is past its
// capacity, and short enough that a session's window is memory only while
// it is used.
const DefaultSharedIdle = 30 * time.Second

// parseWindow reads a WindowHeader value: DefaultSharedWindow if
// empty; an error if it is not a number within the bounds.
func parseWindow(v string) (int, error) {
	if v == "" {
		return DefaultSharedWindow, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < DefaultSharedWindow || n > MaxSharedWindow {
		return 0, fmt.Errorf("watchsession: shared window %q is not a number of bytes from %d to %d", v, DefaultSharedWindow, MaxSharedWindow)
	}
	return n, nil
}

// clampWindow brings a window asked for within the bounds (0:
// DefaultSharedWindow).
func clampWindow(n int) int { return min(max(n, DefaultSharedWindow), MaxSharedWindow) }

// sharedBytes is the shared bytes one end of a session keeps, in the order
// they were sent; both ends apply the same rule (add), so they forget the
// same bytes at the same frame.
type sharedBytes struct {
	blobs  [][]byte // blobs[i] is number forgot+1+i
	forgot uint32   // numbers 1 to forgot are forgotten
	size   int
	window int // bound on size
	// total, if not nil, is the size of every session's of this end
	// (SharedBytes).
	total *atomic.Int64
}

func newSharedBytes(window int, total *atomic.Int64) *sharedBytes {
	return &sharedBytes{window: window, total: total}
}

// grew adds n to the size (and the total).
func (s *sharedBytes) grew(n int) {
	s.size += n
	if s.total != nil {
		s.total.Add(int64(n))
	}
}

// release forgets everything (the session ended) without a number.
func (s *sharedBytes) release() {
	s.grew(-s.size)
	s.blobs = nil
}

// next is the number the next shared bytes get. Numbers wrap around
// (after 2^32 shared frames, days of a busy session): every comparison is
// modulo 2^32.
func (s *sharedBytes) next() uint32 { return s.forgot + 1 + uint32(len(s.blobs)) }

// add keeps b as the next number, forgetting the oldest first as the
// bounds require; forget (if not nil) is called with each one forgotten.
func (s *sharedBytes) add(b []byte, forget func(num uint32, b []byte)) {
	for len(s.blobs) > 0 && (s.size+len(b) > s.window || len(s.blobs) >= s.window/windowPerShared) {
		s.forgetOldest(forget)
	}
	s.blobs = append(s.blobs, b)
	s.grew(len(b))
}

// forgetThrough forgets the numbers up to n, oldest first; false (and
// nothing forgotten) if n is neither kept nor already forgotten: the
// sender's numbers are not this end's.
func (s *sharedBytes) forgetThrough(n uint32, forget func(num uint32, b []byte)) bool {
	count := n - s.forgot // n == forgot: already forgotten, nothing to do
	if count > uint32(len(s.blobs)) {
		return false
	}
	for range count {
		s.forgetOldest(forget)
	}
	if len(s.blobs) == 0 {
		s.blobs = nil // an idle session keeps no array either
	}
	return true
}

func (s *sharedBytes) forgetOldest(forget func(num uint32, b []byte)) {
	s.forgot++
	if forget != nil {
		forget(s.forgot, s.blobs[0])
	}
	s.grew(-len(s.blobs[0]))
	s.blobs[0] = nil
	s.blobs = s.blobs[1:]
}

// get returns shared bytes n, or false if this end does not keep them.
func (s *sharedBytes) get(n uint32) ([]byte, bool) {
	i := n - s.forgot - 1
	if i >= uint32(len(s.blobs)) {
		return nil, false
	}
	return s.blobs[i], true
}

// errProtocol is a session's peer breaking the framing: the session ends.
var errProtocol = errors.New("watchsession: protocol error")

// appendFrame appends a frame to b.
func appendFrame(b []byte, t frameType, id uint32, payload []byte) []byte {
	b = append(b, byte(t))
	b = binary.BigEndian.AppendUint32(b, id)
	b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
	return append(b, payload...)
}

// frameLen is the payload length of the frame at off in b.
func frameLen(b []byte, off int) int {
	return int(binary.BigEndian.Uint32(b[off+5 : off+9]))
}

// growFrame adds n to the payload length of the frame at off in b.
func growFrame(b []byte, off, n int) {
	binary.BigEndian.PutUint32(b[off+5:off+9], uint32(frameLen(b, off)+n))
}

// appendCredit appends a credit frame of n bytes to b.
func appendCredit(b []byte, id uint32, n uint32) []byte {
	var p [4]byte
	binary.BigEndian.PutUint32(p[:], n)
	return appendFrame(b, frameCredit, id, p[:])
}

// readHeader reads the next frame's header, checking its length against
// what its type allows.
func readHeader(r *bufio.Reader) (frameType, uint32, int, error) {
	// Peeked in the reader's buffer, not read into an array of its own
	// (which would escape, through io.ReadFull, to the heap: an
	// allocation per frame).
	h, err := r.Peek(headerLen)
	if len(h) < headerLen {
		if err == io.EOF && len(h) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return 0, 0, 0, err
	}
	t, id, n := frameType(h[0]), binary.BigEndian.Uint32(h[1:5]), binary.BigEndian.Uint32(h[5:9])
	r.Discard(headerLen)
	var limit uint32
	switch t {
	case frameOpen, frameHead, frameEnd:
		limit = maxHead
	case frameData, frameShared:
		limit = maxData
	case frameRefs:
		limit = 4 * maxRefs
	case frameCredit:
		limit = 4
	case frameTrace:
		limit = maxTrace
	case frameCancel, frameForget:
		limit = 0
	default:
		return 0, 0, 0, fmt.Errorf("%w: unknown %v", errProtocol, t)
	}
	if n > limit {
		return 0, 0, 0, fmt.Errorf("%w: %v of %d bytes (limit %d)", errProtocol, t, n, limit)
	}
	return t, id, int(n), nil
}

// readFrames is both ends' reader: it reads frames until the connection
// fails or handle does, refusing a frame of a type the end does not
// receive (accept). A frame's payload is handle's only until it returns.
func readFrames(br *bufio.Reader, accept func(frameType) bool, handle func(t frameType, id uint32, payload []byte) error) error {
	var large []byte // a payload longer than br's buffer
	for {
		t, id, n, err := readHeader(br)
		if err != nil {
			return err
		}
		if !accept(t) {
			return fmt.Errorf("%w: %v unexpected", errProtocol, t)
		}
		var p []byte
		inBuf := n <= br.Size()
		if inBuf {
			p, err = br.Peek(n)
		} else {
			large = slices.Grow(large[:0], n)[:n]
			_, err = io.ReadFull(br, large)
			p = large
		}
		if err != nil {
			return err
		}
		err = handle(t, id, p)
		if inBuf {
			br.Discard(n)
		}
		if err != nil {
			return err
		}
	}
}
