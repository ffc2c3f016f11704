package watchsession

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// errSessionEnded is a stream's error when its session ended under it.
var errSessionEnded = errors.New("watchsession: session ended")

// Client carries watches to servers as streams of sessions, MaxStreams to a
// session.
type Client struct {
	// Dial connects to a server's address (nil: a net.Dialer's).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// TLS is the configuration of sessions to https servers.
	TLS        *tls.Config
	MaxStreams int
	// OpenTimeout bounds the opening of a session: its connection, TLS
	// handshake and upgrade (0: 10s).
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
}

// opening is a session being opened: done is closed once s or err is set.
type opening struct {
	done chan struct{}
	s    *clientSession
	err  error
}

// Watch opens a stream for req to the server at u (http or https, its
// host) and returns the response once its head has come: its body is the
// stream's, and closing it cancels the watch. ctx bounds the wait for the
// head and the reads of the body.
func (c *Client) Watch(ctx context.Context, u *url.URL, req *heraldv1.WatchStreamRequest) (*http.Response, error) {
	open, err := proto.Marshal(req)
	if err != nil {
		return nil, err
	}
	if len(open) > maxHead {
		return nil, fmt.Errorf("watchsession: a watch request of %d bytes (limit %d)", len(open), maxHead)
	}
	key := u.Scheme + "://" + u.Host
	for {
		s, err := c.session(ctx, key)
		if err != nil {
			return nil, err
		}
		resp, err := s.watch(ctx, open)
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

// open opens a session to key for op.
func (c *Client) open(key string, srv *server, op *opening) {
	conn, br, window, err := c.connect(key)
	c.mu.Lock()
	srv.opening = nil
	if err == nil {
		s := &clientSession{c: c, key: key, conn: conn, ctlWake: make(chan struct{}, 1), streams: map[uint32]*clientStream{}, next: 1,
			shared: newSharedBytes(window, &c.sharedKept)}
		// Listed before its reader starts, which drops it when it ends.
		srv.sessions = append(srv.sessions, s)
		op.s = s
		go s.read(br)
		go s.writeCtl()
	}
	op.err = err
	c.mu.Unlock()
	close(op.done)
}

// connect connects to key's server and upgrades the connection to a
// session; it returns the connection, its reader, and the session's window.
func (c *Client) connect(key string) (net.Conn, *bufio.Reader, int, error) {
	u, err := url.Parse(key)
	if err != nil {
		return nil, nil, 0, err
	}
	timeout := c.OpenTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	dial := c.Dial
	if dial == nil {
		dial = (&net.Dialer{KeepAlive: 30 * time.Second}).DialContext
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), map[bool]string{true: "443", false: "80"}[u.Scheme == "https"])
	}
	conn, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, 0, err
	}
	fail := func(err error) (net.Conn, *bufio.Reader, int, error) {
		conn.Close()
		return nil, nil, 0, err
	}
	if u.Scheme == "https" {
		cfg := &tls.Config{}
		if c.TLS != nil {
			cfg = c.TLS.Clone()
		}
		if cfg.ServerName == "" {
			cfg.ServerName = u.Hostname()
		}
		cfg.NextProtos = []string{"http/1.1"} // the upgrade is HTTP/1.1's
		tc := tls.Client(conn, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			return fail(err)
		}
		conn = tc
	}
	window := clampWindow(c.SharedWindow)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	_, err = io.WriteString(conn, "GET "+Path+" HTTP/1.1\r\nHost: "+u.Host+"\r\nConnection: Upgrade\r\nUpgrade: "+Protocol+"\r\n"+
		WindowHeader+": "+strconv.Itoa(window)+"\r\n\r\n")
	br := bufio.NewReaderSize(conn, maxData+headerLen)
	var resp *http.Response
	if err == nil {
		resp, err = http.ReadResponse(br, nil)
	}
	if !stop() {
		err = fmt.Errorf("watchsession: no session within %s", timeout)
	}
	if err != nil {
		return fail(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSwitchingProtocols {
		// 503: a replica stopping, tried again with the next watch.
		return fail(fmt.Errorf("watchsession: session refused (%s)", resp.Status))
	}
	v := resp.Header.Get(WindowHeader)
	answered, err := parseWindow(v)
	switch {
	case v == "":
		err = errors.New("the server did not answer the shared window")
	case err == nil && answered > window:
		err = fmt.Errorf("the server keeps a shared window of %d bytes, more than the %d asked for", answered, window)
	}
	if err != nil {
		return fail(fmt.Errorf("watchsession: %w", err))
	}
	conn.SetDeadline(time.Time{})
	return conn, br, answered, nil
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
		s.conn.Close()
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
		if len(srv.sessions) == 0 && srv.opening == nil {
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
	c    *Client
	key  string
	conn net.Conn

	mu      sync.Mutex
	ctl     []byte        // frames to send
	ctlWake chan struct{} // (cap 1) ctl has frames, or the session ended
	streams map[uint32]*clientStream
	next    uint32
	err     error       // the session ended
	idle    *time.Timer // closes the session once it has had no streams for sessionIdle

	// The reader's only: shared, the shared bytes the server sent that
	// it may still refer to; refs, the bytes a refs frame refers to.
	shared *sharedBytes
	refs   [][]byte
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
		s.conn.Close()
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
	s.wakeCtl()
}

func (s *clientSession) wakeCtl() {
	select {
	case s.ctlWake <- struct{}{}:
	default:
	}
}

// writeCtl writes the frames queued, all of them at once, until the
// session ends.
func (s *clientSession) writeCtl() {
	var buf []byte
	for {
		<-s.ctlWake
		s.mu.Lock()
		if s.err != nil {
			s.mu.Unlock()
			return
		}
		buf, s.ctl = s.ctl, buf[:0]
		s.mu.Unlock()
		if len(buf) == 0 {
			continue
		}
		if _, err := s.conn.Write(buf); err != nil {
			s.conn.Close() // the reader ends the session
			return
		}
		if cap(buf) > 64<<10 {
			buf = nil
		}
	}
}

// watch opens a stream whose open frame's payload is open and waits for
// its response's head.
func (s *clientSession) watch(ctx context.Context, open []byte) (*http.Response, error) {
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
	s.ctl = appendFrame(s.ctl, frameOpen, st.id, open)
	s.mu.Unlock()
	s.wakeCtl()
	for {
		st.mu.Lock()
		resp, err := st.resp, st.err
		st.mu.Unlock()
		if resp != nil {
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
func (s *clientSession) read(br *bufio.Reader) {
	err := readFrames(br, fromServer, s.frame)
	s.shared.release()
	if errors.Is(err, errProtocol) {
		s.c.logger().Warn("watchsession: session ended", "server", s.key, "err", err)
	}
	if err == nil || errors.Is(err, io.EOF) || !errors.Is(err, errProtocol) {
		err = errSessionEnded
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
	s.conn.Close()
	s.wakeCtl() // writeCtl returns
}

// fromServer: the frames fanout sends.
func fromServer(t frameType) bool {
	switch t {
	case frameHead, frameData, frameEnd, frameShared, frameRefs, frameForget, frameTrace:
		return true
	}
	return false
}

func (s *clientSession) stream(id uint32) *clientStream {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.streams[id]
}

// frame handles one of the server's frames.
func (s *clientSession) frame(t frameType, id uint32, p []byte) error {
	switch t {
	case frameHead:
		st := s.stream(id)
		if st == nil {
			return nil // closed before its head came
		}
		h := &heraldv1.WatchStreamHead{}
		if err := proto.Unmarshal(p, h); err != nil || h.Code < 200 || h.Code > 999 {
			return fmt.Errorf("%w: stream %d's head: %v", errProtocol, id, err)
		}
		resp := &http.Response{StatusCode: int(h.Code), Status: strconv.Itoa(int(h.Code)) + " " + http.StatusText(int(h.Code)),
			Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: make(http.Header, len(h.Headers)), Body: st, ContentLength: -1}
		for _, hd := range h.Headers {
			resp.Header[hd.Name] = hd.Values
		}
		st.mu.Lock()
		st.resp = resp
		st.mu.Unlock()
		st.signal()
	case frameData:
		st := s.stream(id)
		if st == nil || len(p) == 0 {
			return nil
		}
		b := getBuf(len(p))
		copy(b, p)
		if !st.push(b) {
			return fmt.Errorf("%w: stream %d sent past its window", errProtocol, id)
		}
	case frameShared:
		if id != s.shared.next() {
			return fmt.Errorf("%w: shared bytes %d unexpected", errProtocol, id)
		}
		s.shared.add(append([]byte(nil), p...), nil)
	case frameForget:
		if !s.shared.forgetThrough(id, nil) {
			return fmt.Errorf("%w: forget through shared bytes %d unexpected", errProtocol, id)
		}
	case frameRefs:
		if len(p)%4 != 0 {
			return fmt.Errorf("%w: refs of %d bytes", errProtocol, len(p))
		}
		s.refs = s.refs[:0]
		for i := 0; i < len(p); i += 4 {
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
	case frameTrace:
		if st := s.stream(id); st != nil {
			st.pushTrace(string(p))
		}
	case frameEnd:
		s.mu.Lock()
		st := s.streams[id]
		if st != nil {
			s.removeLocked(id)
		}
		s.mu.Unlock()
		if st != nil {
			end := io.EOF
			if len(p) > 0 {
				end = fmt.Errorf("watchsession: stream ended: %s", p)
			}
			st.end(end)
		}
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
	onTrace  func(traceparent string) // SetTraceHook
}

// SetTraceHook has f called with the trace context of each traced event
// the server sends (Segment.Trace), by the read that reaches the event's
// bytes, before it returns them.
func (st *clientStream) SetTraceHook(f func(traceparent string)) {
	st.mu.Lock()
	st.onTrace = f
	st.mu.Unlock()
}

// pushTrace adds the trace context of the event whose bytes follow.
func (st *clientStream) pushTrace(tp string) {
	st.mu.Lock()
	if !st.closed && st.err == nil {
		st.bufs = append(st.bufs, chunk{b: []byte(tp), kind: chunkTrace})
	}
	st.mu.Unlock()
}

func (st *clientStream) signal() {
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

// chunk is what the server sent: shared bytes, which are never modified,
// a pooled buffer (getBuf) of a data frame, or the trace context of the
// event whose bytes follow (no bytes of the body).
type chunk struct {
	b    []byte
	kind chunkKind
}

type chunkKind uint8

const (
	chunkShared chunkKind = iota
	chunkPooled
	chunkTrace
)

func (c chunk) release() {
	if c.kind == chunkPooled {
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
	st.bufs = append(st.bufs, chunk{b: b, kind: chunkPooled})
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
			var traces []string
			for n < len(p) && len(st.bufs) > 0 {
				if st.bufs[0].kind == chunkTrace {
					if st.onTrace != nil {
						traces = append(traces, string(st.bufs[0].b))
					}
					st.bufs[0] = chunk{}
					st.bufs = st.bufs[1:]
					continue
				}
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
			hook := st.onTrace
			st.mu.Unlock()
			for _, tp := range traces {
				hook(tp)
			}
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
