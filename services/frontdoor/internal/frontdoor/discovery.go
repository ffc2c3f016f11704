package frontdoor

import (
	"encoding/json"
	"net/http"
	"runtime"
	"sort"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/version"

	"herald.dev/libs/kube"
)

// discovery holds the pre-encoded discovery documents; the registry is
// fixed for the life of the process.
type discovery struct {
	docs map[string][]byte // path -> JSON
}

func newDiscovery(reg *kube.Registry) *discovery {
	d := &discovery{docs: map[string][]byte{}}
	put := func(path string, v any) {
		b, _ := json.Marshal(v)
		d.docs[path] = b
	}
	byGV := map[string][]metav1.APIResource{}
	groups := map[string][]string{} // group -> versions
	for _, r := range reg.Resources() {
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
	put("/version", version.Info{Major: "1", Minor: "32", GitVersion: "v1.32.0-herald", Platform: runtime.GOOS + "/" + runtime.GOARCH, GoVersion: runtime.Version(), Compiler: runtime.Compiler})
	return d
}

// serve answers a discovery path; false when path is not one.
func (d *discovery) serve(w http.ResponseWriter, path string) bool {
	b, ok := d.docs[strings.TrimRight(path, "/")]
	if !ok {
		return false
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
	return true
}

// has reports whether path is a discovery document.
func (d *discovery) has(path string) bool {
	_, ok := d.docs[strings.TrimRight(path, "/")]
	return ok
}
