// Package cacheclient owns talking to the cache shards of a resource as if
// they were one cache: Sharded is a heraldv1.CacheClient over every shard,
// so frontdoor and fanout (and their tests) cannot tell one cache from many,
// as Kubernetes' cacher cannot be told from the etcd storage it decorates.
//
// The shard-merge rule lives here and nowhere else:
//   - A request for one namespace, or for a resource that is not split, goes
//     to the one shard that owns it, unchanged.
//   - A cluster-wide LIST or initial state of a split resource is one
//     consistent snapshot: the first shard resolves the request's revision
//     semantics (consistent, not older than, exact, continue), the others
//     then serve exactly that revision, and the union is merged in key order
//     (LIST) or concatenated (state).
//   - A watch over several shards delivers events in revision order, each
//     once: an event is released only when every shard has sent everything
//     up to its revision (each shard's "through"); a bookmark then says how
//     far the merged stream is complete.
//   - A following watch survives a shard's broken stream: the shard is
//     resumed after its own "through", so nothing is lost or repeated; only
//     a shard that cannot resume (OutOfRange) ends the merged stream.
//   - What a following watch holds back for a lagging shard is bounded
//     (MergeLimits, in events and bytes): past the bound the merged stream
//     ends with a *LagError rather than grow; the caller starts over and its
//     clients resume from their resourceVersions.
//
// It keeps no state between calls beyond its connections, and never blocks
// a shard's stream on another's except to hold back what cannot be released
// yet.
package cacheclient
