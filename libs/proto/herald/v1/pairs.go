package heraldv1

import (
	"slices"
	"strings"
)

// Pairs is an Event's labels or fields read as k8s.io/apimachinery's
// labels.Labels and fields.Fields read a set (Has, Get), so that a selector
// matches the pairs as decoded, with no map built per event per watcher.
// Lookups scan linearly: an object carries a handful of labels and at most
// a dozen selectable fields, fewer than it takes for hashing to pay.
//
// Its methods have pointer receivers: ev.LabelPairs() (&ev.Labels) is
// pointer-shaped, so passing it as an interface allocates nothing.
type Pairs []*Pair

// Lookup returns the value of key and whether the pairs hold it.
func (p *Pairs) Lookup(key string) (string, bool) {
	for _, kv := range *p {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return "", false
}

// Has reports whether the pairs hold key.
func (p *Pairs) Has(key string) bool {
	_, ok := p.Lookup(key)
	return ok
}

// Get returns the value of key, "" when the pairs do not hold it.
func (p *Pairs) Get(key string) string {
	v, _ := p.Lookup(key)
	return v
}

// SortedPairs returns m as pairs sorted by key (the order the cache writes,
// so that one object's event encodes alike every time), nil for an empty m.
func SortedPairs(m map[string]string) []*Pair {
	if len(m) == 0 {
		return nil
	}
	// One allocation for the pairs, one for the pointers.
	backing := make([]Pair, len(m))
	out := make([]*Pair, 0, len(m))
	for k, v := range m {
		kv := &backing[len(out)]
		kv.Key, kv.Value = k, v
		out = append(out, kv)
	}
	slices.SortFunc(out, func(a, b *Pair) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// LabelPairs, FieldPairs, PrevLabelPairs and PrevFieldPairs are ev's labels
// and fields, and its previous state's, for lookups (Pairs).
func (ev *Event) LabelPairs() *Pairs     { return (*Pairs)(&ev.Labels) }
func (ev *Event) FieldPairs() *Pairs     { return (*Pairs)(&ev.Fields) }
func (ev *Event) PrevLabelPairs() *Pairs { return (*Pairs)(&ev.PrevLabels) }
func (ev *Event) PrevFieldPairs() *Pairs { return (*Pairs)(&ev.PrevFields) }
