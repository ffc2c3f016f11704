package watchsession

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// blobs returns n distinct shared byte slices of size bytes each.
func blobs(n, size int) [][]byte {
	bs := make([][]byte, n)
	for i := range bs {
		bs[i] = bytes.Repeat([]byte{byte('a' + i%26)}, size)
		copy(bs[i], fmt.Sprintf("<%d>", i))
	}
	return bs
}

// segmented writes writes of a line of its own and then two of shared,
// as segments, each write flushed: shared[i % n], which an earlier write
// of the stream or another stream may have sent, then shared[(3i+1) % n],
// often one not sent yet (the session ends a refs frame to send it).
func segmented(shared [][]byte, writes int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw, ok := w.(SegmentWriter)
		if !ok {
			http.Error(w, "not a SegmentWriter", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusOK)
		name := r.URL.Query().Get("name")
		for i := range writes {
			own := []byte(name + " " + strconv.Itoa(i) + "\n")
			segs := []Segment{{B: own}, {B: shared[i%len(shared)], Shared: true}, {B: shared[(3*i+1)%len(shared)], Shared: true}}
			if _, err := sw.WriteSegments(segs); err != nil {
				return
			}
			if err := http.NewResponseController(w).Flush(); err != nil {
				return
			}
		}
	})
}

func segmentedBody(name string, shared [][]byte, writes int) string {
	var b strings.Builder
	for i := range writes {
		b.WriteString(name + " " + strconv.Itoa(i) + "\n")
		b.Write(shared[i%len(shared)])
		b.Write(shared[(3*i+1)%len(shared)])
	}
	return b.String()
}

