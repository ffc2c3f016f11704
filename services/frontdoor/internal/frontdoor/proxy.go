package frontdoor

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"herald.dev/libs/kube"
	"herald.dev/libs/kube/request"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/rv"
	"herald.dev/libs/service"
	"herald.dev/libs/storage"
	"herald.dev/libs/watchsession"
	"herald.dev/services/frontdoor/internal/apierr"
)

// fanoutPool routes watches to fanout replicas: the least loaded one that
// is not marked down (ties broken round-robin). A replica that refuses the
// connection, times out or answers 503 before the response starts is
// marked down for a while and the watch is retried on the next one; nothing
// has reached the client yet, and a watch request has no body, so the retry
// is invisible to it. Once the response has started, a replica's failure
// ends the client's stream; the client resumes from its last
// resourceVersion on any replica (they keep no per-client state).
//
// The pool also keeps its watches balanced over the replicas it knows: a
// replica added under load would otherwise get only new watches, while the
// existing ones stay where they are until they time out (up to an hour).
// Every rebalance interval, a replica holding more than its fair share of
// this frontdoor's watches (ceil(watches/replicas up), plus a tenth for
// slack) has its excess ended cleanly, at most rebalance-max-share of the
// watches per interval (at least one): the stream ends after a whole event,
// as at a server-side timeout, and the client resumes from its
// resourceVersion, routed to the least loaded replica. Each frontdoor
// balances its own watches, so together they balance all of them; the rule
// is deterministic (kube-apiserver's --goaway-chance is random) so that a
// scale-out is relieved within a few intervals, never by luck.
//
// Invariant: a backend's open count is exactly the number of watches being
// proxied to it, whatever way the proxying ends (an error, the client
// leaving, the reverse proxy's abort panic).
type fanoutPool struct {
	log *slog.Logger
	// backends are the replicas: one per configured URL whose host is an
	// address, one per address a configured name resolves to (refreshed by
	// resolve, so a scaled-out replica starts taking watches within a
	// refresh). newBackend builds one.
	mu         sync.RWMutex
	refreshMu  sync.Mutex
	backends   []*backend
	names      []*url.URL // configured URLs with a DNS name
	newBackend func(u *url.URL) *backend
	next       atomic.Uint64
	downFor    time.Duration
	retries    func(host string)
	tracer     trace.Tracer // nil: tracing off
	// kick (capacity 1) asks for a re-resolve now: a replica failed, and
	// the set of replicas may have changed.
	kick chan struct{}
	// rebalanceEvery (0: never) and rebalanceShare bound the shedding;
	// shed counts watches ended to rebalance, by replica.
	rebalanceEvery time.Duration
	rebalanceShare float64
	shed           func(host string)
	dialTimeout    time.Duration // of a probe
	// responseTimeout: a replica's time to start its response.
	responseTimeout time.Duration
	// transport carries every watch to the replicas; buffers are the
	// watches' copy buffers (see copyStream).
	transport watchTransport
	buffers   *copyBuffers
	// streams are the detached streams' connections and the cancels of
	// their upstream watches: the server's shutdown (shutdown, registered
	// with http.Server.RegisterOnShutdown) ends them (stopped), and cuts
	// the clients that do not read their stream's end within grace.
	grace     time.Duration
	streamsMu sync.Mutex
	streams   map[net.Conn]context.CancelFunc
	stopped   bool
	noStreams *sync.Cond // broadcast when streams empties (L: &streamsMu)
}

// waitDetached waits until every detached stream has ended (after
// shutdown, within about grace), at most timeout; false if some had not.
func (p *fanoutPool) waitDetached(timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	wake := time.AfterFunc(timeout, func() {
		p.streamsMu.Lock()
		p.noStreams.Broadcast()
		p.streamsMu.Unlock()
	})
	defer wake.Stop()
	p.streamsMu.Lock()
	defer p.streamsMu.Unlock()
	for len(p.streams) > 0 && time.Now().Before(deadline) {
		p.noStreams.Wait()
	}
	return len(p.streams) == 0
}

