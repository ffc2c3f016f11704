package cacheclient

import (
	"context"
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/rv"
)

// Sharded is a heraldv1.CacheClient over all cache shards of a shard map.
type Sharded struct {
	reg    *kube.Registry
	shards *kube.ShardMap
	byTgt  map[string]heraldv1.CacheClient
	clock  clock.Clock
	log    *slog.Logger
	limits MergeLimits
}

// MergeLimits bound what a following watch over several shards holds back
// while one shard lags behind the others: past either, the watch ends with
// a *LagError.
type MergeLimits struct {
	Events int
	Bytes  int64
}

// DefaultMergeLimits are the limits unless WithMergeLimits: at 1 KB an
// event, about 100 MB, some minutes of a busy resource.
func DefaultMergeLimits() MergeLimits { return MergeLimits{Events: 100_000, Bytes: 256 << 20} }

var _ heraldv1.CacheClient = (*Sharded)(nil)

// Option configures a Sharded beyond its shards.
type Option func(*Sharded)

// WithClock sets the clock that paces the resumption of a shard's broken
// stream (default: the real one).
func WithClock(c clock.Clock) Option { return func(s *Sharded) { s.clock = c } }

// WithLogger sets where a shard's broken stream is reported (default:
// nowhere).
func WithLogger(l *slog.Logger) Option { return func(s *Sharded) { s.log = l } }

// WithMergeLimits bounds what a merged following watch holds back for a
// lagging shard (default: DefaultMergeLimits()).
func WithMergeLimits(l MergeLimits) Option { return func(s *Sharded) { s.limits = l } }

// New builds the client; clients maps every target of the shard map to a
// connection.
func New(reg *kube.Registry, shards *kube.ShardMap, clients map[string]heraldv1.CacheClient, opts ...Option) *Sharded {
	s := &Sharded{reg: reg, shards: shards, byTgt: clients, clock: clock.RealClock{}, log: slog.New(slog.DiscardHandler), limits: DefaultMergeLimits()}
	for _, o := range opts {
		o(s)
	}
	return s
}

// route returns the shards serving resource id in namespace: the owning one
// for a namespace or an unsplit resource, else all of them.
func (c *Sharded) route(id, namespace string) ([]heraldv1.CacheClient, error) {
	r, ok := c.reg.ByID(id)
	if !ok {
		return nil, status.Errorf(codes.NotFound, "the server could not find the requested resource %q", id)
	}
	if namespace != "" || !r.Namespaced {
		return []heraldv1.CacheClient{c.byTgt[c.shards.For(r, namespace).Target]}, nil
	}
	var out []heraldv1.CacheClient
	for _, sh := range c.shards.All(r) {
		out = append(out, c.byTgt[sh.Target])
	}
	return out, nil
}

// List routes or merges one LIST.
func (c *Sharded) List(ctx context.Context, req *heraldv1.ListRequest, opts ...grpc.CallOption) (*heraldv1.ListResponse, error) {
	clients, err := c.route(req.Resource, req.Namespace)
	if err != nil {
		return nil, err
	}
	first, err := clients[0].List(ctx, req, opts...)
	if err != nil || len(clients) == 1 {
		return first, err
	}
	// The first shard resolves the request's revision semantics; the
	// others then serve exactly that revision (a continue token carries it),
	// so the union is one consistent list.
	r, ok := c.reg.ByID(req.Resource)
	if !ok { // a custom resource gone since route
		return nil, status.Errorf(codes.NotFound, "the server could not find the requested resource %q", req.Resource)
	}
	prefix := r.NamespacePrefix(req.Namespace)
	pages := []*heraldv1.ListResponse{first}
	for _, sh := range clients[1:] {
		sub := &heraldv1.ListRequest{Resource: req.Resource, LabelSelector: req.LabelSelector, FieldSelector: req.FieldSelector,
			Selector: req.Selector, Limit: req.Limit}
		if req.Continue != "" {
			// The first shard read the token; a token without a revision
			// (the latest state) gets the first shard's.
			tok, err := rv.DecodeToken(req.Continue, prefix)
			if err != nil {
				return nil, status.Error(codes.InvalidArgument, err.Error())
			}
			sub.Continue = rv.Token{Rev: first.Revision, Start: tok.Start}.Encode(prefix)
		} else {
			sub.ResourceVersion, sub.ResourceVersionMatch = rv.Format(first.Revision), string(rv.MatchExact)
		}
		page, err := sh.List(ctx, sub, opts...)
		if err != nil {
			return nil, err
		}
		pages = append(pages, page)
	}
	// Shards ignore the limit at resourceVersion=0, except for a resource
	// kube-apiserver does not watch-cache (it lists those from etcd).
	ignoreLimit := req.Continue == "" && req.ResourceVersion == "0"
	if r.Stored().NotWatchCached {
		ignoreLimit = false
	}
	return mergePages(pages, req.Limit, ignoreLimit, prefix), nil
}

// mergePages merges shard pages (each in key order) into one page of at most
// limit items. ignoreLimit mirrors resourceVersion=0, where shards ignore it.
// prefix is the listed keys' (the continue token's).
func mergePages(pages []*heraldv1.ListResponse, limit int64, ignoreLimit bool, prefix string) *heraldv1.ListResponse {
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
		out.Continue = rv.After(out.Keys[len(out.Keys)-1], out.Revision).Encode(prefix)
		if counted && anyCounted(pages) {
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