// readAll reads the streams' bodies concurrently and checks each against
// want(name).
func readAll(t *testing.T, c *Client, url string, streams int, want func(name string) string) int {
	t.Helper()
	var (
		wg    sync.WaitGroup
		total atomic.Int64
	)
	errs := make(chan error, streams)
	for i := range streams {
		wg.Go(func() {
			name := "w" + strconv.Itoa(i)
			resp := get(t, c, context.Background(), url+"?name="+name)
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			total.Add(int64(len(body)))
			if err != nil || resp.StatusCode != http.StatusOK {
				errs <- fmt.Errorf("%s: %d, %v", name, resp.StatusCode, err)
				return
			}
			if w := want(name); string(body) != w {
				errs <- fmt.Errorf("%s: %d bytes, want %d; differ from byte %d", name, len(body), len(w), firstDiff(string(body), w))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	return int(total.Load())
}

func firstDiff(a, b string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestSharedSegments: streams of one session that write the same shared
// bytes each get every byte of their body, in order, while the session
// carries the shared bytes about once: also when they are more than both
// ends keep (the oldest are forgotten and sent again, so that the session
// carries about what it would as data), by size and by number, and once
// again when the client asked for a window that holds them.
func TestSharedSegments(t *testing.T) {
	maxShared := DefaultSharedWindow / windowPerShared
	for _, tc := range []struct {
		name          string
		shared        [][]byte
		writes        int
		window        int     // Client.SharedWindow
		maxWireFactor float64 // wire bytes at most this times the body bytes
	}{
		{"few", blobs(5, 2000), 200, 0, 0.2},
		{"prefixes of one another", func() [][]byte {
			b := blobs(1, 2000)[0]
			return [][]byte{b[:200], b[:300], b[:1000], b} // one of them kept at a time: sent again
		}(), 200, 0, 1.1},
		{"more than the window's bytes", blobs(30, 100<<10), 60, 0, 1.1},
		{"more than the window's number", blobs(maxShared+500, minShared), 2 * (maxShared + 500), 0, 1.1},
		{"within a larger window's bytes", blobs(30, 100<<10), 60, 4 << 20, 0.2},
		{"within a larger window's number", blobs(maxShared+500, minShared), 2 * (maxShared + 500), 4 << 20, 0.2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const streams = 8
			srv, _ := serve(t, segmented(tc.shared, tc.writes))
			c, wc := newClient(t, streams, tc.window)
			body := readAll(t, c, srv.URL+"/x", streams, func(name string) string { return segmentedBody(name, tc.shared, tc.writes) })
			if wc.dials.Load() != 1 {
				t.Fatalf("%d sessions, want 1", wc.dials.Load())
			}
			if wire := wc.bytes.Load(); float64(wire) > tc.maxWireFactor*float64(body) {
				t.Errorf("the session carried %d bytes for %d bytes of bodies, want at most %.1fx", wire, body, tc.maxWireFactor)
			}
		})
	}
}

// TestSharedWindowBounds: a session's request naming a window that is not
// a number of bytes, or one below the default, gets 400; one that names
// none, a valid one or one past the largest is answered with the window
// the session uses.
func TestSharedWindowBounds(t *testing.T) {
	srv, _ := serve(t, lines(1))
	for _, tc := range []struct {
		asked      string
		wantStatus int
		wantWindow string
	}{
		{"", http.StatusSwitchingProtocols, strconv.Itoa(DefaultSharedWindow)},
		{strconv.Itoa(16 << 20), http.StatusSwitchingProtocols, strconv.Itoa(16 << 20)},
		{strconv.Itoa(DefaultSharedWindow - 1), http.StatusBadRequest, ""},
		{strconv.Itoa(MaxSharedWindow + 1), http.StatusSwitchingProtocols, strconv.Itoa(MaxSharedWindow)},
		{"16MiB", http.StatusBadRequest, ""},
	} {
		t.Run("asked "+tc.asked, func(t *testing.T) {
			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			req := "GET " + Path + " HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: " + Protocol + "\r\n"
			if tc.asked != "" {
				req += WindowHeader + ": " + tc.asked + "\r\n"
			}
			io.WriteString(conn, req+"\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.wantStatus || resp.Header.Get(WindowHeader) != tc.wantWindow {
				t.Fatalf("status %d, window %q; want %d, %q", resp.StatusCode, resp.Header.Get(WindowHeader), tc.wantStatus, tc.wantWindow)
			}
		})
	}
}

// TestSharedWindowLargerThanAsked: a server that answers with a window
// larger than the client asked for (it would refer to bytes the client no
// longer keeps), or with none, gets no session: the watch fails (frontdoor
// tries another replica).
func TestSharedWindowLargerThanAsked(t *testing.T) {
	for _, window := range []string{strconv.Itoa(2 * DefaultSharedWindow), ""} {
		url := fakeServer(t, window, func(conn net.Conn, br *bufio.Reader) { io.Copy(io.Discard, br) })
		c, _ := client(t, 8)
		if resp, err := watch(c, context.Background(), url+"/x"); err == nil {
			resp.Body.Close()
			t.Fatalf("window %q: a session, want none", window)
		}
	}
}

// TestRefsToBytesNotKept: a server that refers to shared bytes the client
// does not keep (or sends shared bytes out of order, or a forget frame it
// did not announce or for bytes never sent) breaks the session: the
// stream's body fails, it does not end as if complete.
func TestRefsToBytesNotKept(t *testing.T) {
	ref := func(nums ...uint32) []byte {
		var p []byte
		for _, n := range nums {
			p = binary.BigEndian.AppendUint32(p, n)
		}
		return p
	}
	blob := bytes.Repeat([]byte("b"), minShared)
	shared := func(nums ...uint32) []byte {
		var b []byte
		for _, n := range nums {
			b = appendFrame(b, frameShared, n, blob)
		}
		return b
	}
	for _, tc := range []struct {
		name   string
		frames []byte
		why    string // in the error, if set
	}{
		{"never sent", appendFrame(nil, frameRefs, 1, ref(1)), ""},
		{"after the last", appendFrame(shared(1), frameRefs, 1, ref(2)), ""},
		{"out of order", shared(2), ""},
		{"refs of 3 bytes", appendFrame(shared(1), frameRefs, 1, []byte{0, 0, 1}), ""},
		{"forgotten", func() []byte {
			var nums []uint32
			for n := range uint32(DefaultSharedWindow/windowPerShared + 1) {
				nums = append(nums, n+1)
			}
			return appendFrame(shared(nums...), frameRefs, 1, ref(1))
		}(), ""},
		{"forgotten by a forget frame", appendFrame(appendFrame(shared(1, 2), frameForget, 1, nil), frameRefs, 1, ref(1)), "refers to shared bytes 1, not kept"},
		{"forget before any shared", appendFrame(nil, frameForget, 1, nil), "forget through shared bytes 1 unexpected"},
		{"forget past the last", appendFrame(shared(1, 2), frameForget, 3, nil), "forget through shared bytes 3 unexpected"},
		{"forget frame with a payload", appendFrame(shared(1), frameForget, 1, []byte{0}), "forget of 1 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := fakeServer(t, strconv.Itoa(DefaultSharedWindow), func(conn net.Conn, br *bufio.Reader) {
				// The stream's head answers its open.
				if readOpen(br) != nil {
					return
				}
				head, _ := proto.Marshal(&heraldv1.WatchStreamHead{Code: http.StatusOK})
				conn.Write(append(appendFrame(nil, frameHead, 1, head), tc.frames...))
				io.Copy(io.Discard, br)
			})
			c, _ := client(t, 8)
			resp := get(t, c, context.Background(), url+"/x")
			defer resp.Body.Close()
			_, err := io.ReadAll(resp.Body)
			if err == nil || !errors.Is(err, errProtocol) {
				t.Fatalf("the body ended with %v, want a protocol error", err)
			}
			if tc.why != "" && !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("the body ended with %v, want %q", err, tc.why)
			}
		})
	}
}

