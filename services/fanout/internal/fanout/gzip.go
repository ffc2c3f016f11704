package fanout

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"hash/crc32"
	"io"
	"sync"
)

// gzipStream writes one gzip member over a long-lived watch response
// without holding a compressor while the response is idle or blocked on
// its client. A deflate compressor costs about a megabyte (its window and
// hash tables); a gzip.Writer per compressed watch held one for the watch's
// whole life: 5,000 WatchList informers cost fanout gigabytes.
//
// Here a compressor is taken from a pool only to compress: its output goes
// to a pooled buffer, and at every flush (or once the buffer holds
// gzipChunk bytes) the deflate stream is sync-flushed — the output so far
// is complete and byte-aligned — the compressor goes back to the pool, and
// only then is the buffer written to the client. The next write takes a
// compressor (any) and carries on the same deflate stream with blocks that
// refer to nothing before them. So a stream holds nothing between batches,
// and a compressor is never held across a network write: at most as many
// are in use as goroutines compressing at once.
//
// The stream is one ordinary gzip member (RFC 1952, RFC 1951): the header
// once, the blocks, and at Close a final empty block with the CRC-32 and
// length of everything written. Batches compress independently, which costs
// ratio only between batches (an initial state is one batch).
type gzipStream struct {
	w       io.Writer
	fw      *flate.Writer // nil unless compressing
	buf     *bytes.Buffer // compressed, not yet written; nil when empty
	crc     uint32
	size    uint32 // uncompressed length mod 2^32, as gzip's trailer has it
	started bool   // the header is written
	err     error
}

// gzipChunk is the compressed output a stream buffers before writing it.
const gzipChunk = 32 << 10

var (
	deflaters = sync.Pool{New: func() any {
		fw, _ := flate.NewWriter(nil, flate.BestSpeed) // a valid level: no error
		return fw
	}}
	gzipBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}
)

// gzipHeader: ID1 ID2, CM deflate, no flags, no mtime, XFL 0, OS unknown.
var gzipHeader = []byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255}

func newGzipStream(w io.Writer) *gzipStream { return &gzipStream{w: w} }

func (g *gzipStream) Write(b []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	if g.buf == nil {
		g.buf = gzipBuffers.Get().(*bytes.Buffer)
	}
	if !g.started {
		g.buf.Write(gzipHeader)
		g.started = true
	}
	if g.fw == nil {
		g.fw = deflaters.Get().(*flate.Writer)
		g.fw.Reset(g.buf)
	}
	n, _ := g.fw.Write(b) // into a buffer: no error
	g.crc = crc32.Update(g.crc, crc32.IEEETable, b[:n])
	g.size += uint32(n)
	if g.buf.Len() >= gzipChunk {
		return n, g.Flush()
	}
	return n, nil
}

// Flush sync-flushes the deflate stream, gives the compressor back, and
// writes what is buffered.
func (g *gzipStream) Flush() error {
	if g.fw != nil {
		g.fw.Flush() // into the buffer: no error
		g.fw.Reset(io.Discard)
		deflaters.Put(g.fw)
		g.fw = nil
	}
	if g.buf == nil {
		return g.err
	}
	if g.err == nil {
		_, g.err = g.w.Write(g.buf.Bytes())
	}
	g.buf.Reset()
	if g.buf.Cap() <= 4*gzipChunk { // an outsized one is left to the GC
		gzipBuffers.Put(g.buf)
	}
	g.buf = nil
	return g.err
}

// Close ends the member (a final empty block and the trailer) and writes
// it. A stream written after Close fails.
func (g *gzipStream) Close() error {
	if err := g.Flush(); err != nil {
		return err
	}
	var tail bytes.Buffer
	if !g.started {
		tail.Write(gzipHeader)
	}
	fw := deflaters.Get().(*flate.Writer)
	fw.Reset(&tail)
	fw.Close() // the final block, empty; into a buffer: no error
	fw.Reset(io.Discard)
	deflaters.Put(fw)
	var trailer [8]byte
	binary.LittleEndian.PutUint32(trailer[:4], g.crc)
	binary.LittleEndian.PutUint32(trailer[4:], g.size)
	tail.Write(trailer[:])
	_, err := g.w.Write(tail.Bytes())
	g.started, g.err = true, io.ErrClosedPipe
	return err
}
