package cacheclient

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// resumePause is how long a shard's broken stream waits before it is
// reopened: a shard replica may be restarting.
const resumePause = 100 * time.Millisecond

// Watch serves a watch over the shards that own the request:
//   - one shard, not following: that shard's stream, unchanged;
//   - initial events: the first shard's state, then the others' at exactly
//     its revision, then a BOOKMARK at that revision; then what follows it
//     (as below, after that revision);
//   - following: the shards' streams merged by revision (see the package
//     comment), opened by a BOOKMARK at the merged start; a broken shard
//     stream is resumed;
//   - not following: the shards' events after AfterRevision that every
//     shard has passed, in revision order, then a BOOKMARK at the revision
//     the merged replay is complete through.
//
// The caller cancels ctx or reads until an error (io.EOF at the end), as
// with any gRPC stream.
func (c *Sharded) Watch(ctx context.Context, req *heraldv1.WatchRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[heraldv1.WatchResponse], error) {
	clients, err := c.route(req.Resource, req.Namespace)
	if err != nil {
		return nil, err
	}
	if len(clients) == 1 && !req.Follow {
		return clients[0].Watch(ctx, req, opts...)
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &stream{ctx: ctx, cancel: cancel, c: c, clients: clients, req: req, opts: opts}
	switch {
	case req.InitialEvents:
		s.next = s.state()
	case req.Follow:
		s.next = s.follow(req.AfterRevision)
	default:
		s.next = s.replay(req.AfterRevision)
	}
	return s, nil
}

// stream is a merged watch stream; next serves its current phase.
type stream struct {
	ctx     context.Context
	cancel  context.CancelFunc
	c       *Sharded
	clients []heraldv1.CacheClient
	req     *heraldv1.WatchRequest
	opts    []grpc.CallOption
	next    func() (*heraldv1.WatchResponse, error)
	err     error // once set, every Recv returns it
	// expiredThrough: the highest generation floor the shards' streams
	// announced (generation.go).
	expiredThrough atomic.Int64
}

func (s *stream) Recv() (*heraldv1.WatchResponse, error) {
	if s.err != nil {
		return nil, s.err
	}
	resp, err := s.next()
	if err != nil {
		s.err = err
		s.cancel()
	}
	return resp, err
}

func (s *stream) RecvMsg(m any) error {
	out, ok := m.(*heraldv1.WatchResponse)
	if !ok {
		return status.Errorf(codes.Internal, "cacheclient: cannot receive into %T", m)
	}
	resp, err := s.Recv()
	if err != nil {
		return err
	}
	proto.Reset(out)
	proto.Merge(out, resp)
	return nil
}

func (s *stream) Header() (metadata.MD, error) { return s.header(), nil }
func (s *stream) Trailer() metadata.MD         { return nil }
func (s *stream) CloseSend() error             { return nil }
func (s *stream) Context() context.Context     { return s.ctx }
func (s *stream) SendMsg(any) error {
	return status.Error(codes.Unimplemented, "cacheclient: a watch stream takes no messages")
}

func (s *stream) eof() (*heraldv1.WatchResponse, error) { return nil, io.EOF }

func bookmark(rev int64) *heraldv1.Event {
	return &heraldv1.Event{Type: heraldv1.EventType_BOOKMARK, Revision: rev}
}

// state streams the first shard's initial events, then every other shard's
// at exactly the first one's revision, then a BOOKMARK at it; it then
// follows or replays after that revision.
func (s *stream) state() func() (*heraldv1.WatchResponse, error) {
	var (
		i      int
		rev    int64
		cur    grpc.ServerStreamingClient[heraldv1.WatchResponse]
		cancel context.CancelFunc
	)
	return func() (*heraldv1.WatchResponse, error) {
		for {
			if cur == nil {
				if i == len(s.clients) {
					if s.req.Follow {
						s.next = s.follow(rev)
					} else {
						s.next = s.replay(rev)
					}
					return &heraldv1.WatchResponse{Events: []*heraldv1.Event{bookmark(rev)}}, nil
				}
				req := s.req
				if i > 0 {
					// The other shards' state at the first shard's
					// revision, under the same selectors: each shard
					// sends only what the watcher sees.
					req = &heraldv1.WatchRequest{Resource: req.Resource, Namespace: req.Namespace, InitialEvents: true, StateRevision: rev,
						LabelSelector: req.LabelSelector, FieldSelector: req.FieldSelector, Selector: req.Selector,
						OmitUnchangedPrev: req.OmitUnchangedPrev, WithProtobuf: req.WithProtobuf}
				}
				var ctx context.Context
				ctx, cancel = context.WithCancel(s.ctx)
				var err error
				if cur, err = s.clients[i].Watch(ctx, req, s.opts...); err != nil {
					cancel()
					return nil, err
				}
			}
			resp, err := cur.Recv()
			if err != nil && !errors.Is(err, io.EOF) {
				cancel()
				return nil, err
			}
			done := err != nil // a stream that ends before its bookmark ends its state
			var evs []*heraldv1.Event
			if resp != nil {
				evs = resp.Events
			}
			for j, ev := range evs {
				if ev.Type == heraldv1.EventType_BOOKMARK {
					if i == 0 {
						rev = ev.Revision
					}
					evs, done = evs[:j], true // the state ends at its first bookmark
					break
				}
			}
			if done {
				cancel()
				cur = nil
				i++
			}
			if len(evs) > 0 {
				return &heraldv1.WatchResponse{Events: evs}, nil
			}
		}
	}
}

// replay streams, merged, the shards' events after `after` that every
// shard has passed, then a BOOKMARK at that revision. It reads one response
// at a time from the shard that is furthest behind and returns what it can
// release in responses of about replayBatch events, so what it holds is at
// most about one response per shard however long the replay (a deep resume
// may be the whole stream's history); the shards' selectors are the
// request's, so events no watcher of it can see are not even sent.
//
// The shards are asked in order, each once the one before has answered:
// a cache runs a bounded number of deep replays at once (queued), and a
// replay that held one shard's slot while it waited for another's, when
// another replay held that one and waited for the first, would wait
// forever. Taken in one order, the slots cannot form such a cycle; and a
// replay waiting for a shard holds no stream open on the shards after it.
func (s *stream) replay(after int64) func() (*heraldv1.WatchResponse, error) {
	var shards []grpc.ServerStreamingClient[heraldv1.WatchResponse]
	m := newMerge(len(s.clients))
	ended := make([]bool, len(s.clients))
	// read adds the next response of shard i to the merge.
	read := func(i int) error {
		resp, err := shards[i].Recv()
		if errors.Is(err, io.EOF) {
			ended[i] = true
			return nil
		}
		if err != nil {
			return err
		}
		var through int64
		var evs []*heraldv1.Event
		for _, ev := range resp.Events {
			through = max(through, ev.Revision)
			if ev.Type != heraldv1.EventType_BOOKMARK {
				evs = append(evs, ev)
			}
		}
		m.add(i, evs, through)
		return nil
	}
	return func() (*heraldv1.WatchResponse, error) {
		if shards == nil {
			req := &heraldv1.WatchRequest{Resource: s.req.Resource, Namespace: s.req.Namespace, AfterRevision: after,
				LabelSelector: s.req.LabelSelector, FieldSelector: s.req.FieldSelector, Selector: s.req.Selector,
				OmitUnchangedPrev: s.req.OmitUnchangedPrev, WithProtobuf: s.req.WithProtobuf}
			for i, c := range s.clients {
				st, err := c.Watch(s.ctx, req, s.opts...)
				if err != nil {
					return nil, err
				}
				shards = append(shards, st)
				if i < len(s.clients)-1 {
					if err := read(i); err != nil {
						return nil, err
					}
				}
			}
		}
		var out []*heraldv1.Event
		for {
			if out = m.release(out); len(out) >= replayBatch {
				return &heraldv1.WatchResponse{Events: out}, nil
			}
			behind := 0
			for i, t := range m.through {
				if t < m.through[behind] {
					behind = i
				}
			}
			if ended[behind] {
				// Nothing past its end can be released.
				s.next = s.eof
				return &heraldv1.WatchResponse{Events: append(out, bookmark(m.safe()))}, nil
			}
			if err := read(behind); err != nil {
				return nil, err
			}
		}
	}
}

// replayBatch is about the most events a merged replay response holds (a
// cache's responses hold up to 256).
const replayBatch = 256

// ReadEvents runs one non-following watch on c, calling fn with every event
// (bookmarks included) until the stream ends or fn returns false.
func ReadEvents(ctx context.Context, c heraldv1.CacheClient, req *heraldv1.WatchRequest, fn func(*heraldv1.Event) bool, opts ...grpc.CallOption) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.Watch(ctx, req, opts...)
	if err != nil {
		return err
	}
	for {
		resp, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, ev := range resp.Events {
			if !fn(ev) {
				return nil
			}
		}
	}
}