// shutdown ends every detached stream (see streams); the others end with
// their requests' contexts, which the server's shutdown cancels.
func (p *fanoutPool) shutdown() {
	p.streamsMu.Lock()
	defer p.streamsMu.Unlock()
	p.stopped = true
	for c, cancel := range p.streams {
		cancel()
		c.SetWriteDeadline(time.Now().Add(p.grace))
	}
}

// sessionStreams is the watches a session to a replica carries (see
// libs/watchsession): each session has one writer in fanout and one reader
// here.
const sessionStreams = 500

// watchTransport carries a watch to a replica (watchsession.Client).
type watchTransport interface {
	Watch(ctx context.Context, replica *url.URL, req *heraldv1.WatchStreamRequest) (*http.Response, error)
}

// copyBufferSize is the size of the buffer a watch borrows to copy what
// its replica has sent. The reverse proxy's 32 KB: under load a read carries
// a whole batch fanout wrote at once (copyStream borrows it only while data
// flows, so an idle watch holds none).
const copyBufferSize = 32 << 10

// copyBuffers pools the watches' copy buffers; lent counts those borrowed.
type copyBuffers struct {
	pool sync.Pool
	lent atomic.Int64
}

// Get lends a buffer; Put takes it back by the same pointer, so that
// lending allocates nothing.
func (c *copyBuffers) Get() *[]byte {
	c.lent.Add(1)
	if b, ok := c.pool.Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, copyBufferSize)
	return &b
}

func (c *copyBuffers) Put(b *[]byte) {
	c.lent.Add(-1)
	c.pool.Put(b)
}

// backend is one fanout replica.
type backend struct {
	url    *url.URL
	origin *url.URL // the configured URL it comes from
	open   atomic.Int64
	down   atomic.Int64 // unix nanos until which it is skipped
	// failing: its last attempt failed and neither an attempt nor a probe
	// (a TCP connection) has succeeded since. Rebalancing moves no watches
	// towards it (it may be gone for good).
	failing atomic.Bool

	mu       sync.Mutex
	watches  map[*shedBody]struct{} // streaming watches that can be shed
	shedding int                    // watches shed that have not ended yet
}

// probe clears failing if b accepts a connection now.
func (b *backend) probe(timeout time.Duration) {
	port := b.url.Port()
	if port == "" {
		port = "80"
		if b.url.Scheme == "https" {
			port = "443"
		}
	}
	c, err := net.DialTimeout("tcp", net.JoinHostPort(b.url.Hostname(), port), max(timeout, 100*time.Millisecond))
	if err == nil {
		c.Close()
		b.failing.Store(false)
	}
}

// streaming registers a watch whose response is streaming; the returned
// func unregisters it.
func (b *backend) streaming(body *shedBody) func() {
	b.mu.Lock()
	b.watches[body] = struct{}{} // made with the backend (newBackend)
	b.mu.Unlock()
	return func() {
		b.mu.Lock()
		if _, ok := b.watches[body]; ok {
			delete(b.watches, body)
		} else {
			b.shedding-- // shed: it has ended now
		}
		b.mu.Unlock()
	}
}

// shedUpTo ends up to n of b's streaming watches and returns how many.
func (b *backend) shedUpTo(n int) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	done := 0
	for body := range b.watches {
		if done == n {
			break
		}
		delete(b.watches, body)
		b.shedding++
		body.end()
		done++
	}
	return done
}

// load is b's open watches, less those shed and about to end.
func (b *backend) load() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open.Load() - int64(b.shedding)
}

// attempt is the outcome of proxying a watch to one replica.
type attempt struct {
	req  *heraldv1.WatchStreamRequest // the watch, as parsed
	last bool                         // no replica left to retry on: pass a 503 through
	err  error                        // the replica failed before the response started
	// cancel aborts the upstream request; done unregisters a streaming
	// watch (set once its response has started, if it can be shed).
	cancel context.CancelFunc
	done   func()
	// started runs when the replica's response starts: the watch is
	// initialized.
	started func()
	// end is the request's end, which a detached stream takes over.
	end *requestEnd
}

