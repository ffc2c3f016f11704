// Package watchmux carries many watch responses from a fanout replica to
// frontdoor over one HTTP/2 stream (a session), instead of one HTTP/2
// stream each.
//
// Why: a broadcast watch is written every pacing interval, and net/http's
// HTTP/2 server hands each write of each stream from its handler to the
// connection's serve loop and, above 4 KB, to a goroutine of its own, then
// walks its streams to schedule the frame; frontdoor's client wakes a
// reader per stream. Those hand-offs, not the bytes, were most of fanout's
// CPU and a fifth of frontdoor's in a 1,000-watcher broadcast. In a session,
// a watch's write is appended to the session's buffer, and one writer sends
// what every watch appended meanwhile in one write; frontdoor's one reader
// per session hands each watch its bytes.
//
// A session is a POST to Path whose request body carries frontdoor's frames
// and whose response body carries fanout's. Each watch is a stream of the
// session, numbered by frontdoor:
//
//	frontdoor -> fanout   open   the request's head (HTTP/1.1 syntax)
//	                      credit the bytes of data the stream may send more
//	                      cancel the client left (or the watch is shed)
//	fanout -> frontdoor   head   the response's head (HTTP/1.1 syntax)
//	                      data   bytes of the body
//	                      end    the body's end (empty) or why it failed
//
// Flow control is per stream, by credit, as HTTP/2's is: a stream sends at
// most window bytes that frontdoor has not read yet, so a client that does
// not read stops its own watch (fanout's queue overflows and closes it, as
// it does on HTTP/2) and no other.
package watchmux

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Path is the session endpoint of a fanout replica.
const Path = "/.herald/watchmux/v1"

// ContentType is a session's request and response body.
const ContentType = "application/x-herald-watchmux"

type frameType uint8

const (
	frameOpen frameType = iota + 1
	frameCredit
	frameCancel
	frameHead
	frameData
	frameEnd
)

func (t frameType) String() string {
	switch t {
	case frameOpen:
		return "open"
	case frameCredit:
		return "credit"
	case frameCancel:
		return "cancel"
	case frameHead:
		return "head"
	case frameData:
		return "data"
	case frameEnd:
		return "end"
	}
	return fmt.Sprintf("frame type %d", uint8(t))
}

// headerLen: a frame is its type (1 byte), its stream (4) and its payload's
// length (4), big-endian, then the payload.
const headerLen = 9

const (
	// window is the data a stream may send that the client has not read
	// yet: what frontdoor's HTTP/2 streams from fanout allowed (its
	// MaxReceiveBufferPerStream). The client credits what it read once it
	// is an eighth of it.
	window = 4 << 20
	// maxHead bounds an open or head frame (kube-apiserver's request
	// header limit).
	maxHead = 1 << 20
	// maxData bounds a data frame: a longer write is sent in pieces.
	maxData = 256 << 10
	// maxEnd bounds what an end frame says of a failure.
	maxEnd = 1 << 10
	// maxSessionStreams bounds a session's open streams (frontdoor opens
	// at most 500).
	maxSessionStreams = 10000
)

// errProtocol is a session's peer breaking the framing: the session ends.
var errProtocol = errors.New("watchmux: protocol error")

// appendFrame appends a frame to b.
func appendFrame(b []byte, t frameType, id uint32, payload []byte) []byte {
	b = append(b, byte(t))
	b = binary.BigEndian.AppendUint32(b, id)
	b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
	return append(b, payload...)
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
	var h [headerLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, 0, 0, err
	}
	t, id, n := frameType(h[0]), binary.BigEndian.Uint32(h[1:5]), binary.BigEndian.Uint32(h[5:9])
	var limit uint32
	switch t {
	case frameOpen, frameHead, frameEnd:
		limit = maxHead
	case frameData:
		limit = maxData
	case frameCredit:
		limit = 4
	case frameCancel:
		limit = 0
	default:
		return 0, 0, 0, fmt.Errorf("%w: unknown %v", errProtocol, t)
	}
	if n > limit {
		return 0, 0, 0, fmt.Errorf("%w: %v of %d bytes (limit %d)", errProtocol, t, n, limit)
	}
	return t, id, int(n), nil
}
