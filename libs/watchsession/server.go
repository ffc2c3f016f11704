package watchsession

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"google.golang.org/protobuf/proto"

	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// maxPending bounds what a session holds for its writer: a stream's write
// waits while it is over (frontdoor reads the session slower than its
// streams write).
const maxPending = 4 << 20

// WatchHandler serves a stream's watch: req is the watch as frontdoor
// parsed it; ctx ends when frontdoor cancels the stream or the session
// ends. w is the stream's: a SegmentWriter, with a write deadline
// (http.ResponseController's SetWriteDeadline).
type WatchHandler interface {
	ServeWatch(ctx context.Context, w http.ResponseWriter, req *heraldv1.WatchStreamRequest)
}

// Server serves sessions at Path: each stream's watch goes to Handler.
// Every other request goes to Fallback (nil: 404).
type Server struct {
	Handler  WatchHandler
	Fallback http.Handler
	Log      *slog.Logger
	// SharedIdle is how long a session keeps its oldest shared bytes
	// while no stream refers to them (0: DefaultSharedIdle). Expiry runs
	// every half of it, so they go after between SharedIdle and one and a
	// half times that unused.
	SharedIdle time.Duration

	mu       sync.Mutex
	sessions map[*session]struct{}
	closing  bool
	served   sync.WaitGroup // the sessions' ServeHTTP

	sharedKept atomic.Int64 // SharedBytes
}

// SharedBytes is the size of the shared bytes the server's sessions keep
// (each up to its window; frontdoor keeps as many).
func (s *Server) SharedBytes() int64 { return s.sharedKept.Load() }

// Shutdown ends every session once its streams have ended (a fanout
// replica ends its watches when it stops); a stream opened after it ends at
// once without a head, and a session asked for gets 503. Register it with
// http.Server.RegisterOnShutdown: a session's connection is its own (taken
// over from net/http), which the server's Shutdown does not wait for: Wait
// does.
func (s *Server) Shutdown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closing = true
	for ss := range s.sessions {
		ss.signal()
	}
}

// Wait waits until every session has ended, at most d; false if some had
// not.
func (s *Server) Wait(d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		s.served.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// errServerClosed ends the sessions of a closed server.
var errServerClosed = errors.New("watchsession: server closed")

// Close ends every session now, and their streams' contexts; a session
// asked for afterwards gets 503.
func (s *Server) Close() {
	s.mu.Lock()
	s.closing = true
	sessions := make([]*session, 0, len(s.sessions))
	for ss := range s.sessions {
		sessions = append(sessions, ss)
	}
	s.mu.Unlock()
	for _, ss := range sessions {
		ss.fail(errServerClosed)
	}
}

// ServeHTTP serves a request at Path as one session: it takes the
// connection over (the request upgrades it to Protocol), reads frontdoor's
// frames from it and writes the streams' frames to it, until frontdoor
// ends the session (and its streams have ended), a write fails, or the
// server shuts down and its streams have ended.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != Path {
		if s.Fallback == nil {
			http.NotFound(w, r)
			return
		}
		s.Fallback.ServeHTTP(w, r)
		return
	}
	if r.Method != http.MethodGet || r.ProtoMajor != 1 || !hasToken(r.Header["Connection"], "Upgrade") ||
		!hasToken(r.Header["Upgrade"], Protocol) {
		w.Header().Set("Upgrade", Protocol)
		http.Error(w, "watchsession: a session is an HTTP/1.1 GET upgrading to "+Protocol, http.StatusUpgradeRequired)
		return
	}
	asked := r.Header.Get(WindowHeader)
	if n, err := strconv.Atoi(asked); err == nil && n > MaxSharedWindow {
		asked = strconv.Itoa(MaxSharedWindow) // a frontdoor whose bound is larger keeps less
	}
	window, err := parseWindow(asked)
	if err != nil {
		s.logger().Warn("watchsession: session refused", "remote", r.RemoteAddr, "err", err)
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		http.Error(w, "watchsession: shutting down", http.StatusServiceUnavailable)
		return
	}
	s.served.Add(1)
	defer s.served.Done()
	s.mu.Unlock()
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		http.Error(w, "watchsession: "+err.Error(), http.StatusInternalServerError)
		return
	}
	defer conn.Close()
	// Deadlines net/http set for the request's head are not the session's.
	conn.SetDeadline(time.Time{})
	brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + Protocol + "\r\n" +
		WindowHeader + ": " + strconv.Itoa(window) + "\r\n\r\n")
	if brw.Flush() != nil {
		return
	}
	// The request's context ends when the server stops (fanout's watches
	// end then), not when the connection does: the reader sees that.
	ctx, cancel := context.WithCancel(r.Context())
	ss := &session{srv: s, num: sessions.Add(1), ctx: ctx, cancel: cancel, remote: r.RemoteAddr,
		wake: make(chan struct{}, 1), drained: make(chan struct{}), streams: map[uint32]*stream{},
		shared: map[*byte]sharedNum{}, sent: sharedBytes{window: window, total: &s.sharedKept}}
	s.mu.Lock()
	if s.sessions == nil {
		s.sessions = map[*session]struct{}{}
	}
	s.sessions[ss] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.sessions, ss)
		s.mu.Unlock()
	}()
	go ss.read(brw.Reader)
	go ss.expire()
	ss.write(conn)
	cancel()
	ss.mu.Lock()
	ss.finished = true // no stream starts now
	ss.mu.Unlock()
	ss.handlers.Wait()
	ss.mu.Lock()
	ss.sent.release()
	ss.mu.Unlock()
}

