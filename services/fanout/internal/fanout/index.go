package fanout

import (
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// indexedField is the one field watchers are indexed by besides the
// namespace: kubelets each watch their own node's pods, so an event must
// reach the watchers of one node (two, for a pod that moved), not be tested
// against thousands.
const indexedField = "spec.nodeName"

type watcherSet = map[*watcher]struct{}

// watcherIndex places every watcher in exactly one bucket: by the node its
// field selector pins, else by its namespace, else among the watchers
// every event is tested against. It is guarded by the hub's mutex.
type watcherIndex struct {
	all    watcherSet
	byNS   map[string]watcherSet
	byNode map[string]watcherSet
	n      int
}

func newWatcherIndex() watcherIndex {
	return watcherIndex{all: watcherSet{}, byNS: map[string]watcherSet{}, byNode: map[string]watcherSet{}}
}

// key returns the bucket map and key of w (m nil: the unindexed set).
func (x *watcherIndex) key(w *watcher) (map[string]watcherSet, string) {
	if node, ok := w.sel.Fields.RequiresExactMatch(indexedField); ok {
		return x.byNode, node
	}
	if w.sel.Namespace != "" {
		return x.byNS, w.sel.Namespace
	}
	return nil, ""
}

func (x *watcherIndex) add(w *watcher) {
	m, k := x.key(w)
	b := x.all
	if m != nil {
		if b = m[k]; b == nil {
			b = watcherSet{}
			m[k] = b
		}
	}
	if _, ok := b[w]; !ok {
		b[w] = struct{}{}
		x.n++
	}
}

func (x *watcherIndex) remove(w *watcher) {
	m, k := x.key(w)
	b := x.all
	if m != nil {
		b = m[k]
	}
	if _, ok := b[w]; !ok {
		return
	}
	delete(b, w)
	x.n--
	if m != nil && len(b) == 0 {
		delete(m, k)
	}
}

// each calls fn for every watcher ev may concern: the unindexed ones, those
// of its namespace, and those of its node before and after the change.
func (x *watcherIndex) each(ev *heraldv1.Event, fn func(*watcher)) {
	for w := range x.all {
		fn(w)
	}
	if b := x.byNS[ev.Namespace]; b != nil {
		for w := range b {
			fn(w)
		}
	}
	if len(x.byNode) == 0 {
		return
	}
	node, ok := ev.FieldPairs().Lookup(indexedField)
	if b := x.byNode[node]; ok && b != nil {
		for w := range b {
			fn(w)
		}
	}
	// A prev_unchanged event has no PrevFields: its node is the same.
	if prev, pok := ev.PrevFieldPairs().Lookup(indexedField); pok && (!ok || prev != node) {
		for w := range x.byNode[prev] {
			fn(w)
		}
	}
}

// every calls fn for every watcher.
func (x *watcherIndex) every(fn func(*watcher)) {
	for w := range x.all {
		fn(w)
	}
	for _, b := range x.byNS {
		for w := range b {
			fn(w)
		}
	}
	for _, b := range x.byNode {
		for w := range b {
			fn(w)
		}
	}
}
