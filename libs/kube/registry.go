package kube

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"os"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"herald.dev/libs/storage"
)

// DefaultPrefix is where kube-apiserver keeps its objects in etcd.
const DefaultPrefix = "/registry"

// Partitions is the fixed number of namespace-hash partitions a resource's
// stream subject is split into (libs/stream formats the subjects). Cache shards own sets of partitions; the
// number never changes, so subjects are stable across deployments.
const Partitions = 16

// Field is a selectable field of a resource: its name in a fieldSelector (a
// field label) and what it compares with. Path defaults to Name. For a
// built-in kind it is a selectable field kube-apiserver's registry computes
// (pods' label "spec.host" compares with "spec.nodeName"); a path no
// built-in computes is read from the object's JSON (dot separated), as for
// custom resources.
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
	Categories []string `json:"categories,omitempty"`
	Namespaced bool     `json:"namespaced"`
	// Key is the etcd key segment(s) under the registry prefix, e.g. "pods",
	// "services/specs" or "example.com/widgets". Defaults to kube-apiserver's
	// layout for built-in resources (libs/storage's table) and to Plural
	// otherwise; custom resources use "<group>/<plural>".
	Key string `json:"key,omitempty"`
	// Fields are the selectable fields besides metadata.name and
	// metadata.namespace (and metadata.namespace of a cluster-scoped
	// resource, which kube-apiserver accepts for most kinds). Nil for a
	// built-in resource: the field labels kube-apiserver accepts for it.
	Fields []Field `json:"fields,omitempty"`

	keyPrefix string // "/registry/pods/"
	// stored is how the resource's values are decoded: libs/storage's
	// entry for a built-in resource, one made from the fields above for
	// others (custom resources, decoded as unstructured JSON).
	stored *storage.Resource
	// builtin: a resource of libs/storage's built-in table.
	builtin bool
	// source: for a resource served from another one's stored values
	// (events.k8s.io/v1 Events are core v1 Events converted), that
	// resource; nil otherwise. Keys parse to the source, which lists its
	// aliases.
	source  *Resource
	aliases []*Resource
	// computed marks, per entry of Fields, a field kube-apiserver's
	// registry computes for the stored kind (read from the decoded
	// object); the others are read from the JSON.
	computed []bool
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

// Partition returns the namespace-hash partition of a namespace.
func Partition(namespace string) int {
	h := fnv.New32a()
	h.Write([]byte(namespace))
	return int(h.Sum32() % Partitions)
}

// Registry is the set of served resources. It is immutable once built.
type Registry struct {
	prefix string
	list   []*Resource
	byID   map[string]*Resource
	byGVR  map[string]*Resource // "group/version/plural"
	byKey  []*Resource          // sorted by key prefix, longest first
}

