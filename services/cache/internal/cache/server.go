package cache

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"

	"herald.dev/libs/kube"
	"herald.dev/libs/kube/request"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/rv"
)

// Server serves a shard over gRPC.
type Server struct {
	heraldv1.UnimplementedCacheServer
	s *Shard
}

// NewServer returns the gRPC service of shard s.
func NewServer(s *Shard) *Server { return &Server{s: s} }

// errStatus maps the shard's and rv's errors to the gRPC codes of the
// contract in herald.proto.
func errStatus(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, rv.ErrMalformed):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, rv.ErrInvalidCombination):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.As(err, new(*tooOldError)):
		return status.Error(codes.OutOfRange, err.Error())
	case errors.Is(err, errTooLarge):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.Internal, err.Error())
}

func (v *Server) resource(ctx context.Context, id string) (*resourceState, error) {
	if !v.s.ready.Load() {
		return nil, status.Error(codes.Unavailable, "the cache is not ready")
	}
	r, ok := v.s.reg.ByID(id)
	if !ok && v.s.custom {
		// A custom resource another replica has learned (the caller
		// learned it from one) may be in a revision this replica has
		// not applied yet: catch up with etcd, then look again.
		if rev, err := v.s.currentRevision(ctx); err == nil && v.s.waitFor(ctx, rev, id) == nil {
			r, ok = v.s.reg.ByID(id)
		}
	}
	if !ok {
		return nil, status.Errorf(codes.NotFound, "the server could not find the requested resource %q", id)
	}
	rs, ok := v.s.resourceStates()[r.ID()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "resource %q is not served by this shard", id)
	}
	return rs, nil
}

// List serves LIST and GET.
func (v *Server) List(ctx context.Context, req *heraldv1.ListRequest) (*heraldv1.ListResponse, error) {
	start := time.Now()
	rs, err := v.resource(ctx, req.Resource)
	if err != nil {
		return nil, err
	}
	defer func() { v.s.m.listTime.WithLabelValues(rs.res.ID()).Observe(time.Since(start).Seconds()) }()
	v.s.m.lists.WithLabelValues(rs.res.ID()).Inc()
	limit := req.Limit
	if req.Name != "" {
		limit = 0 // a GET's: it does not make the resourceVersion exact
	}
	prefix := rs.res.NamespacePrefix(req.Namespace)
	plan, err := rv.PlanList(req.ResourceVersion, req.ResourceVersionMatch, req.Continue, limit, prefix)
	if err != nil {
		return nil, errStatus(err)
	}
	sel, err := selector(rs.res, req.Namespace, req.Selector, req.LabelSelector, req.FieldSelector)
	if err != nil {
		return nil, err
	}
	if plan.Mode == rv.ListAny && rs.res.Stored().NotWatchCached {
		// kube-apiserver lists a resource it does not watch-cache from
		// etcd, with the limit, even at resourceVersion=0.
		plan.Limit = max(req.Limit, 0)
	}
	if req.Name != "" {
		// GET: one object, same revision rules; limit and continue do not apply.
		plan.Limit = 0
		if plan.Mode == rv.ListContinue {
			return nil, status.Error(codes.InvalidArgument, "continue is not allowed for a single object")
		}
	}
	if err := v.s.expiredByCompaction(plan, prefix); err != nil {
		return nil, err
	}
	var atRev int64
	switch {
	case plan.Mode == rv.ListConsistent, plan.Mode == rv.ListContinue && plan.Token.Rev == 0:
		// (A token with no revision, from kube-apiserver, continues at the
		// latest state, read as consistently.)
		cur, err := v.s.currentRevision(ctx)
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "reading etcd's revision: %v", err)
		}
		if err := v.s.waitFor(ctx, cur, rs.res.ID()); err != nil {
			if errors.Is(err, errTooLarge) {
				return nil, status.Error(codes.DeadlineExceeded, "the cache did not reach etcd's current revision in time")
			}
			return nil, errStatus(err)
		}
	case plan.Mode == rv.ListNotOlderThan, plan.Mode == rv.ListExact:
		if err := v.s.waitFor(ctx, plan.Rev, rs.res.ID()); err != nil {
			return nil, errStatus(err)
		}
		if plan.Mode == rv.ListExact {
			atRev = plan.Rev
		}
	case plan.Mode == rv.ListContinue:
		// The token's revision is the first page's, which another replica
		// (or, for a split resource, another shard) may have served: this
		// one may not have reached it yet, and its state now is older.
		if err := v.s.waitFor(ctx, plan.Token.Rev, rs.res.ID()); err != nil {
			return nil, errStatus(err)
		}
		atRev = plan.Token.Rev
	}
	rs = v.s.current(rs)
	head := v.s.head.Load()
	if atRev == 0 {
		atRev = head
	}
	snap, err := rs.stateAt(atRev, head)
	if errors.Is(err, errTooLarge) {
		return nil, errStatus(err)
	}
	if err != nil {
		if plan.Mode == rv.ListContinue {
			return nil, status.Error(codes.OutOfRange, "The provided continue parameter is too old to display a consistent list result. Start a new list without the continue parameter.")
		}
		return nil, status.Errorf(codes.OutOfRange, "too old resource version: %d", atRev)
	}
	resp := &heraldv1.ListResponse{Revision: atRev}
	if req.Name != "" {
		key := rs.res.ObjectKey(req.Namespace, req.Name)
		obj := snap.get(key)
		if obj == nil || !sel.Matches(obj.Namespace, labels.Set(obj.Labels), fields.Set(obj.Fields)) {
			return nil, status.Errorf(codes.NotFound, "%s %q not found", rs.res.ID(), req.Name)
		}
		resp.Items = [][]byte{obj.JSON}
		resp.Keys = []string{key}
		return resp, nil
	}
	from := ""
	if plan.Mode == rv.ListContinue {
		from = plan.Token.Start
	}
	limit = plan.Limit
	var last string
	more := false
	var remaining int64
	snap.scan(prefix, from, func(e *entry) bool {
		if limit > 0 && int64(len(resp.Items)) >= limit {
			// As kube-apiserver's cacher pages: a full page has a
			// continue token when any object follows it, matching or
			// not (so the last page of a selective list may be empty);
			// without selectors, the rest is counted.
			more = true
			if sel.HasSelectors() {
				return false
			}
			remaining++
			return true
		}
		if !sel.Matches(e.obj.Namespace, labels.Set(e.obj.Labels), fields.Set(e.obj.Fields)) {
			return true
		}
		resp.Items = append(resp.Items, e.obj.JSON)
		resp.Keys = append(resp.Keys, e.key)
		last = e.key
		return true
	})
	if more {
		resp.Continue = rv.After(last, atRev).Encode(prefix)
		if !sel.HasSelectors() {
			resp.RemainingItemCount = &remaining
		}
	}
	return resp, nil
}

