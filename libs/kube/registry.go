package kube

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"os"
	"sort"
	"strings"
)

// DefaultPrefix is where kube-apiserver keeps its objects in etcd.
const DefaultPrefix = "/registry"

// Partitions is the fixed number of namespace-hash partitions a resource's
// stream subject is split into. Cache shards own sets of partitions; the
// number never changes, so subjects are stable across deployments.
const Partitions = 16

// Field is a selectable field of a resource: its name in a fieldSelector and
// the JSON path (dot separated) it reads. Path defaults to Name.
type Field struct {
	Name string `json:"name"`
	Path string `json:"path,omitempty"`
}

// Resource describes one served resource.
type Resource struct {
	Group      string   `json:"group"`
	Version    string   `json:"version"`
	Kind       string   `json:"kind"`
	Plural     string   `json:"plural"`
	Singular   string   `json:"singular,omitempty"`
	ShortNames []string `json:"shortNames,omitempty"`
	Namespaced bool     `json:"namespaced"`
	// Key is the etcd key segment(s) under the registry prefix, e.g. "pods"
	// or "example.com/widgets". Defaults to Plural for core and built-in
	// groups' resources; custom resources use "<group>/<plural>".
	Key string `json:"key,omitempty"`
	// Fields are the selectable fields besides metadata.name and
	// metadata.namespace.
	Fields []Field `json:"fields,omitempty"`

	keyPrefix string // "/registry/pods/"
}

// ID names the resource inside Herald: "pods", "deployments.apps".
func (r *Resource) ID() string {
	if r.Group == "" {
		return r.Plural
	}
	return r.Plural + "." + r.Group
}

// GroupVersion is the apiVersion of the resource's objects.
func (r *Resource) GroupVersion() string {
	if r.Group == "" {
		return r.Version
	}
	return r.Group + "/" + r.Version
}

// KeyPrefix is the etcd prefix of all objects of the resource, with a
// trailing slash.
func (r *Resource) KeyPrefix() string { return r.keyPrefix }

// ObjectKey returns the etcd key of an object.
func (r *Resource) ObjectKey(namespace, name string) string {
	if r.Namespaced {
		return r.keyPrefix + namespace + "/" + name
	}
	return r.keyPrefix + name
}

// NamespacePrefix returns the key prefix of one namespace's objects.
func (r *Resource) NamespacePrefix(namespace string) string {
	if !r.Namespaced || namespace == "" {
		return r.keyPrefix
	}
	return r.keyPrefix + namespace + "/"
}

// SubjectToken is the resource's token in stream subjects.
func (r *Resource) SubjectToken() string { return strings.ReplaceAll(r.ID(), ".", "_") }

// Partition returns the namespace-hash partition of a namespace.
func Partition(namespace string) int {
	h := fnv.New32a()
	h.Write([]byte(namespace))
	return int(h.Sum32() % Partitions)
}

// Stream subjects. Every record of one etcd revision goes to one subject, so
// that a consumer sees a revision whole or not at all.
const (
	SubjectRoot = "herald.ev"
	// SubjectMulti carries revisions that change keys of several resources or
	// partitions; every shard consumes it.
	SubjectMulti = "herald.ev._multi"
	// SubjectOther carries changes to keys under the prefix that no
	// registered resource owns. Nobody needs them but the history checker.
	SubjectOther = "herald.ev._other"
	// SubjectProgress carries progress markers; every shard consumes it.
	SubjectProgress = "herald.progress"
	// SubjectProgressRequest is a core NATS subject (not in the stream) on
	// which caches ask the ingest leader for a progress marker.
	SubjectProgressRequest = "herald.ctl.progress"
)

// Subject returns the stream subject of a change to an object of r in
// namespace.
func (r *Resource) Subject(namespace string) string {
	return fmt.Sprintf("%s.%s.%d", SubjectRoot, r.SubjectToken(), Partition(namespace))
}

// SubjectFilter returns the subject filter matching every partition of r.
func (r *Resource) SubjectFilter() string {
	return SubjectRoot + "." + r.SubjectToken() + ".*"
}

// Registry is the set of served resources. It is immutable once built.
type Registry struct {
	prefix string
	list   []*Resource
	byID   map[string]*Resource
	byGVR  map[string]*Resource // "group/version/plural"
	byKey  []*Resource          // sorted by key prefix, longest first
}

