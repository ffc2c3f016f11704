package cache

import (
	"context"

	"github.com/google/btree"

	"herald.dev/libs/kube"
)

// Custom resources. The shard that holds the CustomResourceDefinitions
// (their whole resource, or the partition their cluster-scoped objects
// are in) serves every custom resource too; kube.ShardMap routes custom
// resources there. It learns them from the CRDs it applies, in stream
// order: the revision that makes a CRD served (names accepted) adds the
// resource before any of its objects can be written, and the revision that
// deletes the CRD (after kube-apiserver has deleted its objects) removes
// it. Their objects arrive on stream.SubjectOther, which such a shard
// always consumes.
//
// Invariants:
//   - syncCustom runs on the apply goroutine (or while loading a
//     snapshot, before following), after the CRDs' revision is applied and
//     before the shard's head moves to it: a read at that revision sees the
//     custom resources the CRDs define there.
//   - A custom resource whose objects would read differently (version,
//     kind, scope, key, selectable fields) gets a new state loaded from
//     etcd at the revision; the old state's watchers are cut (errResync)
//     and resume against the new one, or get 404 once it is gone.
//   - An invalid CRD is skipped, counted in
//     herald_cache_undecodable_values_total{reason="invalid_crd"} and logged
//     once per revision of it; it never stops anything else.

// readCRD is what one revision of a CRD serves (kube.CustomResources).
type readCRD struct {
	rev       int64
	name      string
	resources []kube.Resource
	err       error
}

// servesCustom reports whether a shard with these states serves the custom
// resources: it holds the CRDs' partition.
func servesCustom(states map[string]*resourceState) bool {
	rs, ok := states[kube.CRDResourceID]
	return ok && (rs.parts == nil || rs.parts[kube.Partition("")])
}

// syncCustom sets the registry's custom resources to those of the CRDs in
// the shard's state at rev, and the shard's custom resource states to
// match: new ones loaded from etcd at rev, changed ones replaced, gone ones
// removed. reload loads every custom resource again (a snapshot).
func (s *Shard) syncCustom(ctx context.Context, rev int64, reload bool) error {
	if !s.custom {
		return nil
	}
	states := s.resourceStates()
	defs := map[string][]kube.Resource{}
	read := make(map[string]readCRD, len(s.crds))
	for _, o := range states[kube.CRDResourceID].objects() {
		// Each revision of a CRD is read once: a cluster's CRDs (and
		// their schemas) are many and large, and any CRD's change brings
		// them all here.
		c, ok := s.crds[o.Name]
		if !ok || c.rev != o.Rev {
			c = readCRD{rev: o.Rev}
			c.name, c.resources, c.err = kube.CustomResources(o.JSON)
			if c.err != nil {
				s.m.skipped.WithLabelValues(kube.CRDResourceID, kube.ReasonInvalidCRD).Inc()
				s.log.Warn("skipping a CustomResourceDefinition Herald cannot serve", "crd", o.Name, "revision", o.Rev, "err", c.err)
			}
		}
		read[o.Name] = c
		if c.err == nil && len(c.resources) > 0 {
			defs[c.name] = c.resources
		}
	}
	s.crds = read
	if _, err := s.reg.ReplaceCRDs(defs); err != nil {
		s.log.Warn("CustomResourceDefinitions not served", "revision", rev, "err", err)
	}

	next := make(map[string]*resourceState, len(states))
	changed := false
	for id, rs := range states {
		if !rs.res.Custom() {
			next[id] = rs
		}
	}
	for _, r := range s.reg.CustomResources() {
		rs := states[r.ID()]
		if rs == nil || !kube.SameObjects(rs.res, r) {
			rs, changed = s.newState(r, nil), true
		} else if !reload {
			next[r.ID()] = rs
			continue
		}
		if err := s.loadResource(ctx, rs, rev); err != nil {
			if reload {
				return err
			}
			// Only a CRD served again after its objects were written
			// (a version served again) has any; a new CRD has none.
			s.log.Error("custom resource starts empty: its objects could not be read", "resource", r.ID(), "revision", rev, "err", err)
			rs.reset(btree.NewG(32, lessEntry), rev)
		}
		next[r.ID()] = rs
		s.log.Info("serving a custom resource", "resource", r.ID(), "version", r.Version, "revision", rev)
	}
	for id, rs := range states {
		if rs.res.Custom() && next[id] != rs {
			rs.reset(btree.NewG(32, lessEntry), rev) // cuts its watchers
			changed = true
			if next[id] == nil {
				s.m.capacity.DeleteLabelValues(id)
				s.log.Info("custom resource no longer served", "resource", id, "revision", rev)
			}
		}
	}
	if changed {
		s.states.Store(&next)
	}
	return nil
}
