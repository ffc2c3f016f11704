package frontdoor

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"herald.dev/libs/storage"
)

// streamingFanout is a fanout replica whose watches send one event and then
// stay open until the request ends; ended receives each watch's end.
func streamingFanout(t *testing.T) (*fanoutFake, chan struct{}) {
	ended := make(chan struct{}, 64)
	srv := newFanoutFake(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", storage.MediaJSON)
		w.Write([]byte(`{"type":"ADDED","object":{}}` + "\n"))
		http.NewResponseController(w).Flush()
		<-r.Context().Done()
		ended <- struct{}{}
	}))
	t.Cleanup(srv.Close)
	return srv, ended
}

// eventually polls cond until it holds, failing after 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition, not synchronizing
	}
}

// openWatch starts a watch through the frontdoor at base and returns its
// reader after the first event.
func openWatch(t *testing.T, c *http.Client, base string) (*bufio.Reader, io.Closer) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+"/api/v1/namespaces/ns1/pods?watch=true", nil)
	req.Header.Set("Authorization", "Bearer "+tokAlice)
	resp, err := c.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("watch: %v %v", resp, err)
	}
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatalf("first event: %v", err)
	}
	return br, resp.Body
}

// TestWatchCountReleasedOnAbort: when a client goes away mid-watch (its
// connection closed, or its HTTP/2 stream reset), the reverse proxy aborts
// with panic(http.ErrAbortHandler); the replica's open-watch count, which
// routing uses, must still return to 0, and the upstream watch must end.
func TestWatchCountReleasedOnAbort(t *testing.T) {
	for _, proto := range []string{"HTTP/1.1", "HTTP/2"} {
		t.Run(proto, func(t *testing.T) {
			fan, ended := streamingFanout(t)
			s, _ := testServer(t, fan.URL, nil)
			front := httptest.NewUnstartedServer(s)
			front.EnableHTTP2 = proto == "HTTP/2"
			front.StartTLS()
			defer front.Close()
			c := front.Client()
			if proto == "HTTP/1.1" {
				c.Transport.(*http.Transport).TLSClientConfig.NextProtos = []string{"http/1.1"}
				c.Transport.(*http.Transport).ForceAttemptHTTP2 = false
				c.Transport.(*http.Transport).TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
			}
			b := s.fanout.backends[0]
			for range 3 {
				_, body := openWatch(t, c, front.URL)
				if n := b.open.Load(); n != 1 {
					t.Fatalf("open watches during the watch: %d, want 1", n)
				}
				body.Close() // the client resets mid-watch
				<-ended
				eventually(t, "the open-watch count to return to 0", func() bool { return b.open.Load() == 0 })
				c.CloseIdleConnections()
			}
		})
	}
}

// TestRebalanceShedsExcessWatches: a replica added while another holds
// every watch gets its share as the loaded one's excess is ended, cleanly
// (io.EOF after a whole event: the client resumes from its
// resourceVersion), a bounded number per round, until both hold their
// share; then nothing more is ended.
func TestRebalanceShedsExcessWatches(t *testing.T) { testRebalanceShedsExcessWatches(t) }