// TestSharedBytesForget: both ends forget the oldest shared bytes first,
// by total size and by number.
func TestSharedBytesForget(t *testing.T) {
	s := newSharedBytes(DefaultSharedWindow, nil)
	var forgot []uint32
	forget := func(n uint32, _ []byte) { forgot = append(forgot, n) }
	big := make([]byte, DefaultSharedWindow/4)
	for range 4 {
		s.add(big, forget)
	}
	if len(forgot) != 0 || s.next() != 5 {
		t.Fatalf("forgot %v with the window just full, next %d", forgot, s.next())
	}
	s.add(make([]byte, 1), forget)
	if _, ok := s.get(1); ok || len(forgot) != 1 || forgot[0] != 1 {
		t.Fatalf("one byte past the window: forgot %v", forgot)
	}
	for n := uint32(2); n <= 5; n++ {
		if _, ok := s.get(n); !ok {
			t.Fatalf("%d forgotten too", n)
		}
	}
	c := newSharedBytes(DefaultSharedWindow, nil)
	for range DefaultSharedWindow/windowPerShared + 1 {
		c.add([]byte{1}, nil)
	}
	if _, ok := c.get(1); ok {
		t.Fatal("kept more numbers than the window allows")
	}
	if _, ok := c.get(2); !ok {
		t.Fatal("forgot more than the oldest")
	}
	// Numbers wrap around.
	w := sharedBytes{forgot: math.MaxUint32 - 1, window: DefaultSharedWindow}
	for i := range 3 {
		if n := w.next(); n != uint32(math.MaxUint32+i) {
			t.Fatalf("number %d is %d", i, n)
		}
		w.add([]byte{byte(i)}, nil)
	}
	for i, n := range []uint32{math.MaxUint32, 0, 1} {
		if b, ok := w.get(n); !ok || b[0] != byte(i) {
			t.Fatalf("number %d: %v %v", n, b, ok)
		}
	}
	if _, ok := w.get(2); ok {
		t.Fatal("a number not sent yet is kept")
	}
	if _, ok := w.get(math.MaxUint32 - 1); ok {
		t.Fatal("a forgotten number is kept")
	}
}

// TestSharedForgetThrough: a forget frame's number forgets the oldest
// bytes up to it at the end that reads it; one of bytes not sent yet, or
// before what this end already forgot, is refused and forgets nothing.
func TestSharedForgetThrough(t *testing.T) {
	s := newSharedBytes(DefaultSharedWindow, nil)
	for i := range 4 {
		s.add([]byte{byte(i)}, nil)
	}
	if s.forgetThrough(5, nil) || s.next() != 5 || len(s.blobs) != 4 {
		t.Fatalf("forget through 5 of 4 sent: kept %d", len(s.blobs))
	}
	var forgot []uint32
	if !s.forgetThrough(2, func(n uint32, _ []byte) { forgot = append(forgot, n) }) || !slices.Equal(forgot, []uint32{1, 2}) {
		t.Fatalf("forget through 2 forgot %v", forgot)
	}
	if _, ok := s.get(2); ok {
		t.Fatal("2 still kept")
	}
	if b, ok := s.get(3); !ok || b[0] != 2 {
		t.Fatalf("3: %v %v", b, ok)
	}
	if !s.forgetThrough(2, nil) || len(s.blobs) != 2 {
		t.Fatal("forget through what is already forgotten: not a no-op")
	}
	if s.forgetThrough(1, nil) {
		t.Fatal("forget through a number before the last forgotten accepted")
	}
	if !s.forgetThrough(4, nil) || s.blobs != nil || s.size != 0 || s.next() != 5 {
		t.Fatalf("forget through the last: %d kept, %d bytes, next %d", len(s.blobs), s.size, s.next())
	}
	// Numbers wrap around.
	w := sharedBytes{forgot: math.MaxUint32 - 1, window: DefaultSharedWindow}
	for i := range 3 {
		w.add([]byte{byte(i)}, nil)
	}
	if !w.forgetThrough(0, nil) || len(w.blobs) != 1 || w.next() != 2 {
		t.Fatalf("forget through 0 after a wrap: %d kept, next %d", len(w.blobs), w.next())
	}
}