// session is one session's state on the server.
type session struct {
	srv      *Server
	num      uint64          // SegmentWriter.Session
	ctx      context.Context // the streams' parent
	cancel   context.CancelFunc
	remote   string
	handlers sync.WaitGroup

	mu       sync.Mutex
	out      []byte        // frames for the writer
	spare    []byte        // the writer's last buffer, for out to reuse
	wake     chan struct{} // (cap 1) the writer has something to do
	drained  chan struct{} // closed when the writer takes out (then replaced)
	streams  map[uint32]*stream
	lastID   uint32 // the last stream opened (the reader's)
	readEnd  bool   // frontdoor ended the session: no more streams
	err      error  // a write failed: nothing more is sent
	finished bool   // the session's handler is returning

	// shared: the numbers of the shared bytes frontdoor keeps (sent), by
	// their first byte. A pointer names the bytes: sent keeps them alive (so no other slice
	// gets their address), Go does not move heap memory, and shared
	// bytes never change; the length tells a prefix from the whole.
	shared map[*byte]sharedNum
	sent   sharedBytes
	// used and usedBefore are the oldest shared bytes a stream referred
	// to (or that were sent) since the last expiry and in the period
	// before it.
	used, usedBefore sharedUse
}

// sharedUse is the oldest number of shared bytes used in a period, if any.
type sharedUse struct {
	num uint32
	ok  bool
}

// usedLocked notes that shared bytes num were sent or referred to.
func (ss *session) usedLocked(num uint32) {
	if ss.used.ok {
		// Positions in what is kept; one the window forgot since counts
		// as the oldest (expireLocked).
		cur := ss.used.num - ss.sent.forgot - 1
		if cur >= uint32(len(ss.sent.blobs)) || cur <= num-ss.sent.forgot-1 {
			return
		}
	}
	ss.used = sharedUse{num: num, ok: true}
}