var errReplicaUnavailable = errors.New("replica answered 503")

func newFanoutPool(cfg Config, log *slog.Logger, m *metrics) (*fanoutPool, error) {
	p := &fanoutPool{log: log, downFor: cfg.FanoutRetryDown, kick: make(chan struct{}, 1), buffers: &copyBuffers{}, grace: cfg.ShutdownGracePeriod,
		responseTimeout: cfg.FanoutResponseTimeout,
		rebalanceEvery:  cfg.FanoutRebalance, rebalanceShare: cfg.FanoutRebalanceShare, dialTimeout: cfg.FanoutDialTimeout,
		retries: func(host string) { m.fanoutRetries.WithLabelValues(host).Inc() },
		shed:    func(host string) { m.fanoutShed.WithLabelValues(host).Inc() }}
	tlsCfg, err := cfg.FanoutTLS.Config(log, m.reloads)
	if err != nil {
		return nil, fmt.Errorf("fanout.tls: %w", err)
	}
	// Watches go as streams of sessions (libs/watchsession), up to
	// sessionStreams to a session, each session a connection of its own.
	sessions := &watchsession.Client{Dial: (&net.Dialer{Timeout: cfg.FanoutDialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLS: tlsCfg, MaxStreams: sessionStreams, OpenTimeout: cfg.FanoutResponseTimeout, SharedWindow: cfg.FanoutSharedWindow, Log: log}
	m.sessions.Store(sessions)
	p.transport = sessions
	p.streams = map[net.Conn]context.CancelFunc{}
	p.noStreams = sync.NewCond(&p.streamsMu)
	p.newBackend = func(u *url.URL) *backend { return &backend{url: u, watches: map[*shedBody]struct{}{}} }
	for _, a := range cfg.fanouts() {
		u, err := url.Parse(a)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			return nil, fmt.Errorf("fanout.addrs: bad URL %q", a)
		}
		if net.ParseIP(u.Hostname()) == nil {
			p.names = append(p.names, u)
			continue
		}
		b := p.newBackend(u)
		b.origin = u
		p.backends = append(p.backends, b)
	}
	if len(p.names) > 0 {
		p.refresh(context.Background())
	}
	return p, nil
}

// run keeps the replicas behind configured names current (every
// interval, and at once when one fails) and the watches balanced over
// them, until ctx ends.
func (p *fanoutPool) run(ctx context.Context, every time.Duration) {
	if p.rebalanceEvery > 0 {
		go service.Every(ctx, p.rebalanceEvery, p.rebalance)
	}
	if len(p.names) == 0 {
		return
	}
	go service.Every(ctx, every, func() { p.refresh(ctx) })
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
			p.refresh(ctx)
		}
	}
}

// rebalance ends the excess watches of the replicas holding more than their
// fair share of this frontdoor's watches (see fanoutPool), at most
// rebalanceShare of them (at least one). Replicas that are down or whose
// last attempt failed do not count: watches moved towards them would only
// come back.
func (p *fanoutPool) rebalance() {
	now := time.Now().UnixNano()
	p.mu.RLock()
	backends := p.backends
	p.mu.RUnlock()
	type load struct {
		b *backend
		n int64
	}
	var up []load
	var total int64
	for _, b := range backends {
		if b.failing.Load() && b.down.Load() <= now {
			b.probe(p.dialTimeout)
		}
		if b.down.Load() <= now && !b.failing.Load() {
			n := b.load()
			up = append(up, load{b, n})
			total += n
		}
	}
	if len(up) < 2 || total == 0 {
		return
	}
	fair := (total + int64(len(up)) - 1) / int64(len(up))
	limit := fair + fair/10
	budget := max(1, int64(math.Ceil(float64(total)*p.rebalanceShare)))
	slices.SortFunc(up, func(a, b load) int { return cmp.Compare(b.n, a.n) })
	for _, l := range up {
		if budget == 0 || l.n <= limit {
			return
		}
		n := int64(l.b.shedUpTo(int(min(l.n-fair, budget))))
		budget -= n
		if n > 0 {
			p.log.Info("rebalancing watches off a loaded fanout replica", "fanout", l.b.url.Host, "watches", l.n, "fair", fair, "shed", n)
			if p.shed != nil {
				for range n {
					p.shed(l.b.url.Host)
				}
			}
		}
	}
}

