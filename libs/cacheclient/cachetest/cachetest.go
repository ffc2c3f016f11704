// Package cachetest is a scripted cache shard for the tests of what talks
// to caches (libs/cacheclient, fanout's hub): a heraldv1.CacheClient whose
// LISTs a function answers and whose watches the test feeds by hand, so
// that merges, lagging shards and broken streams can be played in any
// order without a real cache.
//
// It is test support only: no service imports it.
package cachetest

import (
	"context"
	"io"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// Shard is one scripted cache shard.
type Shard struct {
	// ListFunc answers LISTs (nil: Unimplemented).
	ListFunc func(*heraldv1.ListRequest) (*heraldv1.ListResponse, error)
	// OnWatch, when set, is called with every watch as it opens (to script
	// it at once); otherwise the watch is sent on Watches.
	OnWatch func(*Watch)
	// Watches receives every watch opened on the shard, in order.
	Watches chan *Watch

	mu    sync.Mutex
	lists []*heraldv1.ListRequest
}

var _ heraldv1.CacheClient = (*Shard)(nil)

// NewShard returns a shard with no script.
func NewShard() *Shard { return &Shard{Watches: make(chan *Watch, 64)} }

// List records req and answers it with ListFunc.
func (s *Shard) List(_ context.Context, req *heraldv1.ListRequest, _ ...grpc.CallOption) (*heraldv1.ListResponse, error) {
	s.mu.Lock()
	s.lists = append(s.lists, req)
	s.mu.Unlock()
	if s.ListFunc == nil {
		return nil, status.Error(codes.Unimplemented, "cachetest: no ListFunc")
	}
	return s.ListFunc(req)
}

// Lists returns the LIST requests received so far.
func (s *Shard) Lists() []*heraldv1.ListRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*heraldv1.ListRequest(nil), s.lists...)
}

// Watch opens a watch the test feeds (see Watch).
func (s *Shard) Watch(ctx context.Context, req *heraldv1.WatchRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[heraldv1.WatchResponse], error) {
	w := &Watch{Req: req, ctx: ctx, ch: make(chan reply, 64)}
	if s.OnWatch != nil {
		s.OnWatch(w)
	} else {
		s.Watches <- w
	}
	return &stream{w: w}, nil
}

// Watch is one open watch on a Shard: the test reads Req and sends what
// the shard streams, in order.
type Watch struct {
	Req *heraldv1.WatchRequest
	ctx context.Context
	ch  chan reply
}

type reply struct {
	resp *heraldv1.WatchResponse
	err  error
}

// Send streams one response holding evs.
func (w *Watch) Send(evs ...*heraldv1.Event) {
	w.put(reply{resp: &heraldv1.WatchResponse{Events: evs}})
}

// Fail ends the stream with err.
func (w *Watch) Fail(err error) { w.put(reply{err: err}) }

// End ends the stream (io.EOF).
func (w *Watch) End() { w.put(reply{err: io.EOF}) }

func (w *Watch) put(r reply) {
	select {
	case w.ch <- r:
	case <-w.ctx.Done():
	}
}

// Event is an event of type t at rev (name: the object's).
func Event(t heraldv1.EventType, rev int64, name string) *heraldv1.Event {
	return &heraldv1.Event{Type: t, Revision: rev, Namespace: "default", Name: name, Object: []byte(`{"metadata":{"name":"` + name + `"}}`)}
}

// Bookmark is a BOOKMARK at rev.
func Bookmark(rev int64) *heraldv1.Event {
	return &heraldv1.Event{Type: heraldv1.EventType_BOOKMARK, Revision: rev}
}

type stream struct {
	grpc.ClientStream // nil: only Recv is used
	w                 *Watch
}

// Header: a scripted stream sends no response headers.
func (s *stream) Header() (metadata.MD, error) { return nil, nil }

func (s *stream) Recv() (*heraldv1.WatchResponse, error) {
	select {
	case r := <-s.w.ch:
		return r.resp, r.err
	case <-s.w.ctx.Done():
		return nil, status.FromContextError(s.w.ctx.Err()).Err()
	}
}

// Split is a registry of the default resources with pods split over two
// scripted shards, A (partitions 0-7, target "a") and B (8-15, "b"), and
// everything else on C ("c").
type Split struct {
	Reg     *kube.Registry
	Shards  *kube.ShardMap
	A, B, C *Shard
}

// NewSplit builds a Split.
func NewSplit(t testing.TB) *Split {
	t.Helper()
	reg, err := kube.NewRegistry(kube.DefaultPrefix, kube.DefaultResources())
	if err != nil {
		t.Fatal(err)
	}
	m, err := kube.ParseShardMap("pods/0-7=a;pods/8-15=b;*=c", reg)
	if err != nil {
		t.Fatal(err)
	}
	return &Split{Reg: reg, Shards: m, A: NewShard(), B: NewShard(), C: NewShard()}
}

// Clients maps each target to its shard.
func (s *Split) Clients() map[string]heraldv1.CacheClient {
	return map[string]heraldv1.CacheClient{"a": s.A, "b": s.B, "c": s.C}
}