// forgets lists the forget frames in b (a session's frames) and drops b.
func forgets(t *testing.T, b *[]byte) []uint32 {
	t.Helper()
	var nums []uint32
	for off := 0; off < len(*b); off += headerLen + frameLen(*b, off) {
		if frameType((*b)[off]) == frameForget {
			nums = append(nums, binary.BigEndian.Uint32((*b)[off+1:off+5]))
		}
	}
	*b = (*b)[:0]
	return nums
}

// TestSharedExpiry: once a period, fanout forgets the oldest shared bytes
// that no stream used (sent or referred to) in that period and the one
// before, at both ends (a forget frame): all of them in a session whose
// streams used none, none older than one still in use; the same bytes
// shared again afterwards go as a new shared frame.
func TestSharedExpiry(t *testing.T) {
	bs := blobs(4, minShared)
	newSession := func() *session {
		return &session{shared: map[*byte]sharedNum{}, sent: sharedBytes{window: DefaultSharedWindow}}
	}
	ss := newSession()
	for _, b := range bs {
		ss.sharedLocked(b) // 1 to 4
	}
	if ss.expireLocked() {
		t.Fatal("an expiry that forgot nothing said it queued a forget frame")
	}
	if got := forgets(t, &ss.out); got != nil {
		t.Fatalf("forgot %v of what was sent in the period", got)
	}
	ss.sharedLocked(bs[2]) // 3, still in use
	ss.expireLocked()
	if got := forgets(t, &ss.out); got != nil {
		t.Fatalf("forgot %v of what was used in the last two periods", got)
	}
	if !ss.expireLocked() {
		t.Fatal("an expiry that forgot 1 and 2 said it queued no forget frame")
	}
	if got := forgets(t, &ss.out); !slices.Equal(got, []uint32{2}) {
		t.Fatalf("with 3 used a period ago: forget frames %v, want through 2", got)
	}
	if _, ok := ss.sent.get(2); ok || len(ss.shared) != 2 {
		t.Fatalf("2 still kept (%d numbers frontdoor keeps)", len(ss.shared))
	}
	if n := ss.sharedLocked(bs[0]); n != 5 || frameType(ss.out[0]) != frameShared {
		t.Fatalf("forgotten bytes shared again as %d (frame %v), want 5 in a shared frame", n, frameType(ss.out[0]))
	}
	ss.out = ss.out[:0]
	if !ss.expireLocked() { // 3 and 4 unused for two periods, 5 used in this one
		t.Fatal("the expiry that forgot 3 and 4 said it queued no forget frame")
	}
	if ss.expireLocked() { // 5 used in the one before
		t.Fatal("an expiry that kept 5, used a period ago, said it queued a forget frame")
	}
	if !ss.expireLocked() {
		t.Fatal("the expiry that forgot 5 said it queued no forget frame")
	}
	if got := forgets(t, &ss.out); !slices.Equal(got, []uint32{4, 5}) || ss.sent.blobs != nil || len(ss.shared) != 0 {
		t.Fatalf("forget frames %v, want through 4 then through 5; %d kept", got, len(ss.sent.blobs))
	}

	// The oldest used, forgotten by the window since: everything after
	// it may be in use, and stays.
	ss = newSession()
	ss.sent.window = DefaultSharedWindow
	for range DefaultSharedWindow / windowPerShared {
		ss.sharedLocked(make([]byte, minShared)) // each its own bytes
	}
	ss.expireLocked()
	ss.sharedLocked(make([]byte, minShared)) // forgets 1, the oldest used
	ss.expireLocked()
	if got := forgets(t, &ss.out); got != nil {
		t.Fatalf("forgot %v after the window forgot the oldest used", got)
	}

	// The oldest used in this period, forgotten by the window before the
	// period ends: a later, newer use does not take its place, and
	// nothing is forgotten.
	ss = newSession()
	first := make([][]byte, DefaultSharedWindow/windowPerShared)
	for i := range first {
		first[i] = make([]byte, minShared)
		ss.sharedLocked(first[i])
	}
	ss.expireLocked()
	ss.expireLocked() // a period with no use: used and usedBefore empty
	forgets(t, &ss.out)
	ss.sharedLocked(first[1]) // 2, the oldest used in this period
	ss.sharedLocked(make([]byte, minShared))
	ss.sharedLocked(make([]byte, minShared)) // the window forgets 1 and 2
	if _, ok := ss.sent.get(2); ok {
		t.Fatal("the window kept 2")
	}
	ss.expireLocked()
	if got := forgets(t, &ss.out); got != nil {
		t.Fatalf("forgot %v after the window forgot the oldest used in the period", got)
	}

}