// expireLocked forgets the oldest shared bytes that no stream used in the
// last two periods (all of them, if none was used), at both ends: a
// forget frame tells frontdoor. Called once a period (half of
// Server.SharedIdle), so bytes go after between two and three periods
// unused. The window still bounds what is kept between expiries. It
// reports whether it queued a forget frame.
func (ss *session) expireLocked() bool {
	kept := uint32(len(ss.sent.blobs))
	keep := kept // the position of the oldest used in the two periods
	for _, u := range []sharedUse{ss.used, ss.usedBefore} {
		if !u.ok {
			continue
		}
		pos := u.num - ss.sent.forgot - 1
		if pos >= kept {
			// The window forgot it since: what followed it may be in use.
			pos = 0
		}
		keep = min(keep, pos)
	}
	ss.usedBefore, ss.used = ss.used, sharedUse{}
	if keep == 0 || ss.err != nil {
		return false
	}
	through := ss.sent.forgot + keep
	ss.sent.forgetThrough(through, ss.forgetLocked)
	if len(ss.sent.blobs) == 0 {
		// A map keeps the room it grew to after its entries are deleted,
		// and a burst of small events can fill the window's count bound
		// (window/windowPerShared entries: 65,536 in a 16 MiB window): an
		// idle session keeps none of it.
		ss.shared = map[*byte]sharedNum{}
	}
	ss.out = appendFrame(ss.out, frameForget, through, nil)
	return true
}

// expire runs expireLocked once a period (half of Server.SharedIdle) until
// the session ends, off the writer's loop, and wakes the writer when it
// has a forget frame to send.
func (ss *session) expire() {
	idle := ss.srv.SharedIdle
	if idle <= 0 {
		idle = DefaultSharedIdle
	}
	t := time.NewTicker(max(idle/2, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-ss.ctx.Done():
			return
		}
		ss.mu.Lock()
		queued := ss.expireLocked()
		ss.mu.Unlock()
		if queued {
			ss.signal()
		}
	}
}

// forgetLocked drops forgotten shared bytes from the numbers frontdoor
// keeps.
func (ss *session) forgetLocked(gone uint32, g []byte) {
	if k := unsafe.SliceData(g); ss.shared[k].num == gone {
		delete(ss.shared, k)
	}
}

// sharedNum is the number of shared bytes of length n.
type sharedNum struct {
	num uint32
	n   int
}

// shareableLocked reports whether sg goes by reference.
func (ss *session) shareableLocked(sg Segment) bool {
	return sg.Shared && len(sg.B) >= minShared && len(sg.B) <= maxData
}

// sharedLocked returns the number of b's bytes, sending them first (a
// shared frame) if frontdoor does not keep them.
func (ss *session) sharedLocked(b []byte) uint32 {
	key := unsafe.SliceData(b)
	if e, ok := ss.shared[key]; ok && e.n == len(b) {
		ss.usedLocked(e.num)
		return e.num
	}
	num := ss.sent.next()
	ss.out = appendFrame(ss.out, frameShared, num, b)
	ss.sent.add(b, ss.forgetLocked)
	ss.shared[key] = sharedNum{num: num, n: len(b)}
	ss.usedLocked(num)
	return num
}

// appendSegmentsLocked appends stream id's segments to the frames to send:
// a run of shareable ones as a refs frame, the rest as data frames.
func (ss *session) appendSegmentsLocked(id uint32, segs []Segment) {
	refs, data := -1, -1 // the refs or data frame being filled: its offset in out
	for _, sg := range segs {
		if sg.Trace != "" {
			refs, data = -1, -1
			if len(sg.Trace) <= maxTrace {
				ss.out = appendFrame(ss.out, frameTrace, id, []byte(sg.Trace))
			}
			continue
		}
		if len(sg.B) == 0 {
			continue
		}
		if ss.shareableLocked(sg) {
			data = -1
			before := len(ss.out)
			num := ss.sharedLocked(sg.B)
			if len(ss.out) != before {
				refs = -1 // refers to what frontdoor kept before the shared frame: ended
			}
			if refs < 0 || frameLen(ss.out, refs) >= 4*maxRefs {
				refs = len(ss.out)
				ss.out = appendFrame(ss.out, frameRefs, id, nil)
			}
			ss.out = binary.BigEndian.AppendUint32(ss.out, num)
			growFrame(ss.out, refs, 4)
			continue
		}
		refs = -1
		for b := sg.B; len(b) > 0; {
			if data < 0 || frameLen(ss.out, data) >= maxData {
				data = len(ss.out)
				ss.out = appendFrame(ss.out, frameData, id, nil)
			}
			n := min(len(b), maxData-frameLen(ss.out, data))
			ss.out = append(ss.out, b[:n]...)
			growFrame(ss.out, data, n)
			b = b[n:]
		}
	}
}

