package watchsession

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// errNoSessions: the replica has no session endpoint (an older one).
var errNoSessions = errors.New("watchsession: the server has no sessions")

// errSessionEnded is a stream's error when its session ended under it.
var errSessionEnded = errors.New("watchsession: session ended")

// Client is an http.RoundTripper that carries GET requests without a body
// as streams of sessions, MaxStreams to a session, and passes everything
// else, and every request to a server without sessions, to Transport.
// Transport must speak HTTP/2 to the servers (a session is a full-duplex
// request).
type Client struct {
	Transport  http.RoundTripper
	MaxStreams int
	// Retry is how long a server that answered a session's request
	// without one is asked without sessions before it is asked again (a
	// rolling upgrade reaches it).
	Retry time.Duration
	// OpenTimeout bounds the wait for a session's response (0: 10s).
	OpenTimeout time.Duration
	// SharedWindow is the window of shared bytes a session asks for
	// (0: DefaultSharedWindow; brought within DefaultSharedWindow and
	// MaxSharedWindow): this end keeps up to that much of them per
	// session. See the package's documentation.
	SharedWindow int
	Log          *slog.Logger

	mu      sync.Mutex
	servers map[string]*server

	sharedKept atomic.Int64 // SharedBytes
}

// SharedBytes is the size of the shared bytes the client's sessions keep.
func (c *Client) SharedBytes() int64 { return c.sharedKept.Load() }

// server is the client's sessions to one server (scheme://host).
type server struct {
	sessions []*clientSession
	opening  *opening
	without  time.Time // until then: no sessions
}

// opening is a session being opened: done is closed once s or err is set.
type opening struct {
	done chan struct{}
	s    *clientSession
	err  error
}

// RoundTrip sends req as a stream of a session to its server.
func (c *Client) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodGet || (req.Body != nil && req.Body != http.NoBody) {
		return c.Transport.RoundTrip(req)
	}
	key := req.URL.Scheme + "://" + req.URL.Host
	for {
		s, err := c.session(req.Context(), key)
		if errors.Is(err, errNoSessions) {
			return c.Transport.RoundTrip(req)
		}
		if err != nil {
			return nil, err
		}
		resp, err := s.roundTrip(req)
		if errors.Is(err, errFull) {
			continue // another stream took the last place: another session
		}
		return resp, err
	}
}

