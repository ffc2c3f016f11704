package cache

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Replays meeting the same value get the same object, decoded once; the
// remembered objects stay within their byte bound, least recently used
// dropped first; an undecodable value is an error every time.
func TestHistoryDecoder(t *testing.T) {
	dec, err := testDecoder()
	if err != nil {
		t.Fatal(err)
	}
	r := pods(t)
	lookups := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lookups"}, []string{"result"})
	value := func(name string) []byte {
		return fmt.Appendf(nil, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":%q,"namespace":"a"}}`, name)
	}
	one, err := dec.Decode(t.Context(), r, r.ObjectKey("a", "p0"), "a", "p0", value("p0"), 10)
	if err != nil {
		t.Fatal(err)
	}
	h := newHistoryDecoder(dec, 3*objectCost(one), lookups) // room for three objects

	decode := func(name string, rev int64) any {
		t.Helper()
		o, err := h.Decode(t.Context(), r, r.ObjectKey("a", name), "a", name, value(name), rev)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	first := decode("p0", 10)
	if decode("p0", 10) != first {
		t.Error("the same value at the same revision decoded twice")
	}
	if decode("p0", 11) == first {
		t.Error("another revision of the key got the same object")
	}
	decode("p1", 10)
	decode("p0", 10) // used: p0@11 is now the least recently used
	decode("p2", 10) // evicts p0@11
	if h.size > h.max || len(h.byKey) != 3 {
		t.Errorf("%d objects, %d bytes; want 3, at most %d", len(h.byKey), h.size, h.max)
	}
	if decode("p0", 10) != first {
		t.Error("a recently used object was dropped")
	}
	hits, misses := testutil.ToFloat64(lookups.WithLabelValues("hit")), testutil.ToFloat64(lookups.WithLabelValues("miss"))
	if hits != 3 || misses != 4 {
		t.Errorf("%v hits, %v misses; want 3, 4", hits, misses)
	}
	if _, err := h.Decode(t.Context(), r, r.ObjectKey("a", "bad"), "a", "bad", []byte("not json"), 12); err == nil {
		t.Error("an undecodable value decoded")
	}
}