func (ss *session) signal() {
	select {
	case ss.wake <- struct{}{}:
	default:
	}
}

// write is the session's writer: it writes what the streams have appended,
// all of it at once, until the session is done.
func (ss *session) write(conn io.Writer) {
	for {
		ss.mu.Lock()
		for len(ss.out) == 0 && !ss.doneLocked() {
			ss.mu.Unlock()
			select {
			case <-ss.wake:
			case <-ss.ctx.Done():
				// The server stopped, or the session failed.
				ss.fail(ss.ctx.Err())
				return
			}
			ss.mu.Lock()
		}
		if len(ss.out) == 0 {
			ss.mu.Unlock()
			return
		}
		buf := ss.out
		ss.out, ss.spare = ss.spare[:0], nil
		close(ss.drained)
		ss.drained = make(chan struct{})
		ss.mu.Unlock()
		if _, err := conn.Write(buf); err != nil {
			ss.fail(err)
			return
		}
		ss.mu.Lock()
		if cap(buf) <= 2*maxPending {
			ss.spare = buf[:0]
		}
		ss.mu.Unlock()
	}
}

// doneLocked: the session has nothing more to send (its streams have ended
// and none can start), or can send nothing.
func (ss *session) doneLocked() bool {
	if ss.err != nil {
		return true
	}
	if len(ss.streams) > 0 {
		return false
	}
	if ss.readEnd {
		return true
	}
	ss.srv.mu.Lock()
	defer ss.srv.mu.Unlock()
	return ss.srv.closing
}

// fail ends the session: nothing more is written, and every stream's
// context ends.
func (ss *session) fail(err error) {
	ss.mu.Lock()
	if ss.err == nil {
		ss.err = err
		close(ss.drained)
		ss.drained = make(chan struct{})
	}
	ss.mu.Unlock()
	ss.cancel()
}

// read reads frontdoor's frames until the connection ends.
func (ss *session) read(r *bufio.Reader) {
	err := readFrames(r, fromClient, ss.frame)
	if err != nil && !errors.Is(err, io.EOF) && ss.ctx.Err() == nil {
		ss.srv.logger().Warn("watchsession: session ended", "remote", ss.remote, "err", err)
	}
	ss.mu.Lock()
	ss.readEnd = true
	streams := make([]*stream, 0, len(ss.streams))
	for _, st := range ss.streams {
		streams = append(streams, st)
	}
	ss.mu.Unlock()
	// Frontdoor is gone (or ended the session): so are its clients.
	for _, st := range streams {
		st.cancel()
	}
	if errors.Is(err, errProtocol) {
		ss.fail(err)
	}
	ss.signal()
}

// fromClient: the frames frontdoor sends.
func fromClient(t frameType) bool { return t == frameOpen || t == frameCredit || t == frameCancel }

// frame handles one of frontdoor's frames.
func (ss *session) frame(t frameType, id uint32, p []byte) error {
	switch t {
	case frameOpen:
		return ss.open(id, p)
	case frameCredit:
		if len(p) != 4 {
			return fmt.Errorf("%w: credit of %d bytes", errProtocol, len(p))
		}
		ss.credit(id, int64(binary.BigEndian.Uint32(p)))
	case frameCancel:
		ss.mu.Lock()
		st := ss.streams[id]
		ss.mu.Unlock()
		if st != nil {
			st.cancel()
		}
	}
	return nil
}