// session returns a session to key with room for a stream, opening one if
// none has.
func (c *Client) session(ctx context.Context, key string) (*clientSession, error) {
	for {
		c.mu.Lock()
		if c.servers == nil {
			c.servers = map[string]*server{}
		}
		srv := c.servers[key]
		if srv == nil {
			srv = &server{}
			c.servers[key] = srv
		}
		if time.Now().Before(srv.without) {
			c.mu.Unlock()
			return nil, errNoSessions
		}
		for _, s := range srv.sessions {
			if s.room() {
				c.mu.Unlock()
				return s, nil
			}
		}
		op := srv.opening
		if op == nil {
			op = &opening{done: make(chan struct{})}
			srv.opening = op
			go c.open(key, srv, op)
		}
		c.mu.Unlock()
		select {
		case <-op.done:
			if op.err != nil {
				return nil, op.err
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// keepShared sets up the session's shared bytes, in the window the server
// answered (v): at most the one asked for, or the server would refer to
// bytes this end no longer keeps. A server that answers otherwise is asked
// without sessions for a while (errNoSessions): its watches go on streams
// of their own rather than fail.
func (s *clientSession) keepShared(v string, asked int) error {
	window, err := parseWindow(v)
	if err == nil && window > asked {
		err = fmt.Errorf("the server keeps a shared window of %d bytes, more than the %d asked for", window, asked)
	}
	if err != nil {
		return fmt.Errorf("%w: %v", errNoSessions, err)
	}
	s.shared = newSharedBytes(window, &s.c.sharedKept)
	return nil
}

// open opens a session to key for op.
func (c *Client) open(key string, srv *server, op *opening) {
	var resp *http.Response
	ctx, cancel := context.WithCancel(context.Background())
	s := &clientSession{c: c, key: key, ctx: ctx, cancel: cancel, ctlWake: make(chan struct{}, 1), streams: map[uint32]*clientStream{}, next: 1}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, key+Path, &ctlBody{s})
	if err == nil {
		req.Header.Set("Content-Type", ContentType)
		req.Header.Set(SharedHeader, "1")
		req.Header.Set(ForgetHeader, "1")
		if c.SharedWindow > 0 {
			req.Header.Set(SharedWindowHeader, strconv.Itoa(clampWindow(c.SharedWindow)))
		}
		timeout := c.OpenTimeout
		if timeout <= 0 {
			timeout = 10 * time.Second
		}
		timer := time.AfterFunc(timeout, cancel)
		resp, err = c.Transport.RoundTrip(req)
		switch {
		case !timer.Stop():
			err = fmt.Errorf("watchsession: no session within %s", timeout)
		case err != nil:
		case resp.StatusCode == http.StatusServiceUnavailable:
			// A replica stopping: tried again with the next watch.
			err = fmt.Errorf("watchsession: session refused (%s)", resp.Status)
		case resp.StatusCode != http.StatusOK || resp.ProtoMajor < 2 || resp.Header.Get("Content-Type") != ContentType:
			err = fmt.Errorf("%w (%s)", errNoSessions, resp.Status)
		case resp.Header.Get(SharedHeader) == "1":
			err = s.keepShared(resp.Header.Get(SharedWindowHeader), clampWindow(c.SharedWindow))
			s.forgets = resp.Header.Get(ForgetHeader) == "1"
		}
		if err != nil && resp != nil {
			// The request's body ends first: closing the response waits
			// for it.
			cancel()
			resp.Body.Close()
		}
	}
	c.mu.Lock()
	srv.opening = nil
	switch {
	case err == nil:
		// Listed before its reader starts, which drops it when it ends.
		srv.sessions = append(srv.sessions, s)
		op.s = s
		go s.read(resp.Body)
	case errors.Is(err, errNoSessions):
		c.logger().Info("watchsession: server has no sessions, asking it without", "server", key, "for", c.retry(), "err", err)
		srv.without = time.Now().Add(c.retry())
	}
	op.err = err
	c.mu.Unlock()
	if err != nil {
		cancel()
	}
	close(op.done)
}

// Close ends every session: their streams' bodies fail once what was
// sent is read.
func (c *Client) Close() {
	c.mu.Lock()
	var sessions []*clientSession
	for _, srv := range c.servers {
		sessions = append(sessions, srv.sessions...)
	}
	c.mu.Unlock()
	for _, s := range sessions {
		s.cancel()
	}
}

// drop forgets s (it ended).
func (c *Client) drop(s *clientSession) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if srv := c.servers[s.key]; srv != nil {
		for i, x := range srv.sessions {
			if x == s {
				srv.sessions = append(srv.sessions[:i], srv.sessions[i+1:]...)
				break
			}
		}
		if len(srv.sessions) == 0 && srv.opening == nil && time.Now().After(srv.without) {
			delete(c.servers, s.key) // a replica gone for good is forgotten
		}
	}
}

// sessionIdle is how long a session without streams stays open.
const sessionIdle = time.Minute

func (c *Client) maxStreams() int {
	if c.MaxStreams > 0 {
		return c.MaxStreams
	}
	return 100
}

func (c *Client) retry() time.Duration {
	if c.Retry > 0 {
		return c.Retry
	}
	return time.Minute
}

func (c *Client) logger() *slog.Logger {
	if c.Log != nil {
		return c.Log
	}
	return slog.Default()
}

// errFull: the session has no room for another stream.
var errFull = errors.New("watchsession: session full")

// clientSession is one session on the client.
type clientSession struct {
	c      *Client
	key    string
	ctx    context.Context    // the session's request's
	cancel context.CancelFunc // ends the session's request

	mu      sync.Mutex
	ctl     []byte        // frames to send
	ctlWake chan struct{} // (cap 1) ctl has frames, or the session ended
	// ctlClosed: the transport closed the request's body.
	ctlClosed bool
	streams   map[uint32]*clientStream
	next      uint32
	err       error       // the session ended
	idle      *time.Timer // closes the session once it has had no streams for sessionIdle

	// shared: the shared bytes the server sent that it may still refer
	// to (nil: the session does not use them); refBuf, refs: a refs
	// frame, and the bytes it refers to. The reader's only.
	shared *sharedBytes
	// forgets: the server sends forget frames (ForgetHeader).
	forgets bool
	refBuf  [4 * maxRefs]byte
	refs    [][]byte
}

// errIdle ends a session that had no streams for sessionIdle.
var errIdle = errors.New("watchsession: session idle")

// removeLocked forgets stream id, and arms the idle timer when it was the
// last.
func (s *clientSession) removeLocked(id uint32) {
	delete(s.streams, id)
	if len(s.streams) > 0 || s.err != nil {
		return
	}
	if s.idle == nil {
		s.idle = time.AfterFunc(sessionIdle, s.closeIfIdle)
	} else {
		s.idle.Reset(sessionIdle)
	}
}

// closeIfIdle ends the session if it still has no streams.
func (s *clientSession) closeIfIdle() {
	s.mu.Lock()
	idle := len(s.streams) == 0 && s.err == nil
	if idle {
		s.err = errIdle // no stream starts now
	}
	s.mu.Unlock()
	if idle {
		s.cancel()
	}
}

// room reports whether s can take another stream.
func (s *clientSession) room() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err == nil && len(s.streams) < s.c.maxStreams() && s.next < 1<<31
}

// send queues frames built by add.
func (s *clientSession) send(add func([]byte) []byte) {
	s.mu.Lock()
	if s.err == nil {
		s.ctl = add(s.ctl)
	}
	s.mu.Unlock()
	select {
	case s.ctlWake <- struct{}{}:
	default:
	}
}

// roundTrip opens a stream for req and waits for its response's head.
func (s *clientSession) roundTrip(req *http.Request) (*http.Response, error) {
	var head bytes.Buffer
	head.WriteString(req.Method)
	head.WriteByte(' ')
	head.WriteString(req.URL.RequestURI())
	head.WriteString(" HTTP/1.1\r\nHost: ")
	head.WriteString(req.URL.Host)
	head.WriteString("\r\n")
	if err := req.Header.Write(&head); err != nil {
		return nil, err
	}
	head.WriteString("\r\n")
	if head.Len() > maxHead {
		return nil, fmt.Errorf("watchsession: request head of %d bytes (limit %d)", head.Len(), maxHead)
	}
	ctx := req.Context()
	st := &clientStream{s: s, ctx: ctx, wake: make(chan struct{}, 1)}
	s.mu.Lock()
	if errors.Is(s.err, errIdle) {
		s.mu.Unlock()
		return nil, errFull // closed as idle meanwhile: another session
	}
	if s.err != nil {
		s.mu.Unlock()
		return nil, s.err
	}
	if len(s.streams) >= s.c.maxStreams() || s.next >= 1<<31 {
		s.mu.Unlock()
		return nil, errFull
	}
	st.id = s.next
	s.next++
	s.streams[st.id] = st
	if s.idle != nil {
		s.idle.Stop()
	}
	s.ctl = appendFrame(s.ctl, frameOpen, st.id, head.Bytes())
	s.mu.Unlock()
	select {
	case s.ctlWake <- struct{}{}:
	default:
	}
	for {
		st.mu.Lock()
		resp, err := st.resp, st.err
		st.mu.Unlock()
		if resp != nil {
			resp.Request = req // as the HTTP/2 transport's response
			return resp, nil
		}
		if err != nil {
			st.Close()
			return nil, err
		}
		select {
		case <-st.wake:
		case <-ctx.Done():
			st.Close()
			return nil, ctx.Err()
		}
	}
}

// read reads the server's frames until the session ends, then ends every
// stream still open.
func (s *clientSession) read(body io.ReadCloser) {
	br := bufio.NewReaderSize(body, 64<<10)
	err := s.readFrames(br)
	if s.shared != nil {
		s.shared.release()
	}
	if err == nil || errors.Is(err, io.EOF) {
		err = errSessionEnded
	} else if errors.Is(err, errProtocol) {
		s.c.logger().Warn("watchsession: session ended", "server", s.key, "err", err)
	}
	s.c.drop(s)
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	streams := s.streams
	s.streams = nil
	s.ctl = nil
	if s.idle != nil {
		s.idle.Stop()
	}
	s.mu.Unlock()
	for _, st := range streams {
		st.end(err)
	}
	// The request's body ends first: closing the response waits for it.
	s.cancel()
	body.Close()
}

func (s *clientSession) stream(id uint32) *clientStream {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.streams[id]
}

func (s *clientSession) readFrames(br *bufio.Reader) error {
	for {
		t, id, n, err := readHeader(br)
		if err != nil {
			return err
		}
		switch t {
		case frameHead:
			payload := make([]byte, n)
			if _, err := io.ReadFull(br, payload); err != nil {
				return err
			}
			st := s.stream(id)
			if st == nil {
				continue // closed before its head came
			}
			resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(payload)), nil)
			if err != nil {
				return fmt.Errorf("%w: stream %d's head: %v", errProtocol, id, err)
			}
			resp.Body, resp.ContentLength = st, -1
			resp.TransferEncoding, resp.Close, resp.Uncompressed = nil, false, false
			st.mu.Lock()
			st.resp = resp
			st.mu.Unlock()
			st.signal()
		case frameData:
			st := s.stream(id)
			if st == nil || n == 0 {
				if _, err := br.Discard(n); err != nil {
					return err
				}
				continue
			}
			b := getBuf(n)
			if _, err := io.ReadFull(br, b); err != nil {
				putBuf(b)
				return err
			}
			if !st.push(b) {
				return fmt.Errorf("%w: stream %d sent past its window", errProtocol, id)
			}
		case frameShared:
			if s.shared == nil || id != s.shared.next() {
				return fmt.Errorf("%w: shared bytes %d unexpected", errProtocol, id)
			}
			b := make([]byte, n)
			if _, err := io.ReadFull(br, b); err != nil {
				return err
			}
			s.shared.add(b, nil)
		case frameForget:
			if s.shared == nil || !s.forgets || !s.shared.forgetThrough(id, nil) {
				return fmt.Errorf("%w: forget through shared bytes %d unexpected", errProtocol, id)
			}
		case frameRefs:
			if s.shared == nil || n%4 != 0 {
				return fmt.Errorf("%w: refs of %d bytes unexpected", errProtocol, n)
			}
			p := s.refBuf[:n]
			if _, err := io.ReadFull(br, p); err != nil {
				return err
			}
			s.refs = s.refs[:0]
			for i := 0; i < n; i += 4 {
				num := binary.BigEndian.Uint32(p[i:])
				b, ok := s.shared.get(num)
				if !ok {
					return fmt.Errorf("%w: stream %d refers to shared bytes %d, not kept", errProtocol, id, num)
				}
				s.refs = append(s.refs, b)
			}
			st := s.stream(id)
			if st != nil && !st.pushShared(s.refs) {
				return fmt.Errorf("%w: stream %d sent past its window", errProtocol, id)
			}
			clear(s.refs)
		case frameEnd:
			payload := make([]byte, n)
			if _, err := io.ReadFull(br, payload); err != nil {
				return err
			}
			s.mu.Lock()
			st := s.streams[id]
			if st != nil {
				s.removeLocked(id)
			}
			s.mu.Unlock()
			if st != nil {
				end := io.EOF
				if n > 0 {
					end = fmt.Errorf("watchsession: stream ended: %s", payload)
				}
				st.end(end)
			}
		default:
			return fmt.Errorf("%w: %v from the server", errProtocol, t)
		}
	}
}