// Watch serves watch-from-revision, initial state and replays, in the order
// herald.proto gives: it waits until the shard reached the revision the
// request needs, takes the watch's start from the window (the state, the
// window's events and, when following, the subscription, all at once), sends
// it, and then streams the subscriber's queue until the client leaves or the
// window cuts the subscriber off (Aborted: the client resumes from the last
// revision it received).
func (v *Server) Watch(req *heraldv1.WatchRequest, stream heraldv1.Cache_WatchServer) error {
	ctx := stream.Context()
	rs, err := v.resource(ctx, req.Resource)
	if err != nil {
		return err
	}
	if req.Namespace != "" && !rs.res.Namespaced {
		return status.Error(codes.InvalidArgument, "namespace given for a cluster-scoped resource")
	}
	if err := v.s.expiredByGeneration(req); err != nil {
		return err
	}
	v.s.sendExpiredThrough(ctx)
	if err := v.waitForWatch(ctx, req, rs.res.ID()); err != nil {
		return err
	}
	rs = v.s.current(rs)
	sel, err := selector(rs.res, req.Namespace, req.Selector, req.LabelSelector, req.FieldSelector)
	if err != nil {
		return err
	}
	w := &watchSender{stream: stream, sel: sel, omitPrev: req.OmitUnchangedPrev, withProtobuf: req.WithProtobuf}
	var sub *subscriber
	if req.Follow {
		sub = newSubscriber(v.s.cfg.SubscriberBuffer)
		sub.protobuf = req.WithProtobuf
	}
	start, bookmarked, err := v.watchStart(ctx, req, rs, sub, w)
	if err != nil {
		return err
	}
	if sub != nil {
		v.s.m.subs.WithLabelValues(rs.res.ID()).Inc()
		defer func() {
			rs.unsubscribe(sub)
			v.s.m.subs.WithLabelValues(rs.res.ID()).Dec()
		}()
	}
	if err := w.sendStart(start, rs.res.NamespacePrefix(req.Namespace), bookmarked); err != nil {
		return err
	}
	if sub == nil {
		return nil
	}
	return v.follow(ctx, sub, w, start.head)
}