// refresh resolves every configured name and replaces its replicas, keeping
// the backends (and their load) of addresses that remain. A failed lookup
// keeps the previous replicas.
func (p *fanoutPool) refresh(ctx context.Context) {
	p.refreshMu.Lock() // one at a time: each replaces the backends it read
	defer p.refreshMu.Unlock()
	p.mu.RLock()
	byURL := map[string]*backend{}
	for _, b := range p.backends {
		byURL[b.url.String()] = b
	}
	p.mu.RUnlock()
	keep := map[string]bool{}
	var next []*backend
	for _, b := range byURL {
		if net.ParseIP(b.origin.Hostname()) != nil {
			next = append(next, b) // configured as an address
			keep[b.url.String()] = true
		}
	}
	for _, u := range p.names {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		addrs, err := net.DefaultResolver.LookupHost(rctx, u.Hostname())
		cancel()
		if err != nil {
			p.log.Warn("resolving fanout replicas failed; keeping the previous ones", "name", u.Host, "err", err)
			for _, b := range byURL {
				if b.origin == u && !keep[b.url.String()] {
					next = append(next, b)
					keep[b.url.String()] = true
				}
			}
			continue
		}
		sort.Strings(addrs)
		for _, a := range addrs {
			ru := *u
			ru.Host = net.JoinHostPort(a, u.Port())
			if b, ok := byURL[ru.String()]; ok {
				next = append(next, b)
				continue
			}
			b := p.newBackend(&ru)
			b.origin = u
			next = append(next, b)
		}
	}
	p.mu.Lock()
	p.backends = next
	p.mu.Unlock()
}

// endCleanly is the body of a watch a replica is streaming: when the
// replica fails mid-stream (killed, cut off), the client's watch ends as if
// the server had closed it, not aborted (an HTTP/2 stream reset, a torn
// chunked body). client-go resumes a watch that ended from its last
// resourceVersion, but relists on an aborted one: a whole fleet at once
// when a fanout replica dies, every LIST reaching the caches.
type endCleanly struct{ io.ReadCloser }

func (b *endCleanly) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		err = io.EOF
	}
	return n, err
}

// order returns the replicas to try: up ones by load, then down ones (a
// replica may have come back; trying it beats failing).
func (p *fanoutPool) order() []*backend {
	now := time.Now().UnixNano()
	p.mu.RLock()
	backends := p.backends
	p.mu.RUnlock()
	n := len(backends)
	if n == 0 {
		return nil
	}
	off := int(p.next.Add(1) % uint64(n))
	out := make([]*backend, 0, n)
	for i := range n {
		out = append(out, backends[(off+i)%n])
	}
	slices.SortStableFunc(out, func(a, b *backend) int {
		ad, bd := a.down.Load() > now, b.down.Load() > now
		if ad != bd {
			if ad {
				return 1
			}
			return -1
		}
		return int(a.open.Load() - b.open.Load())
	})
	return out
}

// serve proxies one authorized watch, info its resource and wr its parsed
// options; started runs (at most once) when a replica's response starts.
func (p *fanoutPool) serve(w http.ResponseWriter, r *http.Request, info request.Info, wr *request.WatchRequest, started func(), end *requestEnd) {
	order := p.order()
	req := watchsession.NewRequest(info, wr)
	req.Accept = r.Header.Get("Accept")
	req.AcceptGzip = service.AcceptsGzip(r)
	req.TraceEvents = p.tracer != nil
	for i, b := range order {
		at := &attempt{req: req, last: i == len(order)-1, started: started, end: end}
		p.proxy(b, w, r, at)
		if at.err == nil {
			return
		}
		b.down.Store(time.Now().Add(p.downFor).UnixNano())
		b.failing.Store(true)
		p.log.Warn("fanout replica failed, trying the next", "fanout", b.url.Host, "err", at.err)
		if p.retries != nil {
			p.retries(b.url.Host)
		}
		select { // the replicas may have changed: look again now
		case p.kick <- struct{}{}:
		default:
		}
	}
	if wr.Plan.Mode == rv.WatchAfter {
		// A resume: 429, on which client-go retries the watch from its
		// resourceVersion (on a 503 it relists: a storm of LISTs when
		// every replica restarts at once).
		kube.WriteStatus(w, apierrors.NewTooManyRequests("no watch server is reachable; resume from the same resourceVersion", 1))
		return
	}
	kube.WriteStatus(w, apierr.Unavailable("no watch server is reachable, please try again"))
}