// ctlBody is a session's request body: the frames queued by send.
type ctlBody struct{ s *clientSession }

func (b *ctlBody) Read(p []byte) (int, error) {
	s := b.s
	for {
		s.mu.Lock()
		if s.ctlClosed {
			s.mu.Unlock()
			return 0, io.ErrClosedPipe
		}
		if len(s.ctl) > 0 {
			n := copy(p, s.ctl)
			s.ctl = s.ctl[:copy(s.ctl, s.ctl[n:])]
			if len(s.ctl) == 0 && cap(s.ctl) > 64<<10 {
				s.ctl = nil
			}
			s.mu.Unlock()
			return n, nil
		}
		if s.err != nil {
			s.mu.Unlock()
			return 0, io.EOF
		}
		s.mu.Unlock()
		select {
		case <-s.ctlWake:
		case <-s.ctx.Done():
			// The transport notices a cancelled request only between
			// reads of its body.
			return 0, s.ctx.Err()
		}
	}
}

// Close ends a Read waiting for frames: the transport closes the body when
// the stream or its connection fails, and waits for the Read to return
// before it fails the response.
func (b *ctlBody) Close() error {
	s := b.s
	s.mu.Lock()
	s.ctlClosed = true
	s.mu.Unlock()
	select {
	case s.ctlWake <- struct{}{}:
	default:
	}
	return nil
}

