package cache

// current is the state now serving rs's resource: rs, unless a custom
// resource's state was replaced while a request waited for a revision (its
// CRD changed how its objects read, custom.go; the replaced state is
// emptied and its watchers cut). A request resolves its state before it
// waits, and reads (or subscribes) after: it must read the state the shard
// serves at the revision it waited for, not the one it found before.
func (s *Shard) current(rs *resourceState) *resourceState {
	if cur, ok := s.resourceStates()[rs.res.ID()]; ok {
		return cur
	}
	return rs
}