// proxy runs one attempt on b: the watch goes as frontdoor parsed it (a
// stream of a session), never with the client's credential or headers; a
// 503 or a failure before the response starts is left to serve to retry on
// the next replica; hop-by-hop headers are dropped from the response; and
// the body is copied by copyStream, or by a detachedStream (see detach).
// Whatever way it ends, b's open count and streaming set are restored.
func (p *fanoutPool) proxy(b *backend, w http.ResponseWriter, r *http.Request, at *attempt) {
	// The attempt's context ends with the request (the client leaves, the
	// server stops) while the handler serves it; a detached stream
	// outlives the request and links those ends itself (see detach). It is
	// not the request's child, nor does it keep its values: what a
	// detached watch holds must not keep the request's state alive. Only
	// the trace is carried (traceResponse links to it).
	parent := context.Background()
	if p.tracer != nil {
		parent = trace.ContextWithSpanContext(parent, trace.SpanContextFromContext(r.Context()))
	}
	ctx := newStreamContext(parent)
	cancel := ctx.cancel
	unlink := context.AfterFunc(r.Context(), cancel)
	at.cancel = cancel
	b.open.Add(1)
	var resp *http.Response
	detached := false
	defer func() {
		if !detached {
			unlink()
			endAttempt(b, resp, at.done, cancel)
		}
	}()
	// The replica's time to start its response: the timer is dropped once
	// it has.
	timeout := time.AfterFunc(p.responseTimeout, cancel)
	resp, err := p.transport.Watch(ctx, b.url, at.req)
	if !timeout.Stop() {
		if err == nil {
			resp.Body.Close()
		}
		resp, err = nil, fmt.Errorf("no response within %s", p.responseTimeout)
	}
	if err != nil {
		resp = nil
		if r.Context().Err() == nil { // else the client left; nothing to retry
			at.err = err
		}
		return
	}
	if resp.StatusCode == http.StatusServiceUnavailable && !at.last {
		at.err = errReplicaUnavailable
		return
	}
	p.traceResponse(ctx, resp)
	b.failing.Store(false)
	at.started()
	if resp.StatusCode == http.StatusOK {
		// An upstream that dies mid-stream ends the client's watch
		// cleanly: it resumes from its resourceVersion.
		resp.Body = &endCleanly{ReadCloser: resp.Body}
		// A stream of events, which can be ended between two (a
		// compressed one cannot: it stays until it ends).
		if body := sheddableBody(resp, cancel); body != nil {
			resp.Body = body
			at.done = b.streaming(body)
		}
	}
	dropHopHeaders(resp.Header)
	h := w.Header()
	for k, vs := range resp.Header {
		h[k] = append(h[k][:0:0], vs...)
	}
	if resp.StatusCode == http.StatusOK {
		if conn, head, ok := p.detach(w, r, at); ok {
			// The request's context ends when the handler returns: the
			// stream links the attempt's ends itself from now on.
			unlink()
			detached = true
			at.end.detach(http.StatusOK)
			// The transport keeps the response for the watch's life; its
			// headers are the client's now.
			resp.Header = nil
			// The stream keeps only what it releases (not the attempt
			// and its request).
			ds := &detachedStream{p: p, conn: conn, resp: resp, cancel: cancel, b: b, unregister: at.done, end: at.end}
			go ds.run(head)
			return
		}
	}
	w.WriteHeader(resp.StatusCode)
	if err := p.copyStream(w, resp.Body); err != nil && r.Context().Err() == nil {
		// The client could not be written to: as the reverse proxy does,
		// abort its connection rather than end the response cleanly.
		panic(http.ErrAbortHandler)
	}
}