// selector is a request's namespace and selectors: sel as the client parsed
// them when it sent them (checked, not parsed again), else the strings.
// Errors are InvalidArgument statuses.
func selector(r *kube.Resource, namespace string, sel *heraldv1.Selector, labelSelector, fieldSelector string) (*request.Selector, error) {
	var s *request.Selector
	var err error
	if sel != nil {
		s, err = request.NewSelector(r, namespace, requirements(sel.Labels), requirements(sel.Fields))
	} else {
		s, err = request.ParseSelector(r, namespace, labelSelector, fieldSelector)
	}
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return s, nil
}

func requirements(rs []*heraldv1.Requirement) []request.Requirement {
	out := make([]request.Requirement, len(rs))
	for i, r := range rs {
		out[i] = request.Requirement{Key: r.Key, Operator: r.Operator, Values: r.Values}
	}
	return out
}

// waitForWatch waits until the shard has reached the revision req needs:
// the state's (exact, at least min_revision, or etcd's current one) or the
// one it resumes after (for as long as the shard is catching up: see
// waitCatchingUp).
func (v *Server) waitForWatch(ctx context.Context, req *heraldv1.WatchRequest, resource string) error {
	rev := req.AfterRevision
	switch {
	case req.InitialEvents && req.StateRevision > 0:
		rev = req.StateRevision
	case req.InitialEvents:
		rev = req.MinRevision
		if req.Consistent {
			cur, err := v.s.currentRevision(ctx)
			if err != nil {
				return status.Errorf(codes.Unavailable, "reading etcd's revision: %v", err)
			}
			rev = max(rev, cur)
		}
	}
	if rev <= 0 {
		return nil
	}
	if !req.InitialEvents {
		return errStatus(v.s.waitCatchingUp(ctx, rev, resource))
	}
	return errStatus(v.s.waitFor(ctx, rev, resource))
}

// watchStart takes the watch's start from the window and registers sub
// (nil: not following). A revision older than the window is first replayed
// from the stream's retained history up to the window's start (deep resume),
// again as long as the window moves on meanwhile; bookmarked reports that
// the start bookmark went out before that replay. Errors are statuses
// (OutOfRange for a state older than the window, deepReplay's) or the
// stream's.
func (v *Server) watchStart(ctx context.Context, req *heraldv1.WatchRequest, rs *resourceState, sub *subscriber, w *watchSender) (watchStart, bool, error) {
	if req.InitialEvents {
		var rev int64 // 0: the state at the head
		if req.StateRevision > 0 {
			rev = req.StateRevision
		}
		start, err := rs.watchState(rev, v.s.head.Load(), sub)
		return start, false, errStatus(err)
	}
	after := req.AfterRevision
	bookmarked := false
	var release func() // the deep-replay slot, held until the window is reached
	defer func() {
		if release != nil {
			release()
		}
	}()
	for {
		start, err := rs.watchAfter(after, v.s.head.Load(), sub)
		var old *tooOldError
		if !errors.As(err, &old) {
			return start, bookmarked, errStatus(err)
		}
		if !bookmarked {
			if err := w.add(bookmark(after)); err != nil {
				return watchStart{}, false, err
			}
			bookmarked = true
		}
		if release == nil {
			var err error
			if release, err = v.s.deepSlot(ctx, w.flush); err != nil {
				return watchStart{}, false, err
			}
		}
		if err := v.s.deepReplay(ctx, rs, req.Namespace, after, old.start, w.addFiltered); err != nil {
			return watchStart{}, false, err
		}
		after = old.start
	}
}

// follow streams sub's queue, the revisions after last, until the client
// leaves or the window cuts sub off. Whatever is queued when it wakes is
// batched together, so a stream that fell behind catches up in few
// responses.
func (v *Server) follow(ctx context.Context, sub *subscriber, w *watchSender, last int64) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-sub.done():
			reason := "too_slow"
			if errors.Is(sub.err(), errResync) {
				reason = "resync"
			}
			v.s.m.subsCut.WithLabelValues(reason).Inc()
			return status.Error(codes.Aborted, sub.err().Error())
		case evs := <-sub.events():
			for more := true; more; {
				for _, ev := range evs {
					// A bookmark queued before the subscriber's start, or
					// behind an event, says nothing new.
					if ev.Type == heraldv1.EventType_BOOKMARK && ev.Revision <= last {
						continue
					}
					last = max(last, ev.Revision)
					if err := w.addFiltered(ev); err != nil {
						return err
					}
				}
				select {
				case evs = <-sub.events():
				default:
					more = false
				}
			}
			if err := w.flush(); err != nil {
				return err
			}
		}
	}
}