// merge is the shard-merge rule for watch streams: each shard's events not
// yet released, in its order, and the revision it has sent everything up
// to. Events at or below the lowest of those are released in revision
// order (ties: by shard), which is the order of the whole resource.
//
// held and heldBytes count what is pending (events; bytes of their objects),
// which a shard behind the others makes grow: the caller bounds it.
type merge struct {
	pending   [][]*heraldv1.Event
	through   []int64
	held      int
	heldBytes int64
}

func newMerge(n int) *merge {
	return &merge{pending: make([][]*heraldv1.Event, n), through: make([]int64, n)}
}

// add records what shard delivered: its events (never splitting a
// revision) and the revision it has now sent everything up to.
func (m *merge) add(shard int, evs []*heraldv1.Event, through int64) {
	m.pending[shard] = append(m.pending[shard], evs...)
	m.through[shard] = max(m.through[shard], through)
	m.held += len(evs)
	for _, ev := range evs {
		m.heldBytes += eventBytes(ev)
	}
}

func eventBytes(ev *heraldv1.Event) int64 {
	return int64(len(ev.Object) + len(ev.PrevObject) + len(ev.ObjectProtobuf))
}

// lagging is the shard that holds the others back: the one with the lowest
// through.
func (m *merge) lagging() int {
	low := 0
	for i, t := range m.through {
		if t < m.through[low] {
			low = i
		}
	}
	return low
}

// safe is the revision every shard has passed.
func (m *merge) safe() int64 {
	safe := m.through[0]
	for _, t := range m.through[1:] {
		safe = min(safe, t)
	}
	return safe
}

// release appends to out, in revision order, every pending event at or
// below safe.
func (m *merge) release(out []*heraldv1.Event) []*heraldv1.Event {
	safe := m.safe()
	for {
		best := -1
		for i, p := range m.pending {
			if len(p) > 0 && p[0].Revision <= safe && (best < 0 || p[0].Revision < m.pending[best][0].Revision) {
				best = i
			}
		}
		if best < 0 {
			return out
		}
		out = append(out, m.pending[best][0])
		m.held--
		m.heldBytes -= eventBytes(m.pending[best][0])
		m.pending[best][0] = nil
		m.pending[best] = m.pending[best][1:]
	}
}