// TestSharedForgottenWhileIdle: over a real session, the shared bytes of a
// session whose streams go quiet are forgotten at both ends (the session
// keeps none), and the same bytes written again afterwards cross again:
// every body is whole. An ended session keeps nothing (SharedBytes).
func TestSharedForgottenWhileIdle(t *testing.T) {
	const streams = 2
	shared := blobs(4, 2000)
	wrote, again := make(chan struct{}, streams), make(chan struct{})
	mux := &Server{SharedIdle: time.Millisecond, Handler: httpWatch{http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := w.(SegmentWriter)
		w.WriteHeader(http.StatusOK)
		write := func() {
			for _, b := range shared {
				sw.WriteSegments([]Segment{{B: b, Shared: true}})
			}
			http.NewResponseController(w).Flush()
		}
		write()
		wrote <- struct{}{}
		select {
		case <-again:
			write()
		case <-r.Context().Done():
		}
	})}}
	srv := serveHandler(t, mux, mux)
	c, wc := client(t, streams)
	var body atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		want := strings.Repeat(string(bytes.Join(shared, nil)), 2)
		body.Store(int64(readAll(t, c, srv.URL+"/x", streams, func(string) string { return want })))
	}()
	for range streams {
		<-wrote
	}
	once := int64(len(bytes.Join(shared, nil)))
	deadline := time.Now().Add(10 * time.Second)
	for mux.SharedBytes() != 0 || c.SharedBytes() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the quiet session keeps %d shared bytes in the server and %d in the client, want none", mux.SharedBytes(), c.SharedBytes())
		}
		runtime.Gosched()
	}
	close(again)
	<-done
	// A session that ends keeps nothing at either end.
	c.Close()
	for mux.SharedBytes() != 0 || c.SharedBytes() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the sessions ended, %d shared bytes kept in the server and %d in the client", mux.SharedBytes(), c.SharedBytes())
		}
		runtime.Gosched()
	}
	if wire := wc.bytes.Load(); wire < 2*once {
		t.Errorf("the session carried %d bytes for %d bytes of bodies (%d shared bytes): not sent again", wire, body.Load(), once)
	}
}

// TestSharedWaitsForCredit: a stream whose client stops reading until the
// stream's credit is spent gets, once it reads, every byte of its body,
// shared segments included, in order (the writes that waited for credit
// went as refs too).
func TestSharedWaitsForCredit(t *testing.T) {
	shared := blobs(4, 16<<10)
	const writes = 2 * window / (16 << 10)
	full := make(chan struct{})
	srv, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := w.(SegmentWriter)
		w.WriteHeader(http.StatusOK)
		sent := 0
		for i := range writes {
			b := shared[i%len(shared)]
			if sent+len(b) > window && sent <= window {
				close(full) // this write waits for credit
			}
			if _, err := sw.WriteSegments([]Segment{{B: b, Shared: true}}); err != nil {
				return
			}
			sent += len(b)
		}
	}))
	c, wc := client(t, 8)
	resp := get(t, c, context.Background(), srv.URL+"/x")
	defer resp.Body.Close()
	<-full
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var want []byte
	for i := range writes {
		want = append(want, shared[i%len(shared)]...)
	}
	if !bytes.Equal(body, want) {
		t.Fatalf("%d bytes, want %d; differ from byte %d", len(body), len(want), firstDiff(string(body), string(want)))
	}
	if wire := wc.bytes.Load(); wire > int64(len(body))/10 {
		t.Errorf("the session carried %d bytes for a body of %d: the writes that waited went as data", wire, len(body))
	}
}