func testRebalanceShedsExcessWatches(t *testing.T) {
	old, oldEnded := streamingFanout(t)
	fresh, _ := streamingFanout(t)
	s, _ := testServer(t, old.URL, func(c *Config) { c.FanoutRebalanceShare = 0.1 })
	front := httptest.NewServer(s)
	defer front.Close()
	p := s.fanout
	type watch struct {
		r    *bufio.Reader
		body io.Closer
	}
	endOf := make(chan error, 16)
	read := func(w watch) {
		_, err := w.r.ReadString('\n')
		endOf <- err
	}
	for range 4 {
		r, body := openWatch(t, front.Client(), front.URL)
		defer body.Close()
		go read(watch{r, body})
	}
	a := p.backends[0]
	// A replica appears (as a refresh would add it).
	u, _ := url.Parse(fresh.URL)
	b := p.newBackend(u)
	b.origin = u
	p.mu.Lock()
	p.backends = append(p.backends, b)
	p.mu.Unlock()

	for round, want := range [][2]int64{{3, 1}, {2, 2}} {
		p.rebalance() // 4 watches over 2 replicas: fair is 2; 10% of 4 rounds up to 1 per round
		select {
		case err := <-endOf:
			if !errors.Is(err, io.EOF) {
				t.Fatalf("round %d: the shed watch ended with %v, want a clean end (io.EOF)", round, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: no watch was ended", round)
		}
		<-oldEnded                                         // the upstream watch on the loaded replica ended too
		r, body := openWatch(t, front.Client(), front.URL) // the client resumes
		defer body.Close()
		go read(watch{r, body})
		eventually(t, "the resumed watch on the new replica", func() bool {
			return a.open.Load() == want[0] && b.open.Load() == want[1]
		})
	}
	var moved atomic.Int64
	p.shed = func(string) { moved.Add(1) }
	p.rebalance()
	if moved.Load() != 0 || a.open.Load() != 2 || b.open.Load() != 2 {
		t.Fatalf("with both replicas at their share: %d and %d open, %d ended; want 2 and 2, none",
			a.open.Load(), b.open.Load(), moved.Load())
	}
	old.servedAs(t)
	fresh.servedAs(t)
}

// TestRebalanceSkipsFailingReplicas: no watch is moved towards a replica
// whose last attempt failed, unless it accepts connections again.
func TestRebalanceSkipsFailingReplicas(t *testing.T) {
	old, _ := streamingFanout(t)
	s, _ := testServer(t, old.URL, nil)
	front := httptest.NewServer(s)
	defer front.Close()
	for range 2 {
		_, body := openWatch(t, front.Client(), front.URL)
		defer body.Close()
	}
	p := s.fanout
	var moved atomic.Int64
	p.shed = func(string) { moved.Add(1) }
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	u, _ := url.Parse("http://" + ln.Addr().String())
	ln.Close() // refused from now on
	dead := p.newBackend(u)
	dead.origin = u
	dead.failing.Store(true)
	p.mu.Lock()
	p.backends = append(p.backends, dead)
	p.mu.Unlock()
	p.rebalance()
	if moved.Load() != 0 {
		t.Fatalf("%d watches moved towards a dead replica", moved.Load())
	}
	ln, err := net.Listen("tcp", u.Host) // it comes back
	if err != nil {
		t.Skipf("cannot listen on %s again: %v", u.Host, err)
	}
	defer ln.Close()
	p.rebalance()
	if moved.Load() != 1 || dead.failing.Load() {
		t.Fatalf("with the replica back: %d watches moved (failing %v), want 1", moved.Load(), dead.failing.Load())
	}
}

// TestShedBodyEndsBetweenLines: an ended watch body stops at a line
// boundary: at once between lines, after the line in progress otherwise,
// dropping a partial line read past the boundary.
func TestShedBodyEndsBetweenLines(t *testing.T) {
	pr, pw := io.Pipe()
	cancelled := false
	body := &shedBody{ReadCloser: pr, boundary: true, cancel: func() { cancelled = true; pw.CloseWithError(context.Canceled) }}
	buf := make([]byte, 64)
	readWith := func(data string) (string, error) {
		go pw.Write([]byte(data))
		n, err := body.Read(buf)
		return string(buf[:n]), err
	}
	if got, err := readWith("{1}\n{2"); got != "{1}\n{2" || err != nil {
		t.Fatalf("read %q %v", got, err)
	}
	body.end() // mid-line: the line completes first
	if cancelled {
		t.Fatal("cancelled mid-line")
	}
	if got, err := readWith("}\n{3}\n{4"); got != "}\n{3}\n" || err != io.EOF {
		t.Fatalf("read %q %v, want the rest of the lines, then the end", got, err)
	}
	if n, err := body.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("after the end: %d %v", n, err)
	}

	pr, pw = io.Pipe()
	body = &shedBody{ReadCloser: pr, boundary: true, cancel: func() { cancelled = true; pw.CloseWithError(context.Canceled) }}
	if got, err := readWith("{1}\n"); got != "{1}\n" || err != nil {
		t.Fatalf("read %q %v", got, err)
	}
	done := make(chan error)
	go func() { _, err := body.Read(buf); done <- err }() // idle between lines
	body.end()
	if err := <-done; err != io.EOF || !cancelled {
		t.Fatalf("an idle stream ended with %v (upstream cancelled: %v), want io.EOF", err, cancelled)
	}
}

// protobufFrames returns n frames of a protobuf watch stream. Newline
// bytes fall inside each: the first byte of a WatchEvent is 0x0a (the tag
// of its field 1, the type), and the objects hold more.
func protobufFrames(t *testing.T, n int) [][]byte {
	t.Helper()
	var frames [][]byte
	for i := range n {
		f, err := storage.ProtobufWatchEvent("MODIFIED", []byte(fmt.Sprintf("k8s\x00\n%d\n", i)))
		if err != nil {
			t.Fatal(err)
		}
		frames = append(frames, f)
	}
	return frames
}

// TestShedBodyEndsBetweenFrames: an ended protobuf watch body stops after
// a whole length-prefixed frame, wherever the reads split the frames and
// the end falls: what it returns is the frames read up to the end, then
// the rest of the frame in progress, never part of one.
func TestShedBodyEndsBetweenFrames(t *testing.T) {
	frames := protobufFrames(t, 3)
	stream := bytes.Join(frames, nil)
	ends := []int{} // offsets at which a frame ends
	for at, f := range frames {
		ends = append(ends, len(bytes.Join(frames[:at], nil))+len(f))
	}
	for split := 1; split < len(stream); split++ {
		for step := 1; step <= 7; step++ {
			r := io.NopCloser(&stepReader{b: stream, step: step})
			body := &shedBody{ReadCloser: r, frames: true, boundary: true, cancel: func() {}}
			// Read up to split, then end the body and read to its end.
			var got []byte
			buf := make([]byte, 64)
			for len(got) < split {
				n, err := body.Read(buf[:min(len(buf), split-len(got))])
				got = append(got, buf[:n]...)
				if err != nil {
					t.Fatalf("split %d step %d: read before the end: %v", split, step, err)
				}
			}
			body.end()
			var err error
			for err == nil {
				var n int
				n, err = body.Read(buf)
				got = append(got, buf[:n]...)
			}
			if err != io.EOF {
				t.Fatalf("split %d step %d: ended with %v, want io.EOF", split, step, err)
			}
			want := ends[slices.IndexFunc(ends, func(e int) bool { return e >= split })]
			if !bytes.Equal(got, stream[:want]) {
				t.Fatalf("split %d step %d: got %d bytes, want the %d up to the end of the frame in progress",
					split, step, len(got), want)
			}
		}
	}

	// Ended while waiting between frames: at once, the upstream cancelled.
	pr, pw := io.Pipe()
	cancelled := false
	body := &shedBody{ReadCloser: pr, frames: true, boundary: true, cancel: func() { cancelled = true; pw.CloseWithError(context.Canceled) }}
	go pw.Write(frames[0])
	buf := make([]byte, 64)
	if n, err := body.Read(buf); n != len(frames[0]) || err != nil {
		t.Fatalf("the first frame: %d bytes, %v", n, err)
	}
	done := make(chan error)
	go func() { _, err := body.Read(buf); done <- err }()
	body.end()
	if err := <-done; err != io.EOF || !cancelled {
		t.Fatalf("an idle stream ended with %v (upstream cancelled: %v), want io.EOF", err, cancelled)
	}
}

// stepReader reads b at most step bytes at a time.
type stepReader struct {
	b    []byte
	step int
}

func (r *stepReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), r.step)], r.b)
	r.b = r.b[n:]
	return n, nil
}

