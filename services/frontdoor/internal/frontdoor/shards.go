package frontdoor

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/rv"
)

// ShardedCache is a heraldv1.CacheClient over all cache shards: it sends
// each LIST to the shard owning the resource and namespace, and answers a
// cluster-wide LIST of a split resource by merging its shards' pages at one
// revision. Callers cannot tell it from a single cache.
type ShardedCache struct {
	reg    *kube.Registry
	shards *kube.ShardMap
	byTgt  map[string]heraldv1.CacheClient
}

// NewShardedCache builds the client; clients maps every target of the shard
// map to a connection.
func NewShardedCache(reg *kube.Registry, shards *kube.ShardMap, clients map[string]heraldv1.CacheClient) *ShardedCache {
	return &ShardedCache{reg: reg, shards: shards, byTgt: clients}
}

// Watch is not used by frontdoor: watches go to fanout.
func (c *ShardedCache) Watch(context.Context, *heraldv1.WatchRequest, ...grpc.CallOption) (grpc.ServerStreamingClient[heraldv1.WatchResponse], error) {
	return nil, status.Error(codes.Unimplemented, "frontdoor does not watch caches")
}

// List routes or merges one LIST.
func (c *ShardedCache) List(ctx context.Context, req *heraldv1.ListRequest, opts ...grpc.CallOption) (*heraldv1.ListResponse, error) {
	r, ok := c.reg.ByID(req.Resource)
	if !ok {
		return nil, status.Errorf(codes.NotFound, "the server could not find the requested resource %q", req.Resource)
	}
	if req.Namespace != "" || !r.Namespaced {
		return c.byTgt[c.shards.For(r, req.Namespace).Target].List(ctx, req, opts...)
	}
	shards := c.shards.All(r)
	if len(shards) == 1 {
		return c.byTgt[shards[0].Target].List(ctx, req, opts...)
	}
	// The first shard resolves the request's revision semantics (consistent,
	// not older than, exact, continue); the others then serve exactly that
	// revision, so the union is one consistent list.
	first, err := c.byTgt[shards[0].Target].List(ctx, req, opts...)
	if err != nil {
		return nil, err
	}
	pages := []*heraldv1.ListResponse{first}
	for _, sh := range shards[1:] {
		sub := &heraldv1.ListRequest{Resource: req.Resource, LabelSelector: req.LabelSelector, FieldSelector: req.FieldSelector, Limit: req.Limit}
		if req.Continue != "" {
			sub.Continue = req.Continue
		} else {
			sub.ResourceVersion, sub.ResourceVersionMatch = rv.Format(first.Revision), string(rv.MatchExact)
		}
		page, err := c.byTgt[sh.Target].List(ctx, sub, opts...)
		if err != nil {
			return nil, err
		}
		pages = append(pages, page)
	}
	return mergePages(pages, req.Limit, req.Continue == "" && req.ResourceVersion == "0"), nil
}

// mergePages merges shard pages (each in key order) into one page of at most
// limit items. ignoreLimit mirrors resourceVersion=0, where shards ignore it.
func mergePages(pages []*heraldv1.ListResponse, limit int64, ignoreLimit bool) *heraldv1.ListResponse {
	out := &heraldv1.ListResponse{Revision: pages[0].Revision}
	idx := make([]int, len(pages))
	var remaining int64
	counted := true
	more := false
	for {
		best := -1
		for i, p := range pages {
			if idx[i] < len(p.Keys) && (best < 0 || p.Keys[idx[i]] < pages[best].Keys[idx[best]]) {
				best = i
			}
		}
		if best < 0 {
			break
		}
		if limit > 0 && !ignoreLimit && int64(len(out.Items)) >= limit {
			more = true
			break
		}
		out.Items = append(out.Items, pages[best].Items[idx[best]])
		out.Keys = append(out.Keys, pages[best].Keys[idx[best]])
		idx[best]++
	}
	for i, p := range pages {
		left := int64(len(p.Keys) - idx[i])
		if p.Continue != "" {
			more = true
			if p.RemainingItemCount == nil {
				counted = false
			} else {
				left += *p.RemainingItemCount
			}
		}
		remaining += left
	}
	if more && len(out.Keys) > 0 {
		out.Continue = rv.Token{Rev: out.Revision, After: out.Keys[len(out.Keys)-1]}.Encode()
		if counted && pages[0].RemainingItemCount != nil || counted && anyCounted(pages) {
			out.RemainingItemCount = &remaining
		}
	}
	return out
}

func anyCounted(pages []*heraldv1.ListResponse) bool {
	for _, p := range pages {
		if p.RemainingItemCount != nil {
			return true
		}
	}
	return false
}