// NewRegistry validates resources and builds a registry rooted at prefix. A
// resource with the group, version and plural of a built-in one (libs/storage's
// table) is that resource: it must agree with it on kind and scope, and
// takes its key layout, short names, categories and field labels where it
// leaves them out. A built-in resource whose served version Herald cannot
// convert from its storage version is refused (see
// storage.Resource.NeedsConversion), so it is not served from the cache. A
// converted resource sharing its key with the resource stored there
// (events.k8s.io Events, core Events) is that resource's alias: keys parse
// to the resource stored there, and a change reaches every Readers().
func NewRegistry(prefix string, resources []Resource) (*Registry, error) {
	prefix = strings.TrimRight(prefix, "/")
	if prefix == "" || !strings.HasPrefix(prefix, "/") {
		return nil, fmt.Errorf("registry prefix %q must start with /", prefix)
	}
	builtins := storage.NewBuiltinTable()
	reg := &Registry{prefix: prefix, byID: map[string]*Resource{}, byGVR: map[string]*Resource{}}
	for i := range resources {
		r := resources[i]
		if r.Version == "" || r.Kind == "" || r.Plural == "" {
			return nil, fmt.Errorf("resource %d: version, kind and plural are required", i)
		}
		if err := r.complete(builtins); err != nil {
			return nil, err
		}
		r.keyPrefix = prefix + "/" + r.Key + "/"
		if _, dup := reg.byID[r.ID()]; dup {
			return nil, fmt.Errorf("resource %s registered twice", r.ID())
		}
		rp := &r
		reg.list = append(reg.list, rp)
		reg.byID[r.ID()] = rp
		reg.byGVR[r.Group+"/"+r.Version+"/"+r.Plural] = rp
	}
	// A converted resource that shares its key with one served in its
	// stored version (events.k8s.io and core Events) is served from that
	// one's values: an alias, which owns no key.
	for _, r := range reg.list {
		if r.stored.Convert != nil {
			for _, src := range reg.list {
				if src != r && src.stored.Convert == nil && src.keyPrefix == r.keyPrefix {
					r.source = src
					src.aliases = append(src.aliases, r)
					break
				}
			}
		}
		if r.source == nil {
			reg.byKey = append(reg.byKey, r)
		}
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
// empty path gives the defaults (every built-in resource Herald can serve).
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

// Readers is r and the resources served from r's stored values (its
// aliases): every resource a change to a key of r changes.
func (r *Resource) Readers() []*Resource {
	if len(r.aliases) == 0 {
		return []*Resource{r}
	}
	return append([]*Resource{r}, r.aliases...)
}

// StreamResource is the resource whose stream subjects carry r's changes:
// r itself, or the resource r is served from.
func (r *Resource) StreamResource() *Resource {
	if r.source != nil {
		return r.source
	}
	return r
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

// DefaultResources is the built-in registry: every resource of
// libs/storage's built-in table (kube-apiserver's resources, key layouts,
// short names, categories and field labels) that Herald can serve (its
// stored version, or one it converts to), in the table's order.
func DefaultResources() []Resource {
	var out []Resource
	for _, st := range storage.Builtins() {
		if st.NeedsConversion() {
			continue
		}
		out = append(out, Resource{
			Group: st.Group, Version: st.Version, Kind: st.Kind, Plural: st.Resource,
			ShortNames: st.ShortNames, Categories: st.Categories, Namespaced: st.Namespaced,
			Key: st.KeyPrefix, Fields: builtinFields(st),
		})
	}
	return out
}

// builtinFields are the field labels of a built-in resource as Fields, in a
// stable order, without those every resource of its scope accepts anyway.
func builtinFields(st *storage.Resource) []Field {
	out := []Field{}
	for label, field := range st.FieldLabels {
		if label == "metadata.name" || (label == "metadata.namespace" && st.Namespaced) {
			continue
		}
		out = append(out, Field{Name: label, Path: field})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// complete fills in r's defaults and its storage description.
func (r *Resource) complete(builtins *storage.Table) error {
	gvr := schema.GroupVersionResource{Group: r.Group, Version: r.Version, Resource: r.Plural}
	st := builtins.Lookup(gvr)
	if st != nil {
		switch {
		case st.NeedsConversion():
			return fmt.Errorf("resource %s: stored as %s, served as %s: Herald cannot convert it, so it is not served from the cache",
				r.ID(), st.StorageGVK(), st.ServedGVK())
		case st.Kind != r.Kind || st.Namespaced != r.Namespaced:
			return fmt.Errorf("resource %s: kind %s, namespaced %v; kube-apiserver serves kind %s, namespaced %v",
				r.ID(), r.Kind, r.Namespaced, st.Kind, st.Namespaced)
		}
		if r.Key == "" {
			r.Key = st.KeyPrefix
		}
		if r.ShortNames == nil {
			r.ShortNames = st.ShortNames
		}
		if r.Categories == nil {
			r.Categories = st.Categories
		}
		if r.Fields == nil {
			r.Fields = builtinFields(st)
		}
	}
	if r.Singular == "" {
		r.Singular = strings.ToLower(r.Kind)
	}
	if r.Key == "" {
		r.Key = r.Plural
	}
	r.Key = strings.Trim(r.Key, "/")
	if r.Key == "" {
		return fmt.Errorf("resource %s: empty key", r.ID())
	}
	r.Fields = append([]Field(nil), r.Fields...)
	for j := range r.Fields {
		if r.Fields[j].Path == "" {
			r.Fields[j].Path = r.Fields[j].Name
		}
	}
	stored := &storage.Resource{
		Group: r.Group, Version: r.Version, Resource: r.Plural, Kind: r.Kind,
		StorageGroup: r.Group, StorageVersion: r.Version, StorageKind: r.Kind,
		Namespaced: r.Namespaced,
	}
	if st != nil {
		c := *st
		stored = &c
		r.builtin = true
	}
	stored.KeyPrefix = r.Key
	r.stored = stored
	// The fields the stored kind's registry computes: every target of the
	// built-in's field labels. Others (a registry file's own fields, custom
	// resources) are read from the JSON.
	r.computed = make([]bool, len(r.Fields))
	for j, f := range r.Fields {
		if st == nil {
			continue
		}
		for _, target := range st.FieldLabels {
			if target == f.Path {
				r.computed[j] = true
				break
			}
		}
	}
	return nil
}

// Stored describes how r's values are kept in etcd (shared, never modify).
func (r *Resource) Stored() *storage.Resource { return r.stored }