// open starts stream id's watch on the server's handler.
func (ss *session) open(id uint32, payload []byte) error {
	req := &heraldv1.WatchStreamRequest{}
	if err := proto.Unmarshal(payload, req); err != nil {
		return fmt.Errorf("%w: stream %d: %v", errProtocol, id, err)
	}
	if id <= ss.lastID {
		return fmt.Errorf("%w: stream %d opened after %d", errProtocol, id, ss.lastID)
	}
	ss.lastID = id
	ss.srv.mu.Lock()
	closing := ss.srv.closing
	ss.srv.mu.Unlock()
	ctx, cancel := context.WithCancel(ss.ctx)
	st := &stream{ss: ss, id: id, cancel: cancel, ctx: ctx, credit: window,
		header: http.Header{}, creditAdded: make(chan struct{}, 1), deadlineSet: make(chan struct{}, 1)}
	ss.mu.Lock()
	if len(ss.streams) >= maxSessionStreams {
		ss.mu.Unlock()
		cancel()
		return fmt.Errorf("%w: more than %d streams", errProtocol, maxSessionStreams)
	}
	if closing && !ss.finished && ss.err == nil {
		// Shutting down: the request fails at once (no head), and the
		// client retries it on another replica.
		ss.mu.Unlock()
		st.end("watchsession: the server is shutting down")
		return nil
	}
	if ss.finished || ss.err != nil {
		// The session is ending: the client's reader sees its end and
		// fails the stream, which is retried elsewhere.
		ss.mu.Unlock()
		cancel()
		return nil
	}
	ss.streams[id] = st
	ss.handlers.Add(1)
	ss.mu.Unlock()
	go st.serve(req)
	return nil
}

// credit adds n to stream id's credit.
func (ss *session) credit(id uint32, n int64) {
	ss.mu.Lock()
	st := ss.streams[id]
	if st != nil {
		st.credit = min(st.credit+n, window)
	}
	ss.mu.Unlock()
	if st != nil {
		select {
		case st.creditAdded <- struct{}{}:
		default:
		}
	}
}

func (s *Server) logger() *slog.Logger {
	if s.Log != nil {
		return s.Log
	}
	return slog.Default()
}

// stream is one watch's http.ResponseWriter: its head and body go to the
// session as frames.
type stream struct {
	ss     *session
	id     uint32
	ctx    context.Context
	cancel context.CancelFunc
	header http.Header

	wroteHeader bool // the handler's goroutine's

	credit      int64         // under ss.mu
	creditAdded chan struct{} // (cap 1) credit was added

	deadline    atomic.Int64  // of writes, in Unix nanoseconds (0: none)
	deadlineSet chan struct{} // (cap 1) the deadline changed
}

// serve runs the handler, then ends the stream.
func (st *stream) serve(req *heraldv1.WatchStreamRequest) {
	ss := st.ss
	defer ss.handlers.Done()
	var end string
	func() {
		defer func() {
			if v := recover(); v != nil {
				if v != http.ErrAbortHandler {
					ss.srv.logger().Error("watchsession: handler panicked", "stream", st.id, "panic", v)
				}
				end = fmt.Sprint(v)
			}
		}()
		ss.srv.Handler.ServeWatch(st.ctx, st, req)
	}()
	// A handler that aborted before its head sends none: the client's
	// request fails (and is retried elsewhere), as when net/http resets the
	// stream.
	if !st.wroteHeader && end == "" {
		st.WriteHeader(http.StatusOK)
	}
	if end == "" && st.ctx.Err() != nil {
		end = st.ctx.Err().Error()
	}
	st.end(end)
}

// end sends the stream's end (why it failed; empty: the body's end) and
// forgets it.
func (st *stream) end(why string) {
	ss := st.ss
	if len(why) > maxEnd {
		why = why[:maxEnd]
	}
	ss.mu.Lock()
	delete(ss.streams, st.id)
	if ss.err == nil {
		ss.out = appendFrame(ss.out, frameEnd, st.id, []byte(why))
	}
	ss.mu.Unlock()
	ss.signal()
	st.cancel()
}

func (st *stream) Header() http.Header { return st.header }

