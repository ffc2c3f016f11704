package cache

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"herald.dev/libs/kube"
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
	case errors.Is(err, errTooLarge):
		return status.Error(codes.DeadlineExceeded, "Too large resource version: the cache has not reached it yet")
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

func (v *Server) resource(id string) (*resourceState, error) {
	if !v.s.ready.Load() {
		return nil, status.Error(codes.Unavailable, "the cache is not ready")
	}
	r, ok := v.s.reg.ByID(id)
	if !ok {
		return nil, status.Errorf(codes.NotFound, "the server could not find the requested resource %q", id)
	}
	rs, ok := v.s.resources[r.ID()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "resource %q is not served by this shard", id)
	}
	return rs, nil
}

// List serves LIST and GET.
func (v *Server) List(ctx context.Context, req *heraldv1.ListRequest) (*heraldv1.ListResponse, error) {
	start := time.Now()
	rs, err := v.resource(req.Resource)
	if err != nil {
		return nil, err
	}
	defer func() { v.s.m.listTime.WithLabelValues(rs.res.ID()).Observe(time.Since(start).Seconds()) }()
	v.s.m.lists.WithLabelValues(rs.res.ID()).Inc()
	plan, err := rv.PlanList(req.ResourceVersion, req.ResourceVersionMatch, req.Continue, req.Limit)
	if err != nil {
		return nil, errStatus(err)
	}
	sel, err := kube.ParseSelector(rs.res, req.Namespace, req.LabelSelector, req.FieldSelector)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if req.Name != "" {
		// GET: one object, same revision rules; limit and continue do not apply.
		plan.Limit = 0
		if plan.Mode == rv.ListContinue {
			return nil, status.Error(codes.InvalidArgument, "continue is not allowed for a single object")
		}
	}
	var atRev int64
	switch plan.Mode {
	case rv.ListConsistent:
		cur, err := v.s.currentRevision(ctx)
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "reading etcd's revision: %v", err)
		}
		if err := v.s.waitFor(ctx, cur, rs.res.ID()); err != nil {
			if errors.Is(err, errTooLarge) {
				return nil, status.Error(codes.DeadlineExceeded, "Timeout: the cache did not reach etcd's current revision in time")
			}
			return nil, errStatus(err)
		}
	case rv.ListNotOlderThan, rv.ListExact:
		if err := v.s.waitFor(ctx, plan.Rev, rs.res.ID()); err != nil {
			return nil, errStatus(err)
		}
		if plan.Mode == rv.ListExact {
			atRev = plan.Rev
		}
	case rv.ListContinue:
		atRev = plan.Token.Rev
	}
	head := v.s.head.Load()
	if atRev == 0 {
		atRev = head
	}
	t, ok := rs.stateAt(atRev, head)
	if !ok {
		if plan.Mode == rv.ListContinue {
			return nil, status.Error(codes.OutOfRange, "The provided continue parameter is too old to display a consistent list result. Start a new list without the continue parameter.")
		}
		return nil, status.Errorf(codes.OutOfRange, "too old resource version: %d", atRev)
	}
	resp := &heraldv1.ListResponse{Revision: atRev}
	if req.Name != "" {
		key := rs.res.ObjectKey(req.Namespace, req.Name)
		e, found := t.Get(&entry{key: key})
		if !found || !sel.Matches(e.obj.Namespace, e.obj.Labels, e.obj.Fields) {
			return nil, status.Errorf(codes.NotFound, "%s %q not found", rs.res.ID(), req.Name)
		}
		resp.Items = [][]byte{e.obj.JSON}
		resp.Keys = []string{key}
		return resp, nil
	}
	after := ""
	if plan.Mode == rv.ListContinue {
		after = plan.Token.After
	}
	limit := plan.Limit
	var last string
	more := false
	var remaining int64
	scan(t, rs.res.NamespacePrefix(req.Namespace), after, func(e *entry) bool {
		if !sel.Matches(e.obj.Namespace, e.obj.Labels, e.obj.Fields) {
			return true
		}
		if limit > 0 && int64(len(resp.Items)) >= limit {
			more = true
			if sel.HasSelectors() {
				return false
			}
			remaining++
			return true
		}
		resp.Items = append(resp.Items, e.obj.JSON)
		resp.Keys = append(resp.Keys, e.key)
		last = e.key
		return true
	})
	if more {
		resp.Continue = rv.Token{Rev: atRev, After: last}.Encode()
		if !sel.HasSelectors() {
			resp.RemainingItemCount = &remaining
		}
	}
	return resp, nil
}

