package fanout

import (
	"compress/flate"
	"encoding/binary"
	"hash/crc32"
	"io"
	"sync"
)

// gzipStream writes one gzip member over a long-lived watch response
// without holding a compressor between writes. A deflate compressor costs
// about a megabyte (its window and hash tables); a gzip.Writer per
// compressed watch held it for the watch's whole life, idle or not: 5,000
// WatchList informers cost fanout gigabytes. Here each flush ends with a
// sync flush (the output so far is complete and byte-aligned) and gives the
// compressor back to a pool; the next write takes one (any) and carries on
// the same deflate stream with new blocks that refer to nothing before
// them. The stream is one ordinary gzip member (RFC 1952, RFC 1951): the
// header once, the blocks, and at Close a final empty block with the CRC-32
// and length of everything written. Batches compress independently, which
// costs ratio only between batches (the initial state is one batch).
type gzipStream struct {
	w       io.Writer
	fw      *flate.Writer // nil between flushes
	crc     uint32
	size    uint32 // uncompressed length mod 2^32, as gzip's trailer has it
	started bool   // the header is written
	err     error
}

var deflaters = sync.Pool{New: func() any {
	fw, _ := flate.NewWriter(nil, flate.BestSpeed) // a valid level: no error
	return fw
}}

// gzipHeader: ID1 ID2, CM deflate, no flags, no mtime, XFL 0, OS unknown.
var gzipHeader = []byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255}

func newGzipStream(w io.Writer) *gzipStream { return &gzipStream{w: w} }

func (g *gzipStream) Write(b []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	if !g.started {
		if _, g.err = g.w.Write(gzipHeader); g.err != nil {
			return 0, g.err
		}
		g.started = true
	}
	if g.fw == nil {
		g.fw = deflaters.Get().(*flate.Writer)
		g.fw.Reset(g.w)
	}
	n, err := g.fw.Write(b)
	g.crc = crc32.Update(g.crc, crc32.IEEETable, b[:n])
	g.size += uint32(n)
	g.err = err
	return n, err
}

// Flush writes everything written so far (a sync flush) and gives the
// compressor back.
func (g *gzipStream) Flush() error {
	if g.fw == nil || g.err != nil {
		return g.err
	}
	g.err = g.fw.Flush()
	g.fw.Reset(io.Discard) // drop the reference to the response
	deflaters.Put(g.fw)
	g.fw = nil
	return g.err
}

// Close ends the member: a final empty block and the trailer.
func (g *gzipStream) Close() error {
	if err := g.Flush(); err != nil {
		return err
	}
	if !g.started {
		if _, g.err = g.w.Write(gzipHeader); g.err != nil {
			return g.err
		}
	}
	fw := deflaters.Get().(*flate.Writer)
	fw.Reset(g.w)
	g.err = fw.Close() // the final block, empty
	fw.Reset(io.Discard)
	deflaters.Put(fw)
	if g.err != nil {
		return g.err
	}
	var trailer [8]byte
	binary.LittleEndian.PutUint32(trailer[:4], g.crc)
	binary.LittleEndian.PutUint32(trailer[4:], g.size)
	_, err := g.w.Write(trailer[:])
	g.err = errClosed(err)
	return err
}

// errClosed keeps a write after Close from corrupting the stream.
func errClosed(err error) error {
	if err != nil {
		return err
	}
	return io.ErrClosedPipe
}
