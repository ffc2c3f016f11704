package cacheclient

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/rv"
)

// A merged watch stream passes on the highest generation floor its shards'
// streams announced (libs/rv's ExpiredThroughHeader): Header returns it once
// the stream has delivered its opening bookmark, by which time every shard's
// stream has sent its headers.

// noteExpiredThrough records the floor a shard's stream announces.
func (s *stream) noteExpiredThrough(st grpc.ServerStreamingClient[heraldv1.WatchResponse]) {
	md, err := st.Header()
	if err != nil {
		return
	}
	floor := rv.ParseExpiredThrough(md.Get(rv.ExpiredThroughHeader))
	for {
		old := s.expiredThrough.Load()
		if floor <= old || s.expiredThrough.CompareAndSwap(old, floor) {
			return
		}
	}
}

// header is the merged stream's response header.
func (s *stream) header() metadata.MD {
	if floor := s.expiredThrough.Load(); floor > 0 {
		return metadata.Pairs(rv.ExpiredThroughHeader, rv.FormatExpiredThrough(floor))
	}
	return metadata.MD{}
}