// streamContext is the context of a watch's upstream request: done once
// cancelled (never by a deadline), with its parent's values. It is
// context.WithCancel's without what that keeps for a watch's whole life:
// the transport derives a context of the request's for each round trip and
// ends it once the response starts, which leaves a WithCancel parent its
// map of children, empty, and the func WithCancel returns (~300 B per idle
// watch). A context derived from this one is followed by a goroutine until
// the transport ends it (context.WithCancel's rule for contexts of other
// types).
type streamContext struct {
	context.Context // the parent, whose values it has; never done
	done            chan struct{}
	cancelled       atomic.Bool
}

func newStreamContext(parent context.Context) *streamContext {
	return &streamContext{Context: parent, done: make(chan struct{})}
}

func (c *streamContext) Done() <-chan struct{} { return c.done }

func (c *streamContext) Err() error {
	select {
	case <-c.done:
		return context.Canceled
	default:
		return nil
	}
}

// cancel ends the context; it may be called more than once.
func (c *streamContext) cancel() {
	if c.cancelled.CompareAndSwap(false, true) {
		close(c.done)
	}
}

// endAttempt releases what an attempt on b holds: its response (nil: none),
// its place in b's streaming set (unregister, nil: none), its context and
// its place in b's open count.
func endAttempt(b *backend, resp *http.Response, unregister func(), cancel context.CancelFunc) {
	if resp != nil {
		resp.Body.Close()
	}
	if unregister != nil {
		unregister()
	}
	cancel()
	b.open.Add(-1)
}

// detach takes over the connection of a watch whose response starts (200,
// headers in w.Header()) and returns it with the response's head, for a
// detachedStream to serve on its own goroutine, so that the handler can return:
// net/http then frees what it holds for the connection and the request
// (its read and write buffers, 4 KB each, the response's 2 KB, the
// request's state), which an idle watch would otherwise hold for its whole
// life. Only an HTTP/1.1 GET's connection can be taken over (net/http's
// Hijack); false leaves the response to w.
//
// A detached stream keeps every rule of the handler's: each read of the
// replica's body reaches the client at once; the client leaving (its
// connection's read side ends) cancels the upstream request; a failed
// write aborts the connection; the server shutting down (Shutdown, through
// RegisterOnShutdown: net/http no longer tracks the connection) ends the
// stream at once, cleanly, and a client that does not read it is cut after
// the shutdown grace period. Unlike net/http, it does not keep the
// connection alive after the watch (Connection: close): the client's next
// watch starts on a new one, possibly on another frontdoor.
func (p *fanoutPool) detach(w http.ResponseWriter, r *http.Request, at *attempt) (net.Conn, []byte, bool) {
	if at.end == nil || at.end.detached == nil || r.Method != http.MethodGet || r.ProtoMajor != 1 || r.ProtoMinor < 1 {
		return nil, nil, false
	}
	h := w.Header()
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return nil, nil, false // not an HTTP/1.1 connection's (HTTP/2, a test's recorder)
	}
	// The buffered reader net/http hands over holds nothing of the watch
	// (a GET has no body); anything a client pipelined after it is dropped
	// with the connection, which the response says is closing.
	p.streamsMu.Lock()
	p.streams[conn] = at.cancel
	if p.stopped { // shutdown has gone through the streams
		at.cancel()
		conn.SetWriteDeadline(time.Now().Add(p.grace))
	}
	p.streamsMu.Unlock()
	h.Del("Content-Length")
	h.Set("Transfer-Encoding", "chunked")
	h.Set("Connection", "close")
	if _, ok := h["Date"]; !ok {
		h.Set("Date", time.Now().UTC().Format(http.TimeFormat))
	}
	head := bytes.NewBufferString("HTTP/1.1 200 OK\r\n")
	h.Write(head) // a bytes.Buffer does not fail
	head.WriteString("\r\n")
	return conn, head.Bytes(), true
}

