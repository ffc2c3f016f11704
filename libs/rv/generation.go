package rv

import "strconv"

// ExpiredThroughHeader is the gRPC response header of a cache Watch that
// carries the generation's floor: the highest revision of an etcd history
// the stream discarded (etcd replaced or restored from a snapshot; see
// libs/stream's generations). A resourceVersion up to it may name a state
// of that other history, so a watch from it is expired (410), never served
// events of the current history. Absent or 0: no floor.
const ExpiredThroughHeader = "herald-expired-through"

// FormatExpiredThrough is the header's value for floor.
func FormatExpiredThrough(floor int64) string { return strconv.FormatInt(floor, 10) }

// ParseExpiredThrough reads the header's values (the highest valid one;
// 0 when none is).
func ParseExpiredThrough(values []string) int64 {
	var floor int64
	for _, v := range values {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > floor {
			floor = n
		}
	}
	return floor
}
