package fanout

import (
	"google.golang.org/grpc"

	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/rv"
)

// expiredThrough is the generation floor the caches announce on the hub's
// upstream (libs/rv's ExpiredThroughHeader), read once the stream has
// delivered its opening bookmark. After etcd was replaced or restored from
// an older snapshot, the current history's revisions may repeat revisions
// of the discarded one: a watcher resuming from one of those must not join
// the shared stream (its events are of the other history); it is sent to
// the caches, which answer 410 Expired.
func expiredThrough(st grpc.ServerStreamingClient[heraldv1.WatchResponse]) int64 {
	md, err := st.Header()
	if err != nil {
		return 0
	}
	return rv.ParseExpiredThrough(md.Get(rv.ExpiredThroughHeader))
}