// TestRebalanceEndsProtobufWatchBetweenFrames: a kubelet's watch
// (protobuf) shed while a frame is half written, the half holding a
// newline byte, reaches its client as whole frames and then a clean end.
func TestRebalanceEndsProtobufWatchBetweenFrames(t *testing.T) {
	frames := protobufFrames(t, 3)
	cut := 4 + bytes.IndexByte(frames[1][4:], '\n') + 1 // past the second frame's first newline byte, mid-frame
	resume := make(chan struct{})
	fan := newFanoutFake(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", storage.MediaProtobufWatch)
		rc := http.NewResponseController(w)
		w.Write(frames[0])
		w.Write(frames[1][:cut])
		rc.Flush()
		select {
		case <-resume:
		case <-r.Context().Done(): // the test failed before the shed
			return
		}
		w.Write(frames[1][cut:])
		w.Write(frames[2])
		rc.Flush()
		<-r.Context().Done()
	}))
	defer fan.Close()
	s, _ := testServer(t, fan.URL, nil)
	front := httptest.NewServer(s)
	defer front.Close()
	req, _ := http.NewRequest(http.MethodGet, front.URL+"/api/v1/namespaces/ns1/pods?watch=true", nil)
	req.Header.Set("Authorization", "Bearer "+tokAlice)
	req.Header.Set("Accept", storage.MediaProtobuf)
	c := *front.Client()
	c.Timeout = 30 * time.Second // a stream that never ends fails the test
	resp, err := c.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("watch: %v %v", resp, err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != storage.MediaProtobufWatch {
		t.Fatalf("Content-Type %q, want %q", ct, storage.MediaProtobufWatch)
	}
	first := make([]byte, len(frames[0])+cut)
	if _, err := io.ReadFull(resp.Body, first); err != nil {
		t.Fatalf("the first frame and a half: %v", err)
	}
	if n := s.fanout.backends[0].shedUpTo(1); n != 1 {
		t.Fatalf("shed %d watches, want 1", n)
	}
	close(resume)
	rest, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("the shed watch ended with %v, want a clean end", err)
	}
	got := append(first, rest...)
	want := bytes.Join(frames[:2], nil)
	if !bytes.HasPrefix(got, want) || (len(got) != len(want) && len(got) != len(want)+len(frames[2])) {
		t.Fatalf("the client got %d bytes, want whole frames: %d or %d", len(got), len(want), len(want)+len(frames[2]))
	}
}
