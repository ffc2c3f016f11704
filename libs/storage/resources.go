package storage

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Resource describes one resource as kube-apiserver serves it and as it
// keeps it in etcd. Values are never mutated after construction: the table is
// shared by every decoder and request.
type Resource struct {
	// Group, Version, Resource and Kind as the API serves them.
	Group, Version, Resource, Kind string
	// StorageGroup, StorageVersion and StorageKind: the type kube-apiserver
	// encodes into etcd. They differ from the served ones for resources that
	// share storage (events.k8s.io events are core v1 Events) or whose
	// storage version lags the served one (autoscaling/v1 HPAs are stored as
	// autoscaling/v2; certificates.k8s.io/v1 ClusterTrustBundles as v1beta1).
	StorageGroup, StorageVersion, StorageKind string
	// Namespaced is the resource's scope.
	Namespaced bool
	// KeyPrefix is the path under the etcd prefix (default "/registry")
	// without slashes at either end: "pods", "services/specs", "minions",
	// "apiextensions.k8s.io/customresourcedefinitions", or for a custom
	// resource "<group>/<plural>".
	KeyPrefix string
	// ShortNames and Categories as discovery lists them.
	ShortNames []string
	Categories []string
	// FieldLabels maps each field selector label kube-apiserver accepts for
	// this kind in this version to the selectable field it compares with
	// (most map to themselves; pods' "spec.host" maps to "spec.nodeName",
	// events.k8s.io's "regarding.name" to "involvedObject.name"). A label
	// not in the map is refused with 400 by kube-apiserver.
	FieldLabels map[string]string
	// NotWatchCached: kube-apiserver keeps no watch cache for the
	// resource (DefaultWatchCacheSizes: events), so it answers every list
	// from etcd, a resourceVersion=0 one with its limit honoured.
	NotWatchCached bool
	// Convert, when the served kind differs from the stored one, turns a
	// decoded stored object into the served one; nil when that takes
	// kube-apiserver's internal types (see NeedsConversion).
	Convert func(runtime.Object) (runtime.Object, error)
}

// GroupResource is the served group and resource: the key of the encryption
// configuration and of metrics.
func (r *Resource) GroupResource() schema.GroupResource {
	return schema.GroupResource{Group: r.Group, Resource: r.Resource}
}

// GroupVersionResource is the served group, version and resource.
func (r *Resource) GroupVersionResource() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: r.Group, Version: r.Version, Resource: r.Resource}
}

// StorageGVK is the kind kube-apiserver writes into etcd for this resource.
func (r *Resource) StorageGVK() schema.GroupVersionKind {
	return schema.GroupVersionKind{Group: r.StorageGroup, Version: r.StorageVersion, Kind: r.StorageKind}
}

// ServedGVK is the kind the API returns for this resource.
func (r *Resource) ServedGVK() schema.GroupVersionKind {
	return schema.GroupVersionKind{Group: r.Group, Version: r.Version, Kind: r.Kind}
}

// NeedsConversion reports whether the stored kind differs from the served
// one and Herald has no conversion for it (Convert): converting it needs
// kube-apiserver's internal types (k8s.io/kubernetes), which Herald does not
// link, so it is not served from the cache.
func (r *Resource) NeedsConversion() bool {
	return r.StorageGVK() != r.ServedGVK() && r.Convert == nil
}

// Key is the etcd key of the object namespace/name under prefix (e.g.
// "/registry"): kube-apiserver's layout, <prefix>/<keyPrefix>/<ns>/<name>
// for namespaced resources and <prefix>/<keyPrefix>/<name> otherwise.
func (r *Resource) Key(prefix, namespace, name string) string {
	if r.Namespaced {
		return prefix + "/" + r.KeyPrefix + "/" + namespace + "/" + name
	}
	return prefix + "/" + r.KeyPrefix + "/" + name
}

// Table indexes resources by what they are served as and by where they are
// stored. Several served resources may share one key prefix (core and
// events.k8s.io events; autoscaling v1 and v2 HPAs): a stored value belongs
// to all of them. A Table is immutable once built and safe for concurrent use.
type Table struct {
	byGVR    map[schema.GroupVersionResource]*Resource
	byPrefix map[string][]*Resource
}

