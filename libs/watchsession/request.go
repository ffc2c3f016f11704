package watchsession

import (
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"

	"herald.dev/libs/kube/request"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/rv"
)

// NewRequest is the stream request of a watch frontdoor parsed and
// validated (request.ParseWatch): the resource, the selector's requirements
// and where the watch starts, as parsed. Accept, AcceptGzip and TraceEvents
// are the caller's to set.
func NewRequest(info request.Info, wr *request.WatchRequest) *heraldv1.WatchStreamRequest {
	r := info.Resource
	req := &heraldv1.WatchStreamRequest{Group: r.Group, Version: r.Version, Resource: r.Plural,
		Namespace: info.Namespace, Name: info.Name,
		Revision: wr.Plan.Rev, Consistent: wr.Plan.Consistent, InitialEventsEnd: wr.Plan.InitialEventsEnd,
		AllowWatchBookmarks: wr.AllowWatchBookmarks, TimeoutSeconds: wr.TimeoutSeconds}
	switch wr.Plan.Mode {
	case rv.WatchFromState:
		req.Start = heraldv1.WatchStreamRequest_FROM_STATE
	case rv.WatchAfter:
		req.Start = heraldv1.WatchStreamRequest_AFTER
	case rv.WatchFromNow:
		req.Start = heraldv1.WatchStreamRequest_FROM_NOW
	}
	if reqs, ok := wr.Selector.Labels.Requirements(); ok {
		for _, lr := range reqs {
			req.LabelRequirements = append(req.LabelRequirements, &heraldv1.WatchStreamRequest_LabelRequirement{
				Key: lr.Key(), Operator: string(lr.Operator()), Values: lr.ValuesUnsorted()})
		}
	}
	for _, fr := range wr.Selector.Fields.Requirements() {
		req.FieldRequirements = append(req.FieldRequirements, &heraldv1.WatchStreamRequest_FieldRequirement{
			Field: fr.Field, Operator: string(fr.Operator), Value: fr.Value})
	}
	return req
}

// WatchOf is the watch of a stream request: the selector built from its
// requirements, the plan from where it starts. Frontdoor validated it; an
// error here is a request no frontdoor sends (400).
func WatchOf(req *heraldv1.WatchStreamRequest) (*request.WatchRequest, error) {
	ls := labels.NewSelector()
	for _, lr := range req.LabelRequirements {
		r, err := labels.NewRequirement(lr.Key, selection.Operator(lr.Operator), lr.Values)
		if err != nil {
			return nil, apierrors.NewBadRequest(err.Error())
		}
		ls = ls.Add(*r)
	}
	terms := make([]fields.Selector, 0, len(req.FieldRequirements))
	for _, fr := range req.FieldRequirements {
		switch selection.Operator(fr.Operator) {
		case selection.Equals, selection.DoubleEquals:
			terms = append(terms, fields.OneTermEqualSelector(fr.Field, fr.Value))
		case selection.NotEquals:
			terms = append(terms, fields.OneTermNotEqualSelector(fr.Field, fr.Value))
		default:
			return nil, apierrors.NewBadRequest(fmt.Sprintf("field requirement %s: operator %q", fr.Field, fr.Operator))
		}
	}
	fs := fields.Everything()
	if len(terms) > 0 {
		fs = fields.AndSelectors(terms...)
	}
	wr := &request.WatchRequest{LabelSelector: ls.String(), FieldSelector: fs.String(),
		AllowWatchBookmarks: req.AllowWatchBookmarks, TimeoutSeconds: req.TimeoutSeconds,
		Selector: &request.Selector{Namespace: req.Namespace, Labels: ls, Fields: fs, Empty: ls.Empty() && fs.Empty()},
		Plan:     rv.WatchPlan{Rev: req.Revision, Consistent: req.Consistent, InitialEventsEnd: req.InitialEventsEnd}}
	switch req.Start {
	case heraldv1.WatchStreamRequest_FROM_STATE:
		wr.Plan.Mode = rv.WatchFromState
	case heraldv1.WatchStreamRequest_AFTER:
		wr.Plan.Mode = rv.WatchAfter
	case heraldv1.WatchStreamRequest_FROM_NOW:
		wr.Plan.Mode = rv.WatchFromNow
	default:
		return nil, apierrors.NewBadRequest(fmt.Sprintf("watch start %v", req.Start))
	}
	return wr, nil
}