// chunkRoom is the room a detachedStream leaves before a read for its chunk-size line
// (hex digits and CRLF) and after it for the chunk's CRLF.
const chunkRoom = 10

// detachedStream is a watch's stream served on its own connection (see
// detach): what it writes, and what it releases when it ends.
type detachedStream struct {
	p          *fanoutPool
	conn       net.Conn
	resp       *http.Response // the replica's, whose body is streamed
	cancel     context.CancelFunc
	b          *backend
	unregister func() // from b's streaming set (nil: none)
	end        *requestEnd
	dropped    [16]byte // what the client sends, read and dropped
}

// run writes head and then the replica's body to the connection, each read
// of the body as one HTTP/1.1 chunk written at once (as net/http writes a
// flushed chunked response); the body's end ends the stream cleanly (the
// last chunk), a failed write aborts it. Like copyStream it waits for data
// without a buffer. It then closes the connection and ends the attempt and
// the request.
func (s *detachedStream) run(head []byte) {
	p := s.p
	defer func() {
		s.conn.Close()
		endAttempt(s.b, s.resp, s.unregister, s.cancel)
		s.end.run()
		p.streamsMu.Lock()
		delete(p.streams, s.conn)
		if len(p.streams) == 0 {
			p.noStreams.Broadcast()
		}
		p.streamsMu.Unlock()
	}()
	go s.readClient()
	if _, err := s.conn.Write(head); err != nil {
		return
	}
	body := s.resp.Body
	for {
		if _, err := body.Read(nil); err != nil {
			break
		}
		bp := p.buffers.Get()
		buf := *bp
		n, rerr := body.Read(buf[chunkRoom : len(buf)-2])
		var werr error
		if n > 0 {
			var size [8]byte
			hex := strconv.AppendUint(size[:0], uint64(n), 16)
			from := chunkRoom - len(hex) - 2
			copy(buf[from:], hex)
			buf[chunkRoom-2], buf[chunkRoom-1] = '\r', '\n'
			buf[chunkRoom+n], buf[chunkRoom+n+1] = '\r', '\n'
			_, werr = s.conn.Write(buf[from : chunkRoom+n+2])
		}
		p.buffers.Put(bp)
		if werr != nil {
			return
		}
		if rerr != nil {
			break
		}
	}
	s.conn.Write([]byte("0\r\n\r\n"))
}

// readClient reads the connection until its read side ends (the client
// left, or run closed it), then cancels the upstream watch: net/http reads
// a connection while its handler runs for the same reason. What the client
// sends meanwhile is dropped.
func (s *detachedStream) readClient() {
	for {
		if _, err := s.conn.Read(s.dropped[:]); err != nil {
			s.cancel()
			return
		}
	}
}

// copyStream copies a replica's response to the client, flushing every
// read at once. It waits for data without a buffer (a zero-length read of
// an HTTP/2 response body blocks until data or the end arrives) and
// borrows one only to copy what is there: an idle watch holds none, where
// the reverse proxy's copy held 32 KB for the watch's whole life. It
// returns the client's write error; the body's end or failure (see
// endCleanly) ends the copy cleanly.
func (p *fanoutPool) copyStream(w http.ResponseWriter, body io.Reader) error {
	rc := http.NewResponseController(w)
	if err := rc.Flush(); err != nil { // the headers, before any event
		return err
	}
	for {
		if _, err := body.Read(nil); err != nil {
			return nil
		}
		bp := p.buffers.Get()
		n, rerr := body.Read(*bp)
		var werr error
		if n > 0 {
			if _, werr = w.Write((*bp)[:n]); werr == nil {
				werr = rc.Flush()
			}
		}
		p.buffers.Put(bp)
		if werr != nil {
			return werr
		}
		if rerr != nil {
			return nil
		}
	}
}