func (st *stream) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code)) // as net/http
	}
	if st.wroteHeader || code < 200 {
		return // informational heads are not sent
	}
	st.wroteHeader = true
	h := &heraldv1.WatchStreamHead{Code: int32(code), Headers: make([]*heraldv1.WatchStreamHead_Header, 0, len(st.header))}
	for name, values := range st.header {
		h.Headers = append(h.Headers, &heraldv1.WatchStreamHead_Header{Name: name, Values: values})
	}
	head, err := proto.Marshal(h)
	ss := st.ss
	if err != nil || len(head) > maxHead {
		// The client would end the session: this stream fails alone.
		ss.srv.logger().Error("watchsession: response head too large", "stream", st.id, "bytes", len(head), "err", err)
		st.cancel()
		return
	}
	ss.mu.Lock()
	if ss.err == nil {
		ss.out = appendFrame(ss.out, frameHead, st.id, head)
	}
	ss.mu.Unlock()
	ss.signal()
}

// Write sends p as data frames, as the stream's credit and the session's
// bound allow: it waits for them until its context or its write deadline
// ends.
func (st *stream) Write(p []byte) (int, error) {
	if !st.wroteHeader {
		st.WriteHeader(http.StatusOK)
	}
	ss := st.ss
	written := 0
	for len(p) > 0 {
		ss.mu.Lock()
		if err := st.failedLocked(); err != nil {
			ss.mu.Unlock()
			return written, err
		}
		if st.credit > 0 && len(ss.out) < maxPending {
			n := int(min(int64(len(p)), st.credit, maxData))
			ss.out = appendFrame(ss.out, frameData, st.id, p[:n])
			st.credit -= int64(n)
			ss.mu.Unlock()
			ss.signal()
			p, written = p[n:], written+n
			continue
		}
		wait := ss.drained
		if st.credit <= 0 {
			wait = st.creditAdded
		}
		ss.mu.Unlock()
		if err := st.await(wait); err != nil {
			return written, err
		}
	}
	return written, nil
}

// Segment is part of a stream's write (SegmentWriter).
type Segment struct {
	B []byte
	// Shared: B is never modified, and other streams of the session may
	// write the same B (a watch event's encoding, made once for every
	// watch): the session may send its bytes once and refer to them.
	Shared bool
	// Trace, if not empty (and B empty), is the trace context (a W3C
	// traceparent) of the event whose bytes follow: it goes as a trace
	// frame, which the client's body hands to its trace hook
	// (SetTraceHook) when a read reaches those bytes.
	Trace string
}

// SegmentWriter is a session stream's http.ResponseWriter: fanout writes a
// watch's batch of events as segments, so that a session sends each
// event's encoding once, however many of its streams write it.
type SegmentWriter interface {
	// WriteSegments writes the segments' bytes, in order, as one Write of
	// them all would, in one hand-off to the session's writer when the
	// stream's credit allows.
	WriteSegments(segs []Segment) (int, error)
	// TryWriteSegments writes the segments as WriteSegments does if the
	// stream's credit and the session's bound allow it now, and otherwise
	// writes nothing and reports false: it never waits, so that one
	// goroutine can write many streams of a session without one slow
	// client holding up the others. Segments of more bytes than a stream
	// sends whole (wholeMax: within its credit window, less what the
	// client may leave uncredited) are always refused (WriteSegments
	// writes them in pieces).
	TryWriteSegments(segs []Segment) (bool, error)
	// Session is the number of the stream's session: the streams of one
	// session share it, and no two sessions of a process have the same.
	Session() uint64
}

var _ SegmentWriter = (*stream)(nil)

// sessions numbers the sessions of the process (SegmentWriter.Session).
var sessions atomic.Uint64

func (st *stream) Session() uint64 { return st.ss.num }

func (st *stream) WriteSegments(segs []Segment) (int, error) {
	total := st.segmentsLen(segs)
	// Only a write that the credit is sure to fit waits for it whole
	// (wholeMax): one closer to the window could wait for credit that a
	// client which has read everything never sends.
	for total <= wholeMax {
		ok, wait, err := st.appendSegments(segs, total)
		if err != nil {
			return 0, err
		}
		if ok {
			return total, nil
		}
		// Waits as Write does, and sends the segments at once (a
		// congested session is when sending shared bytes once matters
		// most).
		if err := st.await(wait); err != nil {
			return 0, err
		}
	}
	// More than a stream sends whole: Write sends it in pieces.
	written := 0
	for _, sg := range segs {
		n, err := st.Write(sg.B)
		written += n
		if err != nil {
			return written, err
		}
	}
	return written, nil
}

