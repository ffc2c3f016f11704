// Package discovery is what the frontdoor says about the API it serves:
// the discovery documents of the registry's resources and /version
// (Docs), and the Warning of a deprecated API version (Deprecations).
package discovery

import (
	"encoding/json"
	"net/http"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/version"

	"herald.dev/libs/kube"
)

// Docs serves the pre-encoded discovery documents of the registry's
// resources. They are encoded again when the registry's custom resources
// change (its generation), on the first request after the change.
type Docs struct {
	reg  *kube.Registry
	mu   sync.Mutex // serializes rebuilds
	docs atomic.Pointer[discoveryDocs]
}

// discoveryDocs are the documents of one generation of the registry.
type discoveryDocs struct {
	gen  uint64
	docs map[string][]byte // path -> JSON
}

// New encodes the discovery documents of reg's resources.
func New(reg *kube.Registry) *Docs {
	d := &Docs{reg: reg}
	d.docs.Store(buildDiscovery(reg))
	return d
}

// current returns the documents of the registry's current generation.
func (d *Docs) current() map[string][]byte {
	gen := d.reg.Generation()
	if cur := d.docs.Load(); cur.gen == gen {
		return cur.docs
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if cur := d.docs.Load(); cur.gen == gen {
		return cur.docs
	}
	next := buildDiscovery(d.reg)
	d.docs.Store(next)
	return next.docs
}

// buildDiscovery encodes the registry's discovery documents. A custom
// resource is listed once its CRD is Established, as kube-apiserver lists
// it.
func buildDiscovery(reg *kube.Registry) *discoveryDocs {
	d := &discoveryDocs{gen: reg.Generation(), docs: map[string][]byte{}}
	put := func(path string, v any) {
		b, _ := json.Marshal(v)
		d.docs[path] = b
	}
	byGV := map[string][]metav1.APIResource{}
	groups := map[string][]string{} // group -> versions
	for _, r := range reg.Resources() {
		if !r.Discoverable() {
			continue
		}
		gv := r.GroupVersion()
		if _, seen := byGV[gv]; !seen && r.Group != "" {
			groups[r.Group] = append(groups[r.Group], r.Version)
		}
		byGV[gv] = append(byGV[gv], metav1.APIResource{
			Name: r.Plural, SingularName: r.Singular, Namespaced: r.Namespaced, Kind: r.Kind,
			Verbs: metav1.Verbs{"get", "list", "watch"}, ShortNames: r.ShortNames, Categories: r.Categories,
		})
	}
	put("/api", metav1.APIVersions{
		TypeMeta: metav1.TypeMeta{Kind: "APIVersions"}, Versions: []string{"v1"},
		ServerAddressByClientCIDRs: []metav1.ServerAddressByClientCIDR{},
	})
	var list metav1.APIGroupList
	list.Kind, list.APIVersion = "APIGroupList", "v1"
	names := make([]string, 0, len(groups))
	for g := range groups {
		names = append(names, g)
	}
	sort.Strings(names)
	for _, g := range names {
		grp := metav1.APIGroup{TypeMeta: metav1.TypeMeta{Kind: "APIGroup", APIVersion: "v1"}, Name: g}
		for _, v := range groups[g] {
			grp.Versions = append(grp.Versions, metav1.GroupVersionForDiscovery{GroupVersion: g + "/" + v, Version: v})
		}
		grp.PreferredVersion = grp.Versions[0]
		put("/apis/"+g, grp)
		grp.TypeMeta = metav1.TypeMeta{}
		list.Groups = append(list.Groups, grp)
	}
	if list.Groups == nil {
		list.Groups = []metav1.APIGroup{}
	}
	put("/apis", list)
	for gv, res := range byGV {
		path := "/apis/" + gv
		if !strings.Contains(gv, "/") {
			path = "/api/" + gv
		}
		put(path, metav1.APIResourceList{TypeMeta: metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"}, GroupVersion: gv, APIResources: res})
	}
	v := StandaloneVersion
	v.Platform, v.GoVersion, v.Compiler = runtime.GOOS+"/"+runtime.GOARCH, runtime.Version(), runtime.Compiler
	put("/version", v)
	return d
}

// StandaloneVersion is the version frontdoor reports without an upstream:
// that of the Kubernetes API it serves, the k8s.io/api module it is built
// with (v0.X.Y for Kubernetes v1.X.Y), marked as Herald's.
var StandaloneVersion = servedAPIVersion()

func servedAPIVersion() version.Info {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path != "k8s.io/api" {
				continue
			}
			if d.Replace != nil {
				d = d.Replace
			}
			if v, ok := kubernetesVersion(d.Version); ok {
				return v
			}
		}
	}
	// go.mod's, for a binary built without module versions (a test) or
	// with a pseudo-version of k8s.io/api.
	v, _ := kubernetesVersion("v0.37.2")
	return v
}

// kubernetesVersion is the Kubernetes version of a k8s.io/api module
// version (v0.X.Y is v1.X.Y), marked as Herald's.
func kubernetesVersion(module string) (version.Info, bool) {
	minor, rest, ok := strings.Cut(strings.TrimPrefix(module, "v0."), ".")
	if n, err := strconv.Atoi(minor); !ok || err != nil || n == 0 || !strings.HasPrefix(module, "v0.") {
		return version.Info{}, false
	}
	patch, _, _ := strings.Cut(rest, "-")
	return version.Info{Major: "1", Minor: minor, GitVersion: "v1." + minor + "." + patch + "-herald"}, true
}

// Serve answers a discovery path; false when path is not one.
func (d *Docs) Serve(w http.ResponseWriter, path string) bool {
	b, ok := d.current()[strings.TrimRight(path, "/")]
	if !ok {
		return false
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
	return true
}

// Has reports whether path is a discovery document.
func (d *Docs) Has(path string) bool {
	_, ok := d.current()[strings.TrimRight(path, "/")]
	return ok
}