// watchBatch and watchBatchBytes bound a response: at most that many
// events, and it is sent once its objects reach that many bytes; but a
// revision's events are never split. The bytes bound what a reader holds
// per stream however large the objects (a fanout catch-up over two shards
// holds about a response of each, decoded).
const (
	watchBatch      = 256
	watchBatchBytes = 128 << 10
)

// watchSender batches one watch's events into responses. A response never
// splits a revision (herald.proto's contract), except inside the initial
// state: its ADDED events carry their objects' own revisions and are
// followed by a bookmark, so they may be cut anywhere.
type watchSender struct {
	stream       heraldv1.Cache_WatchServer
	sel          *request.Selector // the request's namespace and selectors
	omitPrev     bool              // the request's omit_unchanged_prev
	withProtobuf bool              // the request's with_protobuf
	events       []*heraldv1.Event
	bytes        int // of the events' objects
	inState      bool
}

// add appends ev to the response being built, sending it first when full.
func (w *watchSender) add(e *event) error {
	if n := len(w.events); (n >= watchBatch || w.bytes >= watchBatchBytes) && (w.inState || w.events[n-1].Revision != e.Revision) {
		if err := w.flush(); err != nil {
			return err
		}
	}
	ev := wire(e, w.omitPrev, w.withProtobuf)
	w.events = append(w.events, ev)
	w.bytes += len(ev.Object) + len(ev.PrevObject) + len(ev.ObjectProtobuf)
	return nil
}

// addFiltered adds ev unless it cannot concern the request's watcher (see
// concerns).
func (w *watchSender) addFiltered(ev *event) error {
	if !w.concerns(ev) {
		return nil
	}
	return w.add(ev)
}

// concerns reports whether a watcher with the request's namespace and
// selectors can see ev: bookmarks always, an event whose object matches,
// and a MODIFIED whose previous object matched (the watcher sees the object
// leave its selection as DELETED). The watcher decides the transition.
func (w *watchSender) concerns(ev *event) bool {
	switch {
	case ev.Type == heraldv1.EventType_BOOKMARK:
		return true
	case w.sel.Matches(ev.Namespace, ev.LabelPairs(), ev.FieldPairs()):
		return true
	}
	return ev.Type == heraldv1.EventType_MODIFIED && !ev.PrevUnchanged && w.sel.Matches(ev.Namespace, ev.PrevLabelPairs(), ev.PrevFieldPairs())
}

// flush sends the response being built, if it holds anything.
func (w *watchSender) flush() error {
	if len(w.events) == 0 {
		return nil
	}
	err := w.stream.Send(&heraldv1.WatchResponse{Events: w.events})
	w.events, w.bytes = nil, 0
	return err
}

// sendStart sends what a watch begins with: the state's ADDED events (under
// prefix) and a bookmark at its revision, or a bookmark at the revision it
// resumes after (unless a deep replay sent it); then the window's events and
// a bookmark at the window's head, after which everything up to the head
// has been sent.
func (w *watchSender) sendStart(start watchStart, prefix string, bookmarked bool) error {
	if start.state != nil {
		w.inState = true
		var err error
		start.state.scan(prefix, "", func(e *entry) bool {
			if !w.sel.Matches(e.obj.Namespace, labels.Set(e.obj.Labels), fields.Set(e.obj.Fields)) {
				return true
			}
			err = w.add(wireEvent(&heraldv1.Event{Type: heraldv1.EventType_ADDED, Revision: e.obj.Rev, Namespace: e.obj.Namespace,
				Name: e.obj.Name, Object: e.obj.JSON, Labels: heraldv1.SortedPairs(e.obj.Labels), Fields: heraldv1.SortedPairs(e.obj.Fields)}))
			return err == nil
		})
		if err != nil {
			return err
		}
		w.inState = false
	}
	if start.state != nil || !bookmarked {
		if err := w.add(bookmark(start.from)); err != nil {
			return err
		}
	}
	for _, ev := range start.events {
		if err := w.addFiltered(ev); err != nil {
			return err
		}
	}
	if err := w.add(bookmark(start.head)); err != nil {
		return err
	}
	return w.flush()
}

func bookmark(rev int64) *event {
	return wireEvent(&heraldv1.Event{Type: heraldv1.EventType_BOOKMARK, Revision: rev})
}