// NewTable indexes rs. It refuses two entries for one served
// group/version/resource, and entries that share a key prefix but disagree on
// scope or storage kind (one etcd value must decode one way).
func NewTable(rs []*Resource) (*Table, error) {
	t := &Table{byGVR: map[schema.GroupVersionResource]*Resource{}, byPrefix: map[string][]*Resource{}}
	for _, r := range rs {
		gvr := r.GroupVersionResource()
		if _, dup := t.byGVR[gvr]; dup {
			return nil, fmt.Errorf("resource table: %s listed twice", gvr)
		}
		if r.KeyPrefix == "" || strings.HasPrefix(r.KeyPrefix, "/") || strings.HasSuffix(r.KeyPrefix, "/") {
			return nil, fmt.Errorf("resource table: %s: key prefix %q must be non-empty without a leading or trailing slash", gvr, r.KeyPrefix)
		}
		if others := t.byPrefix[r.KeyPrefix]; len(others) > 0 {
			o := others[0]
			if o.Namespaced != r.Namespaced || o.StorageGVK().GroupKind() != r.StorageGVK().GroupKind() {
				return nil, fmt.Errorf("resource table: %s and %s share key prefix %q but differ in scope or storage kind",
					o.GroupVersionResource(), gvr, r.KeyPrefix)
			}
		}
		t.byGVR[gvr] = r
		t.byPrefix[r.KeyPrefix] = append(t.byPrefix[r.KeyPrefix], r)
	}
	return t, nil
}

// NewBuiltinTable is the table of every built-in resource.
func NewBuiltinTable() *Table {
	t, err := NewTable(builtin())
	if err != nil {
		// The built-in table is a constant checked by the package's tests.
		panic(err)
	}
	return t
}

// Lookup returns the resource served at gvr, or nil.
func (t *Table) Lookup(gvr schema.GroupVersionResource) *Resource { return t.byGVR[gvr] }

// Resources returns every resource in the table (shared, do not modify).
func (t *Table) Resources() []*Resource {
	out := make([]*Resource, 0, len(t.byGVR))
	for _, r := range t.byGVR {
		out = append(out, r)
	}
	return out
}

// KeyInfo is what an etcd key says about its object.
type KeyInfo struct {
	// Resources stored under the key's prefix (one or more served
	// versions/groups of the same stored kind).
	Resources []*Resource
	Namespace string
	Name      string
}

// ParseKey finds the resource an etcd key belongs to. prefix is the etcd
// prefix ("/registry"). The longest matching key prefix wins, so
// "services/specs" and "services/endpoints" never shadow each other. A key
// outside every known layout, or with the wrong number of segments for the
// resource's scope, returns ErrUnknownKey.
func (t *Table) ParseKey(prefix, key string) (KeyInfo, error) {
	rest, ok := strings.CutPrefix(key, prefix+"/")
	if !ok {
		return KeyInfo{}, fmt.Errorf("%w: not under %q", ErrUnknownKey, prefix)
	}
	// Try every split point from the longest candidate prefix down.
	for i := len(rest) - 1; i > 0; i-- {
		if rest[i] != '/' {
			continue
		}
		rs := t.byPrefix[rest[:i]]
		if len(rs) == 0 {
			continue
		}
		tail := rest[i+1:]
		if rs[0].Namespaced {
			ns, name, ok := strings.Cut(tail, "/")
			if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
				return KeyInfo{}, fmt.Errorf("%w: %s is namespaced, key needs <namespace>/<name>", ErrUnknownKey, rs[0].GroupResource())
			}
			return KeyInfo{Resources: rs, Namespace: ns, Name: name}, nil
		}
		if tail == "" || strings.Contains(tail, "/") {
			return KeyInfo{}, fmt.Errorf("%w: %s is cluster-scoped, key needs <name>", ErrUnknownKey, rs[0].GroupResource())
		}
		return KeyInfo{Resources: rs, Name: tail}, nil
	}
	return KeyInfo{}, fmt.Errorf("%w: no resource stored under this key", ErrUnknownKey)
}
