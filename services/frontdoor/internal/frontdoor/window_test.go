package frontdoor

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type frame struct {
	typ, flags byte
	id         uint32
	payload    []byte
}

func (f frame) bytes() []byte {
	b := []byte{byte(len(f.payload) >> 16), byte(len(f.payload) >> 8), byte(len(f.payload)), f.typ, f.flags}
	b = binary.BigEndian.AppendUint32(b, f.id)
	return append(b, f.payload...)
}

func windowUpdate(id, incr uint32) frame {
	return frame{typ: frameWindowUpdate, id: id, payload: binary.BigEndian.AppendUint32(nil, incr)}
}

// parseFrames splits a client's byte stream (preface first) into frames.
func parseFrames(t *testing.T, b []byte) []frame {
	t.Helper()
	if !bytes.HasPrefix(b, []byte(clientPreface)) {
		t.Fatalf("stream does not start with the preface: %q", b[:min(len(b), 24)])
	}
	b = b[len(clientPreface):]
	var out []frame
	for len(b) > 0 {
		if len(b) < frameHeaderLen || len(b) < frameHeaderLen+frameLen(b) {
			t.Fatalf("truncated frame: %d bytes left", len(b))
		}
		n := frameLen(b)
		out = append(out, frame{typ: b[3], flags: b[4], id: binary.BigEndian.Uint32(b[5:9]), payload: b[frameHeaderLen : frameHeaderLen+n]})
		b = b[frameHeaderLen+n:]
	}
	return out
}

type recordConn struct {
	net.Conn
	buf    bytes.Buffer
	writes int
}

func (c *recordConn) Write(b []byte) (int, error) {
	c.writes++
	return c.buf.Write(b)
}

// TestWindowConnFrames: whatever the chunking of the client's writes, every
// frame but the window updates passes in order and unchanged, and every
// increment reaches the peer (summed per stream) by the first write after
// maxHold; written whole, as net/http writes them, small updates are held
// and large ones pass at once.
func TestWindowConnFrames(t *testing.T) {
	for seed := range uint64(50) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 1))
			big := bytes.Repeat([]byte{0x8}, 20000) // DATA whose bytes look like update headers
			in := []frame{
				{typ: 0x4, payload: make([]byte, 18)}, // SETTINGS
				windowUpdate(0, fanoutConnWindow-65535),
				{typ: 0x1, flags: 0x4, id: 1, payload: []byte("headers")},
				{typ: 0x0, id: 1, payload: big},
				{typ: 0x8, id: 3, payload: make([]byte, 5)}, // a malformed update: passed as is
			}
			var want [4]uint64
			for range 300 {
				id := []uint32{0, 1, 3}[rng.IntN(3)]
				incr := uint32(rng.IntN(8000) + 1)
				want[id] += uint64(incr)
				in = append(in, windowUpdate(id, incr))
				if rng.IntN(20) == 0 {
					in = append(in, frame{typ: 0x6, payload: []byte("pingping")})
				}
			}
			in = append(in, frame{typ: 0x3, id: 3, payload: []byte{0, 0, 0, 8}}) // RST_STREAM
			// Even seeds write as net/http does (whole frames, one to three
			// per flush), odd ones cut anywhere.
			whole := seed%2 == 0
			var writes [][]byte
			stream := []byte(clientPreface)
			for _, f := range in {
				stream = append(stream, f.bytes()...)
				if whole && rng.IntN(2) == 0 {
					writes, stream = append(writes, stream), nil
				}
			}
			writes = append(writes, stream)
			if !whole {
				all := bytes.Join(writes, nil)
				writes = nil
				for len(all) > 0 {
					n := min(len(all), 1+rng.IntN(300))
					writes, all = append(writes, all[:n]), all[n:]
				}
			}

			now := time.Unix(0, 0)
			rec := &recordConn{}
			w := newWindowConn(rec, func() time.Time { return now })
			for _, b := range writes {
				if got, err := w.Write(b); got != len(b) || err != nil {
					t.Fatalf("Write = %d, %v; want %d", got, err, len(b))
				}
			}
			writesBefore := rec.writes
			now = now.Add(maxHold)
			w.Write(frame{typ: 0x6, payload: []byte("pingpong")}.bytes())
			if rec.writes != writesBefore+1 {
				t.Fatalf("the last write went out in %d writes", rec.writes-writesBefore)
			}

			out := parseFrames(t, rec.buf.Bytes())
			var others, updates []frame
			var got [4]uint64
			for _, f := range out {
				if f.typ == frameWindowUpdate && len(f.payload) == 4 {
					updates = append(updates, f)
					got[f.id] += uint64(binary.BigEndian.Uint32(f.payload))
					continue
				}
				others = append(others, f)
			}
			var wantOthers []frame
			for _, f := range append(in, frame{typ: 0x6, payload: []byte("pingpong")}) {
				if f.typ != frameWindowUpdate || len(f.payload) != 4 {
					wantOthers = append(wantOthers, f)
				}
			}
			if len(others) != len(wantOthers) {
				t.Fatalf("%d frames other than updates passed, want %d", len(others), len(wantOthers))
			}
			for i := range others {
				if others[i].typ != wantOthers[i].typ || others[i].id != wantOthers[i].id || !bytes.Equal(others[i].payload, wantOthers[i].payload) {
					t.Fatalf("frame %d: got type %d stream %d, want type %d stream %d", i, others[i].typ, others[i].id, wantOthers[i].typ, wantOthers[i].id)
				}
			}
			want[0] += fanoutConnWindow - 65535
			if got != want {
				t.Fatalf("window increments per stream: got %v, want %v", got, want)
			}
			if whole && len(updates) > 10 {
				t.Fatalf("%d updates went out for 301 written", len(updates))
			}
			for _, u := range updates {
				if whole && u.id == 0 {
					if binary.BigEndian.Uint32(u.payload) < fanoutConnWindow-65535 {
						t.Fatalf("the connection's opening window was held")
					}
					break
				}
			}
		})
	}
}

