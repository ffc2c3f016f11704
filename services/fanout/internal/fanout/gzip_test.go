package fanout

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
)

// Two watch streams interleave their batches (so compressors go from one
// to the other through the pool); each is one valid gzip stream, and every
// batch can be read in full as soon as it is flushed, before any later
// write: a watch event is never held back in the compressor.
func TestGzipStream(t *testing.T) {
	type end struct {
		gz *gzipStream
		pw *io.PipeWriter
		rd *bufio.Reader
		zr chan *gzip.Reader
	}
	var ends []*end
	for range 2 {
		pr, pw := io.Pipe()
		e := &end{gz: newGzipStream(pw), pw: pw, zr: make(chan *gzip.Reader, 1)}
		go func() {
			zr, err := gzip.NewReader(pr) // reads the header: blocks until the first write
			if err != nil {
				t.Error(err)
				close(e.zr)
				return
			}
			e.zr <- zr
		}()
		ends = append(ends, e)
	}
	want := map[*end]*strings.Builder{}
	for batch := range 20 {
		for i, e := range ends {
			if want[e] == nil {
				want[e] = &strings.Builder{}
			}
			var lines []string
			for j := range 1 + batch%5 {
				l := fmt.Sprintf(`{"type":"MODIFIED","object":{"stream":%d,"batch":%d,"event":%d,"pad":%q}}`+"\n", i, batch, j, strings.Repeat("x", batch*10))
				lines = append(lines, l)
				if _, err := e.gz.Write([]byte(l)); err != nil {
					t.Fatal(err)
				}
				want[e].WriteString(l)
			}
			// The flush is written to the pipe while the reader reads it.
			flushed := make(chan error, 1)
			go func() { flushed <- e.gz.Flush() }()
			if e.rd == nil {
				zr, ok := <-e.zr
				if !ok {
					t.Fatal("no gzip header")
				}
				e.rd = bufio.NewReader(zr)
			}
			for _, l := range lines {
				got, err := e.rd.ReadString('\n')
				if err != nil || got != l {
					t.Fatalf("stream %d batch %d: read %q, %v; want %q", i, batch, got, err, l)
				}
			}
			if err := <-flushed; err != nil {
				t.Fatal(err)
			}
		}
	}
	for i, e := range ends {
		closed := make(chan error, 1)
		go func() { closed <- e.gz.Close(); e.pw.Close() }()
		rest, err := io.ReadAll(e.rd) // checks the CRC and length at the end
		if err != nil || len(rest) != 0 {
			t.Errorf("stream %d: end of stream: %q, %v", i, rest, err)
		}
		if err := <-closed; err != nil {
			t.Errorf("stream %d: Close: %v", i, err)
		}
	}
	// A batch larger than gzipChunk once compressed (random bytes do not
	// compress) goes out in several chunks, the same stream.
	var big strings.Builder
	gb := newGzipStream(&big)
	r := rand.New(rand.NewPCG(1, 2))
	raw := make([]byte, 5*gzipChunk)
	for i := range raw {
		raw[i] = byte(r.Uint32())
	}
	if _, err := gb.Write(raw); err != nil {
		t.Fatal(err)
	}
	if err := gb.Close(); err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(strings.NewReader(big.String()))
	if err != nil {
		t.Fatal(err)
	}
	if back, err := io.ReadAll(zr); err != nil || !bytes.Equal(back, raw) {
		t.Errorf("large batch: %d bytes back, %v; want %d", len(back), err, len(raw))
	}

	// A stream closed before anything was written is still valid gzip.
	var b strings.Builder
	g := newGzipStream(&b)
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	zr, err = gzip.NewReader(strings.NewReader(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if rest, err := io.ReadAll(zr); err != nil || len(rest) != 0 {
		t.Errorf("empty stream: %q, %v", rest, err)
	}
}