// hopHeaders are the hop-by-hop headers a proxy must not forward (RFC 9110
// section 7.6.1), besides those the Connection header names.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func dropHopHeaders(h http.Header) {
	for _, v := range h.Values("Connection") {
		for _, name := range strings.Split(v, ",") {
			if name = textproto.TrimString(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
}

// shedBody is the response body of a streaming watch, which the pool may
// end to rebalance: once ended, it reports io.EOF at the first event
// boundary (dropping a partial event read past it), so the client sees a
// clean end of stream after a whole event and resumes from its
// resourceVersion. Events are JSON lines, or length-prefixed frames in a
// protobuf stream, where a newline byte may fall anywhere in a frame. A
// read that holds several events returns all the whole ones.
type shedBody struct {
	io.ReadCloser
	cancel context.CancelFunc // aborts the upstream request

	mu       sync.Mutex
	ended    bool
	boundary bool // what was returned so far ends with a whole event
	frames   bool // protobuf: a 4-byte big-endian length, then the frame
	// Of a protobuf stream, the frame in progress: its length's bytes read
	// so far (head), then how much of it is left (rest).
	headLen uint8
	head    [4]byte
	rest    uint32
}

// sheddableBody returns resp's body as a shedBody that cancel aborts, or
// nil for a stream that can only be ended where it ends: a compressed one,
// or one of a media type whose events it cannot tell apart.
func sheddableBody(resp *http.Response, cancel context.CancelFunc) *shedBody {
	if resp.Header.Get("Content-Encoding") != "" {
		return nil
	}
	switch mediaType(resp.Header) {
	case storage.MediaJSON:
		return &shedBody{ReadCloser: resp.Body, cancel: cancel, boundary: true}
	case storage.MediaProtobuf:
		return &shedBody{ReadCloser: resp.Body, cancel: cancel, frames: true, boundary: true}
	}
	return nil
}

// mediaType is the media type of h's Content-Type, without parameters.
func mediaType(h http.Header) string {
	mt, _, _ := strings.Cut(h.Get("Content-Type"), ";")
	return strings.TrimSpace(mt)
}

func (b *shedBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	if b.ended && b.boundary {
		b.mu.Unlock()
		return 0, io.EOF
	}
	b.mu.Unlock()
	n, err := b.ReadCloser.Read(p)
	b.mu.Lock()
	defer b.mu.Unlock()
	was := b.boundary
	last := b.scan(p[:n])
	if b.ended {
		switch {
		case last >= 0:
			b.boundary = true
			return last, io.EOF
		case was:
			b.boundary = true
			return 0, io.EOF
		}
	}
	return n, err
}

// scan follows the events through p, the next bytes of the stream, and
// records whether p ends on a boundary. It returns the length of p up to
// the end of its last whole event, -1 if no event ends in p (a stream of
// lines that is not ended does not look for one).
func (b *shedBody) scan(p []byte) int {
	if len(p) == 0 {
		return -1
	}
	if !b.frames {
		if b.boundary = p[len(p)-1] == '\n'; b.boundary {
			return len(p)
		}
		if b.ended {
			if i := bytes.LastIndexByte(p, '\n'); i >= 0 {
				return i + 1
			}
		}
		return -1
	}
	last := -1
	for i := 0; i < len(p); {
		if b.rest == 0 {
			n := copy(b.head[b.headLen:], p[i:])
			b.headLen += uint8(n)
			i += n
			if int(b.headLen) < len(b.head) {
				break
			}
			b.headLen = 0
			if b.rest = binary.BigEndian.Uint32(b.head[:]); b.rest == 0 {
				last = i
			}
			continue
		}
		n := int(min(uint64(b.rest), uint64(len(p)-i)))
		b.rest -= uint32(n)
		i += n
		if b.rest == 0 {
			last = i
		}
	}
	b.boundary = b.rest == 0 && b.headLen == 0
	return last
}

// end ends the stream: at once between events (the upstream request is
// cancelled, which the read above reports as the end), else after the event
// in progress.
func (b *shedBody) end() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ended = true
	if b.boundary {
		b.cancel()
	}
}