func (st *stream) TryWriteSegments(segs []Segment) (bool, error) {
	total := st.segmentsLen(segs)
	if total > wholeMax {
		return false, nil // only WriteSegments writes it, in pieces
	}
	ok, _, err := st.appendSegments(segs, total)
	return ok, err
}

// segmentsLen is the length of segs' bytes; it sends the stream's head
// first if the handler has not.
func (st *stream) segmentsLen(segs []Segment) int {
	if !st.wroteHeader {
		st.WriteHeader(http.StatusOK)
	}
	total := 0
	for _, sg := range segs {
		total += len(sg.B)
	}
	return total
}

// appendSegments hands segs (total bytes) to the session's writer if the
// stream's credit and the session's bound allow it; otherwise it returns
// what to wait for before trying again.
func (st *stream) appendSegments(segs []Segment, total int) (ok bool, wait <-chan struct{}, err error) {
	ss := st.ss
	ss.mu.Lock()
	if err := st.failedLocked(); err != nil {
		ss.mu.Unlock()
		return false, nil, err
	}
	if st.credit >= int64(total) && len(ss.out) < maxPending {
		ss.appendSegmentsLocked(st.id, segs)
		st.credit -= int64(total)
		ss.mu.Unlock()
		ss.signal()
		return true, nil, nil
	}
	wait = ss.drained
	if st.credit < int64(total) {
		wait = st.creditAdded
	}
	ss.mu.Unlock()
	return false, wait, nil
}

// failedLocked is why the stream cannot be written to now: the session
// failed, the stream's context ended, or its write deadline passed (as on
// a connection, a write fails then whether it would wait or not).
func (st *stream) failedLocked() error {
	if st.ss.err != nil {
		return st.ss.err
	}
	if err := st.ctx.Err(); err != nil {
		return err
	}
	if st.expired() {
		return os.ErrDeadlineExceeded
	}
	return nil
}

// await waits for ch, the end of the stream's context or its write
// deadline.
func (st *stream) await(ch <-chan struct{}) error {
	for {
		var (
			expired <-chan time.Time
			t       *time.Timer
		)
		if dl := st.deadline.Load(); dl != 0 {
			d := time.Until(time.Unix(0, dl))
			if d <= 0 {
				return os.ErrDeadlineExceeded
			}
			t = time.NewTimer(d)
			expired = t.C
		}
		var err error
		again := false
		select {
		case <-ch:
		case <-st.ctx.Done():
			err = st.ctx.Err()
		case <-expired:
			err = os.ErrDeadlineExceeded
		case <-st.deadlineSet:
			again = true
		}
		if t != nil {
			t.Stop()
		}
		if !again {
			return err
		}
	}
}

// expired reports whether the write deadline has passed.
func (st *stream) expired() bool {
	dl := st.deadline.Load()
	return dl != 0 && time.Now().UnixNano() >= dl
}

// FlushError reports whether what was written can still be sent: the
// session's writer sends it without being asked.
func (st *stream) FlushError() error {
	if !st.wroteHeader {
		st.WriteHeader(http.StatusOK)
	}
	st.ss.mu.Lock()
	defer st.ss.mu.Unlock()
	if st.ss.err != nil {
		return st.ss.err
	}
	return st.ctx.Err()
}

func (st *stream) Flush() { st.FlushError() }

// SetWriteDeadline bounds the writes waiting now and later (zero: no
// bound), as on a connection.
func (st *stream) SetWriteDeadline(t time.Time) error {
	var dl int64
	if !t.IsZero() {
		dl = t.UnixNano()
	}
	st.deadline.Store(dl)
	select {
	case st.deadlineSet <- struct{}{}:
	default:
	}
	return nil
}

// hasToken reports whether a header's values list token (case-insensitive).
func hasToken(values []string, token string) bool {
	for _, v := range values {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}
