package cache

import (
	"container/list"
	"context"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"herald.dev/libs/kube"
)

// historyDecoder decodes the values deep replays read from the stream and
// remembers the most recently used ones. A value at a key and revision is
// one object whichever replay meets it (etcd keeps one value per key and
// revision, and a decoded object is never changed), and the replays of a
// wave of resumes run side by side (--deep-replay.concurrency at a time)
// over the same records: each value is decoded once for all of them rather
// than once per replay, which is most of a replay's CPU. It holds at most
// about max bytes of objects (least recently used dropped first); it is
// safe for concurrent use.
type historyDecoder struct {
	dec     *kube.Decoder
	max     int
	lookups *prometheus.CounterVec // by result: hit, miss

	mu    sync.Mutex
	size  int
	order *list.List // of *historyEntry, most recently used first
	byKey map[historyKey]*list.Element
}

// historyKey: a value is one object per resource that reads it (a custom
// resource's objects read anew when its CRD's schemas change: a new
// *kube.Resource, see kube.SameObjects).
type historyKey struct {
	res *kube.Resource
	key string
	rev int64
}

type historyEntry struct {
	k    historyKey
	obj  *kube.Object
	cost int
}

// objectOverhead approximates what an object and its entry cost beyond
// their JSON, labels and fields; mapEntryOverhead, what a map entry costs
// beyond its key and value.
const (
	objectOverhead   = 256
	mapEntryOverhead = 64
)

// objectCost approximates the heap an object holds.
func objectCost(o *kube.Object) int {
	n := len(o.JSON) + objectOverhead
	for _, m := range []map[string]string{o.Labels, o.Fields} {
		for k, v := range m {
			n += len(k) + len(v) + mapEntryOverhead
		}
	}
	return n
}

func newHistoryDecoder(dec *kube.Decoder, max int, lookups *prometheus.CounterVec) *historyDecoder {
	return &historyDecoder{dec: dec, max: max, lookups: lookups, order: list.New(), byKey: map[historyKey]*list.Element{}}
}

// Decode is kube.Decoder's, remembered by key and revision. Values that do
// not decode are not remembered (they are rare, and skipped).
func (h *historyDecoder) Decode(ctx context.Context, r *kube.Resource, key, namespace, name string, value []byte, rev int64) (*kube.Object, error) {
	k := historyKey{res: r, key: key, rev: rev}
	h.mu.Lock()
	if e, ok := h.byKey[k]; ok {
		h.order.MoveToFront(e)
		obj := e.Value.(*historyEntry).obj
		h.mu.Unlock()
		h.lookups.WithLabelValues("hit").Inc()
		return obj, nil
	}
	h.mu.Unlock()
	h.lookups.WithLabelValues("miss").Inc()
	obj, err := h.dec.Decode(ctx, r, key, namespace, name, value, rev)
	if err != nil {
		return nil, err
	}
	cost := objectCost(obj)
	if cost > h.max {
		return obj, nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if e, ok := h.byKey[k]; ok { // another replay decoded it meanwhile
		return e.Value.(*historyEntry).obj, nil
	}
	h.byKey[k] = h.order.PushFront(&historyEntry{k: k, obj: obj, cost: cost})
	h.size += cost
	for h.size > h.max {
		old := h.order.Remove(h.order.Back()).(*historyEntry)
		delete(h.byKey, old.k)
		h.size -= old.cost
	}
	return obj, nil
}