// clientStream is a stream's response body.
type clientStream struct {
	s    *clientSession
	id   uint32
	ctx  context.Context
	wake chan struct{} // (cap 1) state changed

	mu       sync.Mutex
	resp     *http.Response
	bufs     []chunk // data not read yet; bufs[0] from off
	off      int
	buffered int
	consumed int   // read since the last credit
	err      error // the body's end (io.EOF) or failure
	closed   bool
}

func (st *clientStream) signal() {
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

// chunk is data the server sent: a pooled buffer (getBuf) of a data frame,
// or shared bytes, which are never modified.
type chunk struct {
	b      []byte
	pooled bool
}

func (c chunk) release() {
	if c.pooled {
		putBuf(c.b)
	}
}

// push adds data the server sent (a pooled buffer, which the stream now
// owns); false if that is more than the stream's credit allowed.
func (st *clientStream) push(b []byte) bool {
	st.mu.Lock()
	if st.closed || st.err != nil {
		st.mu.Unlock()
		putBuf(b)
		return true
	}
	st.bufs = append(st.bufs, chunk{b: b, pooled: true})
	st.buffered += len(b)
	over := st.buffered > window
	st.mu.Unlock()
	st.signal()
	return !over
}

// pushShared adds the shared bytes of a refs frame, in order; false if that
// is more than the stream's credit allowed.
func (st *clientStream) pushShared(bs [][]byte) bool {
	st.mu.Lock()
	if st.closed || st.err != nil {
		st.mu.Unlock()
		return true
	}
	if st.bufs == nil {
		st.bufs = make([]chunk, 0, len(bs))
	}
	for _, b := range bs {
		st.bufs = append(st.bufs, chunk{b: b})
		st.buffered += len(b)
	}
	over := st.buffered > window
	st.mu.Unlock()
	st.signal()
	return !over
}

// end records the body's end; what was sent before it is still read.
func (st *clientStream) end(err error) {
	st.mu.Lock()
	if st.err == nil {
		st.err = err
	}
	st.mu.Unlock()
	st.signal()
}

// Read reads what the server sent; with an empty p it waits until there is
// something to read (or the body ended). It fails when the request's
// context ends.
func (st *clientStream) Read(p []byte) (int, error) {
	for {
		st.mu.Lock()
		if st.closed {
			st.mu.Unlock()
			return 0, errors.New("watchsession: read of a closed body")
		}
		if st.buffered > 0 {
			if len(p) == 0 {
				st.mu.Unlock()
				return 0, nil
			}
			n := 0
			for n < len(p) && len(st.bufs) > 0 {
				c := copy(p[n:], st.bufs[0].b[st.off:])
				n += c
				st.off += c
				if st.off == len(st.bufs[0].b) {
					st.bufs[0].release()
					st.bufs[0] = chunk{}
					st.bufs = st.bufs[1:]
					st.off = 0
				}
			}
			if len(st.bufs) == 0 {
				st.bufs = nil // an idle watch holds no slice
			}
			st.buffered -= n
			st.consumed += n
			credit := 0
			if st.consumed >= creditStep {
				credit, st.consumed = st.consumed, 0
			}
			st.mu.Unlock()
			if credit > 0 {
				st.s.send(func(b []byte) []byte { return appendCredit(b, st.id, uint32(credit)) })
			}
			return n, nil
		}
		if st.err != nil {
			err := st.err
			st.mu.Unlock()
			return 0, err
		}
		st.mu.Unlock()
		select {
		case <-st.wake:
		case <-st.ctx.Done():
			return 0, st.ctx.Err()
		}
	}
}

// Close ends the stream: the server is told to cancel it unless it has
// ended.
func (st *clientStream) Close() error {
	st.mu.Lock()
	if st.closed {
		st.mu.Unlock()
		return nil
	}
	st.closed = true
	for _, c := range st.bufs {
		c.release()
	}
	st.bufs, st.buffered = nil, 0
	st.mu.Unlock()
	s := st.s
	s.mu.Lock()
	_, open := s.streams[st.id]
	if open {
		s.removeLocked(st.id)
	}
	s.mu.Unlock()
	if open { // the server has not ended it
		s.send(func(b []byte) []byte { return appendFrame(b, frameCancel, st.id, nil) })
	}
	return nil
}

// Data buffers, pooled by size (powers of two from 1 KB to maxData).
var bufPools [9]sync.Pool

func bufClass(n int) int {
	c := 0
	for size := 1 << 10; size < n; size <<= 1 {
		c++
	}
	return c
}

func getBuf(n int) []byte {
	c := bufClass(n)
	if b, ok := bufPools[c].Get().(*[]byte); ok {
		return (*b)[:n]
	}
	return make([]byte, n, 1<<(10+c))
}

func putBuf(b []byte) {
	c := bufClass(cap(b))
	if c < len(bufPools) && cap(b) == 1<<(10+c) {
		b = b[:cap(b)]
		bufPools[c].Put(&b)
	}
}
