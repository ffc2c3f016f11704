package cacheclient

import (
	"herald.dev/libs/kube/request"
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// Selector is sel's label and field selectors as a ListRequest or
// WatchRequest carries them parsed (herald.proto's Selector): the cache
// checks them against the resource but parses no string. A request sets
// them together with the strings (sel.Labels.String(),
// sel.Fields.String()), which a cache older than the field reads instead.
func Selector(sel *request.Selector) *heraldv1.Selector {
	lbls, flds := sel.Requirements()
	return &heraldv1.Selector{Labels: requirements(lbls), Fields: requirements(flds)}
}

func requirements(rs []request.Requirement) []*heraldv1.Requirement {
	out := make([]*heraldv1.Requirement, len(rs))
	for i, r := range rs {
		out[i] = &heraldv1.Requirement{Key: r.Key, Operator: r.Operator, Values: r.Values}
	}
	return out
}