// countingListener counts the window-update frames the server reads: it
// walks each connection's frames as they arrive.
type countingListener struct {
	net.Listener
	mu      sync.Mutex
	updates int
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, l: l, skip: len(clientPreface)}, nil
}

type countingConn struct {
	net.Conn
	l    *countingListener
	skip int // bytes to the next frame header
	hdr  []byte
}

func (c *countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	for p := b[:n]; len(p) > 0; {
		if c.skip > 0 {
			k := min(c.skip, len(p))
			c.skip -= k
			p = p[k:]
			continue
		}
		k := min(frameHeaderLen-len(c.hdr), len(p))
		c.hdr = append(c.hdr, p[:k]...)
		p = p[k:]
		if len(c.hdr) == frameHeaderLen {
			if c.hdr[3] == frameWindowUpdate {
				c.l.mu.Lock()
				c.l.updates++
				c.l.mu.Unlock()
			}
			c.skip = frameLen(c.hdr)
			c.hdr = c.hdr[:0]
		}
	}
	return n, err
}

// TestWindowConnStreams runs frontdoor's transport to fanout replicas
// against a real HTTP/2 (h2c) server: streams of several times the stream
// window arrive whole, read in event-sized pieces as frontdoor's proxy
// reads them, with a window update per ~half a megabyte where net/http
// alone sends two per 4 KB.
func TestWindowConnStreams(t *testing.T) {
	const (
		streams = 3
		chunk   = 1500
		total   = 3 * fanoutStreamWindow
	)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		payload := make([]byte, chunk)
		for i := 0; i < total/chunk; i++ {
			binary.BigEndian.PutUint32(payload, uint32(i))
			if _, err := w.Write(payload); err != nil {
				return
			}
			rc.Flush()
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: ln}
	srv := &http.Server{Handler: h, Protocols: new(http.Protocols)}
	srv.Protocols.SetUnencryptedHTTP2(true)
	go srv.Serve(cl)
	t.Cleanup(func() { srv.Close() })

	var cfg Config
	cfg.RegisterFlags(newFlagSet())
	cfg.FanoutAddrs = "http://" + ln.Addr().String()
	p, err := newFanoutPool(cfg, slog.New(slog.DiscardHandler), newMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: p.transport}
	t.Cleanup(client.CloseIdleConnections)

	errs := make(chan error, streams)
	for range streams {
		go func() {
			resp, err := client.Get(cfg.FanoutAddrs + "/")
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			if resp.ProtoMajor != 2 {
				errs <- fmt.Errorf("protocol %s, want HTTP/2", resp.Proto)
				return
			}
			buf := make([]byte, chunk)
			for i := 0; i < total/chunk; i++ {
				if _, err := io.ReadFull(resp.Body, buf); err != nil {
					errs <- fmt.Errorf("chunk %d: %w", i, err)
					return
				}
				if got := binary.BigEndian.Uint32(buf); got != uint32(i) {
					errs <- fmt.Errorf("chunk %d arrived as chunk %d", got, i)
					return
				}
			}
			if n, err := io.Copy(io.Discard, resp.Body); n != 0 || err != nil {
				errs <- fmt.Errorf("after the last chunk: %d bytes, %v", n, err)
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
	cl.mu.Lock()
	defer cl.mu.Unlock()
	// net/http alone: one update per 4 KB per stream and per connection,
	// about 2*streams*total/4KB = 18,000. Held: one per holdStream per
	// stream and at most one per second of the test for everything.
	if max := streams*total/holdStream + 8*streams; cl.updates > max {
		t.Fatalf("the server read %d window updates for %d MB, want at most %d", cl.updates, streams*total>>20, max)
	}
	t.Logf("%d window updates for %d MB", cl.updates, streams*total>>20)
}

// TestWindowConnNotHTTP2: a connection that does not start with the HTTP/2
// preface (HTTP/1 to a replica) passes every byte as written.
func TestWindowConnNotHTTP2(t *testing.T) {
	for _, first := range []string{"GET / HTTP/1.1\r\n", "PRI * HTTP/1.1", "P"} {
		rec := &recordConn{}
		w := newWindowConn(rec, time.Now)
		var want []byte
		for _, b := range [][]byte{[]byte(first), []byte("Host: fanout\r\n\r\n"), windowUpdate(1, 100).bytes(), windowUpdate(0, 5).bytes()} {
			if n, err := w.Write(b); n != len(b) || err != nil {
				t.Fatalf("Write = %d, %v", n, err)
			}
			want = append(want, b...)
		}
		if !bytes.Equal(rec.buf.Bytes(), want) {
			t.Fatalf("%q: passed %q, want %q", first, rec.buf.Bytes(), want)
		}
	}
}

// arrivedConn is a connection whose reads return what has arrived (up to
// the reader's buffer), counted.
type arrivedConn struct {
	net.Conn
	arrived bytes.Buffer
	reads   int
}

func (c *arrivedConn) Read(b []byte) (int, error) { c.reads++; return c.arrived.Read(b) }

// A replica's gathered write is read in one call however small the reader's
// pieces, and a read returns what has arrived without waiting for more.
func TestBufferedConnReads(t *testing.T) {
	under := &arrivedConn{}
	c := newBufferedConn(under)
	sent := bytes.Repeat([]byte("0123456789abcdef"), readBuffer/16)
	under.arrived.Write(sent)
	got := make([]byte, 0, len(sent))
	piece := make([]byte, 4096) // net/http's HTTP/2 client reads 4 KB at a time
	for len(got) < len(sent) {
		n, err := c.Read(piece)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, piece[:n]...)
	}
	if !bytes.Equal(got, sent) || under.reads != 1 {
		t.Fatalf("%d bytes in %d reads of the connection, want the %d written in 1", len(got), under.reads, len(sent))
	}
	// Over a connection that has nothing more to give: a reader that waited
	// to fill its buffer would run into the deadline.
	server, client := net.Pipe()
	defer server.Close()
	defer client.Close()
	go server.Write([]byte("tail"))
	pc := newBufferedConn(client)
	pc.SetReadDeadline(time.Now().Add(time.Minute))
	n, err := pc.Read(piece)
	if err != nil || string(piece[:n]) != "tail" {
		t.Fatalf("read %q, %v; want what arrived, at once", piece[:n], err)
	}
}

// An update goes out with the write in which its stream's held sum reaches
// the bound, with the clock standing still: the only thing that sends it
// before maxHold. Streams below the bound stay held across that write and go
// out when they reach it later; the connection's (stream 0) bound is its own.
func TestWindowConnSendsAtTheBound(t *testing.T) {
	now := time.Unix(0, 0)
	rec := &recordConn{}
	w := newWindowConn(rec, func() time.Time { return now })
	w.Write([]byte(clientPreface))
	sent := func() []frame {
		t.Helper()
		frames := parseFrames(t, rec.buf.Bytes())
		var ups []frame
		for _, f := range frames {
			if f.typ == frameWindowUpdate {
				ups = append(ups, f)
			}
		}
		return ups
	}
	incr := func(f frame) uint32 { return binary.BigEndian.Uint32(f.payload) }
	ping := frame{typ: 0x6, payload: []byte("pingpong")}.bytes()

	w.Write(windowUpdate(1, holdStream-1).bytes())
	w.Write(ping)
	if ups := sent(); len(ups) != 0 {
		t.Fatalf("sent %d updates below the bound", len(ups))
	}
	// Stream 1 crosses; stream 3 gets half its bound in the same write.
	w.Write(append(windowUpdate(1, 1).bytes(), windowUpdate(3, holdStream/2).bytes()...))
	if ups := sent(); len(ups) != 1 || ups[0].id != 1 || incr(ups[0]) != holdStream {
		t.Fatalf("updates %v, want stream 1's %d alone", ups, holdStream)
	}
	// Stream 3 crosses in a write that ends inside a frame header: it goes
	// out with the next write that ends on a frame boundary.
	cross := windowUpdate(3, holdStream/2).bytes()
	before := rec.buf.Len()
	w.Write(append(cross, ping[:4]...))
	if passed := rec.buf.Bytes()[before:]; !bytes.Equal(passed, ping[:4]) {
		t.Fatalf("passed %q inside a frame, want only the frame's first bytes", passed)
	}
	w.Write(ping[4:])
	if ups := sent(); len(ups) != 2 || ups[1].id != 3 || incr(ups[1]) != holdStream {
		t.Fatalf("updates %v, want stream 3's %d second", ups, holdStream)
	}
	// The connection: held below its own bound, sent at it.
	w.Write(windowUpdate(0, holdStream).bytes())
	w.Write(ping)
	if ups := sent(); len(ups) != 2 {
		t.Fatalf("the connection's update went out below its bound: %v", ups)
	}
	w.Write(windowUpdate(0, holdConn-holdStream).bytes())
	if ups := sent(); len(ups) != 3 || ups[2].id != 0 || incr(ups[2]) != holdConn {
		t.Fatalf("updates %v, want the connection's %d third", ups, holdConn)
	}
}
