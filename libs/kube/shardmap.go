package kube

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// ShardMap says which cache shard serves which resource and namespace
// partitions. It is the one place where Herald decides placement: frontdoor
// routes LISTs with it and fanout opens upstream watches with it.
//
// The textual form is a semicolon-separated list of SPEC=TARGET, where SPEC
// is "*" (every resource not named otherwise) or "<resource id>" or
// "<resource id>/<partitions>" with partitions such as "0-7" or "0,3,5-6",
// and TARGET is a gRPC target naming the shard's replicas (for example
// "dns:///cache-pods-a.herald.svc:7100" behind a headless Service, or
// "static:///127.0.0.1:7100,127.0.0.1:7101").
type ShardMap struct {
	entries []shardEntry
}

type shardEntry struct {
	resource   string // "" for *
	partitions []bool // nil: all
	target     string
}

// Shard is one placement decision: a target and the partitions of the
// resource it owns (nil: all).
type Shard struct {
	Target     string
	Partitions []int
}

// LoadShards loads the registry (LoadRegistry) and the shard map over it
// (ParseShardMap): what a process that reads from the caches needs first.
func LoadShards(resourcesFile, prefix, shardMap string) (*Registry, *ShardMap, error) {
	reg, err := LoadRegistry(resourcesFile, prefix)
	if err != nil {
		return nil, nil, err
	}
	shards, err := ParseShardMap(shardMap, reg)
	if err != nil {
		return nil, nil, err
	}
	return reg, shards, nil
}

// ParseShardMap parses and validates a shard map against the registry:
// every resource must be fully covered, by exactly one shard per partition.
func ParseShardMap(s string, reg *Registry) (*ShardMap, error) {
	m := &ShardMap{}
	for _, item := range strings.Split(s, ";") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		spec, target, ok := strings.Cut(item, "=")
		if !ok || strings.TrimSpace(target) == "" {
			return nil, fmt.Errorf("shard map entry %q: want SPEC=TARGET", item)
		}
		e := shardEntry{target: strings.TrimSpace(target)}
		spec = strings.TrimSpace(spec)
		if spec != "*" {
			res, parts, hasParts := strings.Cut(spec, "/")
			if _, ok := reg.ByID(res); !ok {
				return nil, fmt.Errorf("shard map entry %q: unknown resource %q", item, res)
			}
			e.resource = res
			if hasParts {
				p, err := ParsePartitions(parts)
				if err != nil {
					return nil, fmt.Errorf("shard map entry %q: %w", item, err)
				}
				e.partitions = p
			}
		}
		m.entries = append(m.entries, e)
	}
	for _, r := range reg.Resources() {
		for p := range Partitions {
			n := 0
			for _, e := range m.entries {
				if e.resource == r.ID() && (e.partitions == nil || e.partitions[p]) {
					n++
				}
			}
			if n > 1 {
				return nil, fmt.Errorf("shard map: partition %d of %s has %d shards", p, r.ID(), n)
			}
			if n == 0 && m.wildcard() == "" {
				return nil, fmt.Errorf("shard map: partition %d of %s has no shard (add a * entry)", p, r.ID())
			}
		}
	}
	return m, nil
}

func (m *ShardMap) wildcard() string {
	for _, e := range m.entries {
		if e.resource == "" {
			return e.target
		}
	}
	return ""
}

// ParsePartitions parses a partition list such as "0-7" or "0,3,5-6" into
// a set indexed by partition.
func ParsePartitions(s string) ([]bool, error) {
	out := make([]bool, Partitions)
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err1 := strconv.Atoi(lo)
		b := a
		var err2 error
		if isRange {
			b, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || a < 0 || b >= Partitions || a > b {
			return nil, fmt.Errorf("partitions %q: want numbers or ranges within 0-%d", s, Partitions-1)
		}
		for p := a; p <= b; p++ {
			out[p] = true
		}
	}
	return out, nil
}

// For returns the shard serving resource r in namespace (for a
// cluster-scoped resource, or a namespace-less request on a resource that is
// not split, the single shard).
func (m *ShardMap) For(r *Resource, namespace string) Shard {
	shards := m.All(r)
	if len(shards) == 1 {
		return shards[0]
	}
	p := Partition(namespace)
	for _, s := range shards {
		for _, q := range s.Partitions {
			if q == p {
				return s
			}
		}
	}
	return shards[0] // unreachable for a validated map
}

// All returns the shards that together serve every object of r, ordered by
// target; a single shard when r is not split. A custom resource is never
// split: it is on the shard holding the CRDs (their partition, as CRDs are
// cluster-scoped), which learns it from them.
func (m *ShardMap) All(r *Resource) []Shard {
	if r.Custom() {
		return []Shard{{Target: m.target(CRDResourceID, Partition(""))}}
	}
	byTarget := map[string][]int{}
	whole := ""
	for p := range Partitions {
		target := m.target(r.ID(), p)
		byTarget[target] = append(byTarget[target], p)
		whole = target
	}
	if len(byTarget) == 1 {
		return []Shard{{Target: whole}}
	}
	out := make([]Shard, 0, len(byTarget))
	for t, ps := range byTarget {
		out = append(out, Shard{Target: t, Partitions: ps})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Target < out[j].Target })
	return out
}

// target is the target of partition p of resource id.
func (m *ShardMap) target(id string, p int) string {
	for _, e := range m.entries {
		if e.resource == id && (e.partitions == nil || e.partitions[p]) {
			return e.target
		}
	}
	return m.wildcard()
}

// Targets lists every distinct target.
func (m *ShardMap) Targets() []string {
	seen := map[string]bool{}
	var out []string
	for _, e := range m.entries {
		if !seen[e.target] {
			seen[e.target] = true
			out = append(out, e.target)
		}
	}
	sort.Strings(out)
	return out
}