// NewRegistry validates resources and builds a registry rooted at prefix.
func NewRegistry(prefix string, resources []Resource) (*Registry, error) {
	prefix = strings.TrimRight(prefix, "/")
	if prefix == "" || !strings.HasPrefix(prefix, "/") {
		return nil, fmt.Errorf("registry prefix %q must start with /", prefix)
	}
	reg := &Registry{prefix: prefix, byID: map[string]*Resource{}, byGVR: map[string]*Resource{}}
	for i := range resources {
		r := resources[i]
		if r.Version == "" || r.Kind == "" || r.Plural == "" {
			return nil, fmt.Errorf("resource %d: version, kind and plural are required", i)
		}
		if r.Singular == "" {
			r.Singular = strings.ToLower(r.Kind)
		}
		if r.Key == "" {
			r.Key = r.Plural
		}
		r.Key = strings.Trim(r.Key, "/")
		r.keyPrefix = prefix + "/" + r.Key + "/"
		for j := range r.Fields {
			if r.Fields[j].Path == "" {
				r.Fields[j].Path = r.Fields[j].Name
			}
		}
		if _, dup := reg.byID[r.ID()]; dup {
			return nil, fmt.Errorf("resource %s registered twice", r.ID())
		}
		rp := &r
		reg.list = append(reg.list, rp)
		reg.byID[r.ID()] = rp
		reg.byGVR[r.Group+"/"+r.Version+"/"+r.Plural] = rp
		reg.byKey = append(reg.byKey, rp)
	}
	sort.Slice(reg.byKey, func(i, j int) bool { return len(reg.byKey[i].keyPrefix) > len(reg.byKey[j].keyPrefix) })
	for i := 1; i < len(reg.byKey); i++ {
		for j := 0; j < i; j++ {
			if strings.HasPrefix(reg.byKey[j].keyPrefix, reg.byKey[i].keyPrefix) {
				return nil, fmt.Errorf("key prefixes of %s and %s overlap", reg.byKey[i].ID(), reg.byKey[j].ID())
			}
		}
	}
	return reg, nil
}

// LoadRegistry reads resources from a JSON file ({"resources":[...]}); an
// empty path gives the defaults.
func LoadRegistry(path, prefix string) (*Registry, error) {
	if path == "" {
		return NewRegistry(prefix, DefaultResources())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading resource registry: %w", err)
	}
	var f struct {
		Resources []Resource `json:"resources"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("parsing resource registry %s: %w", path, err)
	}
	return NewRegistry(prefix, f.Resources)
}

// Prefix is the registry's etcd prefix without a trailing slash.
func (g *Registry) Prefix() string { return g.prefix }

// Resources lists the resources in registration order.
func (g *Registry) Resources() []*Resource { return g.list }

// ByID finds a resource by its ID.
func (g *Registry) ByID(id string) (*Resource, bool) {
	r, ok := g.byID[id]
	return r, ok
}

// Lookup finds a resource by group, version and plural.
func (g *Registry) Lookup(group, version, plural string) (*Resource, bool) {
	r, ok := g.byGVR[group+"/"+version+"/"+plural]
	return r, ok
}

// ParseKey finds the resource owning an etcd key and the object's namespace
// and name. ok is false for keys no resource owns or that are malformed for
// their resource (a namespaced key without a namespace, extra segments).
func (g *Registry) ParseKey(key string) (r *Resource, namespace, name string, ok bool) {
	for _, r := range g.byKey {
		rest, found := strings.CutPrefix(key, r.keyPrefix)
		if !found {
			continue
		}
		if r.Namespaced {
			ns, n, cut := strings.Cut(rest, "/")
			if !cut || ns == "" || n == "" || strings.Contains(n, "/") {
				return r, "", "", false
			}
			return r, ns, n, true
		}
		if rest == "" || strings.Contains(rest, "/") {
			return r, "", "", false
		}
		return r, "", rest, true
	}
	return nil, "", "", false
}

// DefaultResources is the built-in registry: the core and apps resources
// kubelets, controllers and kube-proxies watch most.
func DefaultResources() []Resource {
	f := func(names ...string) []Field {
		out := make([]Field, len(names))
		for i, n := range names {
			out[i] = Field{Name: n}
		}
		return out
	}
	return []Resource{
		{Version: "v1", Kind: "Pod", Plural: "pods", ShortNames: []string{"po"}, Namespaced: true,
			Fields: f("spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
				"spec.hostNetwork", "status.phase", "status.podIP", "status.nominatedNodeName")},
		{Version: "v1", Kind: "Node", Plural: "nodes", ShortNames: []string{"no"},
			Fields: f("spec.unschedulable")},
		{Version: "v1", Kind: "Service", Plural: "services", ShortNames: []string{"svc"}, Namespaced: true},
		{Version: "v1", Kind: "Endpoints", Plural: "endpoints", ShortNames: []string{"ep"}, Namespaced: true},
		{Version: "v1", Kind: "ConfigMap", Plural: "configmaps", ShortNames: []string{"cm"}, Namespaced: true},
		{Version: "v1", Kind: "Namespace", Plural: "namespaces", ShortNames: []string{"ns"}, Fields: f("status.phase")},
		{Version: "v1", Kind: "Event", Plural: "events", ShortNames: []string{"ev"}, Namespaced: true,
			Fields: append(f("involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
				"involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
				"involvedObject.fieldPath", "reason", "reportingComponent", "type"),
				Field{Name: "source", Path: "source.component"})},
		{Group: "apps", Version: "v1", Kind: "Deployment", Plural: "deployments", ShortNames: []string{"deploy"}, Namespaced: true},
		{Group: "apps", Version: "v1", Kind: "ReplicaSet", Plural: "replicasets", ShortNames: []string{"rs"}, Namespaced: true,
			Fields: f("status.replicas")},
	}
}