// Watch serves watch-from-revision, initial state and replays.
func (v *Server) Watch(req *heraldv1.WatchRequest, stream heraldv1.Cache_WatchServer) error {
	ctx := stream.Context()
	rs, err := v.resource(req.Resource)
	if err != nil {
		return err
	}
	if req.Namespace != "" && !rs.res.Namespaced {
		return status.Error(codes.InvalidArgument, "namespace given for a cluster-scoped resource")
	}
	sel := kube.Everything(req.Namespace)
	prefix := rs.res.NamespacePrefix(req.Namespace)

	if req.InitialEvents && req.StateRevision > 0 {
		if err := v.s.waitFor(ctx, req.StateRevision, rs.res.ID()); err != nil {
			return errStatus(err)
		}
	} else if req.InitialEvents {
		min := req.MinRevision
		if req.Consistent {
			cur, err := v.s.currentRevision(ctx)
			if err != nil {
				return status.Errorf(codes.Unavailable, "reading etcd's revision: %v", err)
			}
			min = max(min, cur)
		}
		if err := v.s.waitFor(ctx, min, rs.res.ID()); err != nil {
			return errStatus(err)
		}
	} else if req.AfterRevision > 0 {
		if err := v.s.waitFor(ctx, req.AfterRevision, rs.res.ID()); err != nil {
			return errStatus(err)
		}
	}

	// Responses hold up to batch events and never split a revision
	// (initial ADDED events carry their objects' own revisions and are
	// followed by a bookmark, so they may be cut anywhere).
	const batch = 256
	out := &heraldv1.WatchResponse{}
	flush := func() error {
		if len(out.Events) == 0 {
			return nil
		}
		err := stream.Send(out)
		out = &heraldv1.WatchResponse{}
		return err
	}
	inState := false
	add := func(ev *heraldv1.Event) error {
		if n := len(out.Events); n >= batch && (inState || out.Events[n-1].Revision != ev.Revision) {
			if err := flush(); err != nil {
				return err
			}
		}
		out.Events = append(out.Events, ev)
		return nil
	}
	// Take what must be replayed and register for what follows, atomically.
	// A revision older than the window is first replayed from the stream's
	// retained history up to the window's start (deep resume), then the
	// window takes over.
	var sub *subscriber
	var replay []*heraldv1.Event
	var state *tree
	var stateRev int64
	after := req.AfterRevision
	sentStart := false
	var head int64
	for {
		rs.mu.Lock()
		if req.InitialEvents || after == 0 || after >= rs.windowStart {
			break
		}
		windowStart := rs.windowStart
		rs.mu.Unlock()
		if !sentStart {
			if err := add(&heraldv1.Event{Type: heraldv1.EventType_BOOKMARK, Revision: after}); err != nil {
				return err
			}
			sentStart = true
		}
		if err := v.s.deepReplay(ctx, rs, req.Namespace, after, windowStart, add); err != nil {
			return err
		}
		after = windowStart
	}
	head = v.s.head.Load()
	if len(rs.window) > 0 {
		head = max(head, rs.window[len(rs.window)-1].rev)
	}
	switch {
	case req.InitialEvents && req.StateRevision > 0:
		stateRev = req.StateRevision
		t, ok := rs.stateAtLocked(stateRev, head)
		if !ok {
			oldest := rs.windowStart + 1
			rs.mu.Unlock()
			return status.Error(codes.OutOfRange, fmt.Sprintf("too old resource version: %d (%d)", stateRev, oldest))
		}
		state = t
		replay, _ = rs.since(stateRev)
	case req.InitialEvents:
		state = rs.state.Clone()
		stateRev = head
	case after == 0:
		after = head
	default:
		evs, ok := rs.since(after)
		if !ok {
			oldest := rs.windowStart + 1
			rs.mu.Unlock()
			return status.Error(codes.OutOfRange, fmt.Sprintf("too old resource version: %d (%d)", after, oldest))
		}
		replay = evs
	}
	if req.Follow {
		sub = newSubscriber(v.s.cfg.SubscriberBuffer)
		rs.subs[sub] = struct{}{}
		v.s.m.subs.WithLabelValues(rs.res.ID()).Inc()
	}
	rs.mu.Unlock()
	inState = state != nil
	if sub != nil {
		defer func() {
			rs.mu.Lock()
			delete(rs.subs, sub)
			rs.mu.Unlock()
			v.s.m.subs.WithLabelValues(rs.res.ID()).Dec()
		}()
	}

	if state != nil {
		var sendErr error
		scan(state, prefix, "", func(e *entry) bool {
			sendErr = add(&heraldv1.Event{Type: heraldv1.EventType_ADDED, Revision: e.obj.Rev, Namespace: e.obj.Namespace,
				Name: e.obj.Name, Object: e.obj.JSON, Labels: e.obj.Labels, Fields: e.obj.Fields})
			return sendErr == nil
		})
		if sendErr != nil {
			return sendErr
		}
		inState = false
		if err := add(&heraldv1.Event{Type: heraldv1.EventType_BOOKMARK, Revision: stateRev}); err != nil {
			return err
		}
		for _, ev := range replay {
			if err := add(ev); err != nil {
				return err
			}
		}
	} else {
		if !sentStart {
			if err := add(&heraldv1.Event{Type: heraldv1.EventType_BOOKMARK, Revision: after}); err != nil {
				return err
			}
		}
		for _, ev := range replay {
			if !sel.Matches(ev.Namespace, nil, nil) {
				continue
			}
			if err := add(ev); err != nil {
				return err
			}
		}
	}
	if err := add(&heraldv1.Event{Type: heraldv1.EventType_BOOKMARK, Revision: head}); err != nil {
		return err
	}
	if err := flush(); err != nil {
		return err
	}
	if sub == nil {
		return nil
	}
	last := head
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-sub.done:
			reason := "too_slow"
			if errors.Is(sub.err, errResync) {
				reason = "resync"
			}
			v.s.m.subsCut.WithLabelValues(reason).Inc()
			return status.Error(codes.Aborted, sub.err.Error())
		case evs := <-sub.ch:
			for more := true; more; {
				for _, ev := range evs {
					if ev.Revision <= last && ev.Type == heraldv1.EventType_BOOKMARK {
						continue
					}
					if ev.Type != heraldv1.EventType_BOOKMARK && !sel.Matches(ev.Namespace, nil, nil) {
						continue
					}
					last = max(last, ev.Revision)
					if err := add(ev); err != nil {
						return err
					}
				}
				select {
				case evs = <-sub.ch:
				default:
					more = false
				}
			}
			if err := flush(); err != nil {
				return err
			}
		}
	}
}