// TestTryWriteSegmentsNeverWaits: TryWriteSegments writes as long as the
// stream's credit allows and then, instead of waiting for the client,
// writes nothing and reports false; a write larger than a stream sends
// whole (wholeMax) is refused at once. What it refused, written with
// WriteSegments once the client reads, follows what it wrote, each byte
// once.
func TestTryWriteSegmentsNeverWaits(t *testing.T) {
	shared := blobs(4, 16<<10)
	const extra = 2 // writes after the first refusal
	refused := make(chan int, 1)
	srv, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := w.(SegmentWriter)
		w.WriteHeader(http.StatusOK)
		if ok, err := sw.TryWriteSegments([]Segment{{B: make([]byte, wholeMax+1)}}); ok || err != nil {
			t.Errorf("a write over wholeMax: %v, %v; want false, nil", ok, err)
		}
		n := 0
		for ; ; n++ {
			ok, err := sw.TryWriteSegments([]Segment{{B: shared[n%len(shared)], Shared: true}})
			if err != nil {
				t.Error(err)
				refused <- -1
				return
			}
			if !ok {
				break
			}
		}
		refused <- n
		for i := n; i < n+extra; i++ {
			if _, err := sw.WriteSegments([]Segment{{B: shared[i%len(shared)], Shared: true}}); err != nil {
				return
			}
		}
	}))
	c, _ := client(t, 8)
	resp := get(t, c, context.Background(), srv.URL+"/x")
	defer resp.Body.Close()
	n := <-refused
	if n < 0 {
		t.FailNow()
	}
	if want := window / (16 << 10); n != want {
		t.Errorf("%d writes before the first refusal, want %d (the stream's credit)", n, want)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var want []byte
	for i := range n + extra {
		want = append(want, shared[i%len(shared)]...)
	}
	if !bytes.Equal(body, want) {
		t.Fatalf("%d bytes, want %d; differ from byte %d", len(body), len(want), firstDiff(string(body), string(want)))
	}
}

// TestWholeWriteAfterUncreditedRead: the client credits what it read only
// once it is creditStep, so a client that has read everything may leave
// up to creditStep-1 bytes uncredited for good. A write that the stream's
// credit no longer fits because of them, though within the window, still
// reaches the client, whole and in order: here the client reads a first
// write of less than creditStep (and so credits none), and the stream
// then writes more than the credit left at once.
func TestWholeWriteAfterUncreditedRead(t *testing.T) {
	const first = 100 << 10
	second := bytes.Repeat([]byte{'b'}, window-first/2) // over window-first
	read := make(chan struct{})
	srv, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := w.(SegmentWriter)
		w.WriteHeader(http.StatusOK)
		if _, err := sw.WriteSegments([]Segment{{B: bytes.Repeat([]byte{'a'}, first)}}); err != nil {
			return
		}
		select {
		case <-read:
		case <-r.Context().Done():
			return
		}
		// Two segments, so that no single one is over wholeMax.
		sw.WriteSegments([]Segment{{B: second[:len(second)/2]}, {B: second[len(second)/2:]}})
	}))
	c, _ := client(t, 8)
	// Bounds the failure (a write that waits for credit never ends), not
	// a step of the test.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp := get(t, c, ctx, srv.URL+"/x")
	defer resp.Body.Close()
	head := make([]byte, first)
	if _, err := io.ReadFull(resp.Body, head); err != nil {
		t.Fatal(err)
	}
	if want := bytes.Repeat([]byte{'a'}, first); !bytes.Equal(head, want) {
		t.Fatalf("the first write differs from byte %d", firstDiff(string(head), string(want)))
	}
	close(read)
	rest, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%d bytes of the second write's %d, then: %v", len(rest), len(second), err)
	}
	if !bytes.Equal(rest, second) {
		t.Fatalf("the second write: %d bytes, want %d; differ from byte %d", len(rest), len(second), firstDiff(string(rest), string(second)))
	}
}
