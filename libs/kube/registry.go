package kube

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

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
	// custom: what a custom resource learned from a CRD carries besides
	// (crd.go); nil for the others.
	custom *customInfo
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

// Registry is the set of served resources: the static ones it is built
// with, fixed for its life, and the custom resources learned from CRDs
// (SetCRD, RemoveCRD, ReplaceCRDs), which change while it serves. Readers
// see the custom resources as an immutable set swapped atomically: a
// lookup never blocks, and a *Resource it returned stays valid (never
// modified) after its CRD changes. Safe for concurrent use.
type Registry struct {
	prefix string
	list   []*Resource
	byID   map[string]*Resource
	byGVR  map[string]*Resource // "group/version/plural"
	byKey  []*Resource          // sorted by key prefix, longest first

	builtins *storage.Table
	mu       sync.Mutex // serializes the writers of custom
	custom   atomic.Pointer[customSet]
}

// customSet is one generation of the custom resources. Never modified once
// published.
type customSet struct {
	gen     uint64
	changed chan struct{}          // closed when the next generation is published
	byCRD   map[string][]*Resource // CRD name -> its resources
	byID    map[string]*Resource
	byGVR   map[string]*Resource // "group/version/plural"
	byKey   map[string]*Resource // "<group>/<plural>"
	list    []*Resource          // by ID
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
	reg := &Registry{prefix: prefix, byID: map[string]*Resource{}, byGVR: map[string]*Resource{}, builtins: builtins}
	reg.custom.Store(&customSet{changed: make(chan struct{})})
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

// Resources lists the static resources in registration order, then the
// custom resources by ID.
func (g *Registry) Resources() []*Resource {
	c := g.custom.Load()
	if len(c.list) == 0 {
		return g.list
	}
	return append(append(make([]*Resource, 0, len(g.list)+len(c.list)), g.list...), c.list...)
}

// StaticResources lists the resources the registry was built with, in
// registration order.
func (g *Registry) StaticResources() []*Resource { return g.list }

// CustomResources lists the custom resources learned from CRDs, by ID.
func (g *Registry) CustomResources() []*Resource { return g.custom.Load().list }

// Generation changes whenever the custom resources change.
func (g *Registry) Generation() uint64 { return g.custom.Load().gen }

// ByID finds a resource by its ID.
func (g *Registry) ByID(id string) (*Resource, bool) {
	if r, ok := g.byID[id]; ok {
		return r, true
	}
	r, ok := g.custom.Load().byID[id]
	return r, ok
}

// Lookup finds a resource by group, version and plural.
func (g *Registry) Lookup(group, version, plural string) (*Resource, bool) {
	gvr := group + "/" + version + "/" + plural
	if r, ok := g.byGVR[gvr]; ok {
		return r, true
	}
	r, ok := g.custom.Load().byGVR[gvr]
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

// KeyOwner is the resource whose etcd keys hold r's objects: r itself, or
// the resource r is served from (events.k8s.io Events: core Events). Its
// JetStream subjects carry r's changes.
func (r *Resource) KeyOwner() *Resource {
	if r.source != nil {
		return r.source
	}
	return r
}

// ParseKey finds the resource owning an etcd key and the object's namespace
// and name. ok is false for keys no resource owns or that are malformed for
// their resource (a namespaced key without a namespace, extra segments).
// Static resources' layouts are tried first, then custom resources'
// (<prefix>/<group>/<plural>/...).
func (g *Registry) ParseKey(key string) (r *Resource, namespace, name string, ok bool) {
	for _, r := range g.byKey {
		if rest, found := strings.CutPrefix(key, r.keyPrefix); found {
			return r.parseTail(rest)
		}
	}
	c := g.custom.Load()
	if len(c.byKey) == 0 {
		return nil, "", "", false
	}
	rest, found := strings.CutPrefix(key, g.prefix+"/")
	if !found {
		return nil, "", "", false
	}
	group, rest, _ := strings.Cut(rest, "/")
	plural, rest, found := strings.Cut(rest, "/")
	if !found {
		return nil, "", "", false
	}
	if r := c.byKey[group+"/"+plural]; r != nil {
		return r.parseTail(rest)
	}
	return nil, "", "", false
}

// parseTail reads the object's namespace and name from what follows r's key
// prefix in a key.
func (r *Resource) parseTail(rest string) (*Resource, string, string, bool) {
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

// SetCRD sets the custom resources CRD name defines (none: as RemoveCRD).
// A resource equal to the one already set keeps its *Resource. It refuses
// (and changes nothing) resources that collide with a static resource or
// another CRD's (same ID, group/version/plural or key prefix). It reports
// whether anything changed.
func (g *Registry) SetCRD(name string, rs []Resource) (bool, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	cur := g.custom.Load()
	byCRD := maps.Clone(cur.byCRD)
	if byCRD == nil {
		byCRD = map[string][]*Resource{}
	}
	if len(rs) == 0 {
		if _, ok := byCRD[name]; !ok {
			return false, nil
		}
		delete(byCRD, name)
		_ = g.publish(cur, byCRD) // removing never collides
		return true, nil
	}
	next := make([]*Resource, 0, len(rs))
	old := map[string]*Resource{}
	for _, r := range cur.byCRD[name] {
		old[r.ID()] = r
	}
	same := len(rs) == len(old)
	for i := range rs {
		r, err := g.customResource(name, rs[i])
		if err != nil {
			return false, err
		}
		if o := old[r.ID()]; o != nil && sameResource(o, r) {
			r = o
		} else {
			same = false
		}
		next = append(next, r)
	}
	if same {
		return false, nil
	}
	byCRD[name] = next
	if err := g.publish(cur, byCRD); err != nil {
		return false, err
	}
	return true, nil
}

// RemoveCRD stops serving the custom resources of CRD name; it reports
// whether there were any.
func (g *Registry) RemoveCRD(name string) bool {
	changed, _ := g.SetCRD(name, nil)
	return changed
}

// ReplaceCRDs sets every CRD's custom resources at once (after reading
// all CRDs again). CRDs whose resources are refused are left out; their
// errors are returned joined.
func (g *Registry) ReplaceCRDs(crds map[string][]Resource) (bool, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	cur := g.custom.Load()
	byCRD := map[string][]*Resource{}
	var errs []error
	changed := len(crds) != len(cur.byCRD)
	for _, name := range slices.Sorted(maps.Keys(crds)) {
		old := map[string]*Resource{}
		for _, r := range cur.byCRD[name] {
			old[r.ID()] = r
		}
		var next []*Resource
		for _, rv := range crds[name] {
			r, err := g.customResource(name, rv)
			if err == nil {
				err = checkCollisions(g, byCRD, name, r)
			}
			if err != nil {
				errs = append(errs, err)
				next = nil
				break
			}
			if o := old[r.ID()]; o != nil && sameResource(o, r) {
				r = o
			}
			next = append(next, r)
		}
		if len(next) == 0 {
			continue
		}
		if !slices.Equal(next, cur.byCRD[name]) {
			changed = true
		}
		byCRD[name] = next
	}
	if len(byCRD) != len(cur.byCRD) {
		changed = true
	}
	if !changed {
		return false, errors.Join(errs...)
	}
	// Collisions were checked while building byCRD: publish cannot fail.
	_ = g.publish(cur, byCRD)
	return true, errors.Join(errs...)
}

// customResource completes one custom resource of CRD crd.
func (g *Registry) customResource(crd string, r Resource) (*Resource, error) {
	if r.custom == nil {
		return nil, fmt.Errorf("resource %s of CRD %s: not a custom resource", r.ID(), crd)
	}
	if r.Version == "" || r.Kind == "" || r.Plural == "" || r.Group == "" {
		return nil, fmt.Errorf("resource %s of CRD %s: group, version, kind and plural are required", r.ID(), crd)
	}
	if err := r.complete(g.builtins); err != nil {
		return nil, err
	}
	r.keyPrefix = g.prefix + "/" + r.Key + "/"
	if _, static := g.byID[r.ID()]; static {
		return nil, fmt.Errorf("CRD %s: resource %s is a static resource (built-in, or from the resources file)", crd, r.ID())
	}
	for _, s := range g.byKey {
		if strings.HasPrefix(s.keyPrefix, r.keyPrefix) || strings.HasPrefix(r.keyPrefix, s.keyPrefix) {
			return nil, fmt.Errorf("CRD %s: key prefix of %s overlaps %s's", crd, r.ID(), s.ID())
		}
	}
	return &r, nil
}

// checkCollisions refuses r (of CRD crd) when another CRD in byCRD serves
// the same resource.
func checkCollisions(g *Registry, byCRD map[string][]*Resource, crd string, r *Resource) error {
	for other, rs := range byCRD {
		if other == crd {
			continue
		}
		for _, o := range rs {
			if o.ID() == r.ID() || o.Key == r.Key {
				return fmt.Errorf("CRD %s: resource %s is CRD %s's", crd, r.ID(), other)
			}
		}
	}
	return nil
}

// publish makes byCRD the next generation of custom resources. Called with
// g.mu held.
func (g *Registry) publish(cur *customSet, byCRD map[string][]*Resource) error {
	next := &customSet{gen: cur.gen + 1, changed: make(chan struct{}), byCRD: byCRD,
		byID: map[string]*Resource{}, byGVR: map[string]*Resource{}, byKey: map[string]*Resource{}}
	for _, name := range slices.Sorted(maps.Keys(byCRD)) {
		for _, r := range byCRD[name] {
			if err := checkCollisions(g, byCRD, name, r); err != nil {
				return err
			}
			next.byID[r.ID()] = r
			next.byGVR[r.Group+"/"+r.Version+"/"+r.Plural] = r
			next.byKey[r.Key] = r
			next.list = append(next.list, r)
		}
	}
	sort.Slice(next.list, func(i, j int) bool { return next.list[i].ID() < next.list[j].ID() })
	g.custom.Store(next)
	close(cur.changed)
	return nil
}

// Changed returns a channel closed when the custom resources next change.
func (g *Registry) Changed() <-chan struct{} { return g.custom.Load().changed }

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
