// Package kubecheck proves herald.dev/libs/storage's built-in resource table
// against kube-apiserver v1.37.2's own code rather than against a second copy
// of the same facts: for every built-in resource, kube-apiserver's storage
// factory (default_storage_factory_builder.go, protobuf media type) names the
// key prefix and encodes an object with its real storage codec, which the
// table must match and Herald's decoder must read; kube-apiserver's scheme
// says which field selector labels it accepts and how it maps them.
// Every GA kind of kube-apiserver's scheme that has a List kind must be in
// the table or listed as not stored.
// Scope, short names and categories come from the registries' REST storage
// and are checked against a running kube-apiserver's discovery instead.
package kubecheck

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	serveroptions "k8s.io/apiserver/pkg/server/options"
	serverstorage "k8s.io/apiserver/pkg/server/storage"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/apiserver/pkg/util/compatibility"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	_ "k8s.io/kubernetes/pkg/apis/admissionregistration/install"
	_ "k8s.io/kubernetes/pkg/apis/apps/install"
	_ "k8s.io/kubernetes/pkg/apis/autoscaling/install"
	_ "k8s.io/kubernetes/pkg/apis/batch/install"
	_ "k8s.io/kubernetes/pkg/apis/certificates/install"
	_ "k8s.io/kubernetes/pkg/apis/coordination/install"
	_ "k8s.io/kubernetes/pkg/apis/core/install"
	_ "k8s.io/kubernetes/pkg/apis/discovery/install"
	_ "k8s.io/kubernetes/pkg/apis/events/install"
	_ "k8s.io/kubernetes/pkg/apis/extensions/install"
	_ "k8s.io/kubernetes/pkg/apis/flowcontrol/install"
	_ "k8s.io/kubernetes/pkg/apis/networking/install"
	_ "k8s.io/kubernetes/pkg/apis/node/install"
	_ "k8s.io/kubernetes/pkg/apis/policy/install"
	_ "k8s.io/kubernetes/pkg/apis/rbac/install"
	_ "k8s.io/kubernetes/pkg/apis/resource/install"
	_ "k8s.io/kubernetes/pkg/apis/scheduling/install"
	_ "k8s.io/kubernetes/pkg/apis/storage/install"
	_ "k8s.io/kubernetes/pkg/apis/storagemigration/install"
	"k8s.io/kubernetes/pkg/kubeapiserver"

	"herald.dev/libs/storage"
)

// kubeOwned skips the kinds served by kube-apiserver's apiextensions and
// aggregator servers: they are not in legacyscheme.
func kubeOwned(r *storage.Resource) bool {
	return r.Group != "apiextensions.k8s.io" && r.Group != "apiregistration.k8s.io"
}

func storageFactory(t *testing.T, table []*storage.Resource) *serverstorage.DefaultStorageFactory {
	t.Helper()
	cfg := kubeapiserver.NewStorageFactoryConfigEffectiveVersion(compatibility.DefaultBuildEffectiveVersion())
	// Every group version the table serves is enabled, as in
	// controlplane.DefaultAPIResourceConfigSource (GA versions only).
	rc := serverstorage.NewResourceConfig()
	for _, r := range table {
		rc.EnableVersions(schema.GroupVersion{Group: r.Group, Version: r.Version})
	}
	cfg.APIResourceConfig = rc
	sf, err := cfg.Complete(&serveroptions.EtcdOptions{
		StorageConfig:           *storagebackend.NewDefaultConfig("/registry", nil),
		DefaultStorageMediaType: runtime.ContentTypeProtobuf,
	}).New()
	if err != nil {
		t.Fatal(err)
	}
	return sf
}

func TestTableMatchesKubeAPIServerStorage(t *testing.T) {
	table := storage.Builtins()
	sf := storageFactory(t, table)
	codec, err := storage.NewCodec(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range table {
		if !kubeOwned(r) {
			continue
		}
		t.Run(r.GroupVersionResource().String(), func(t *testing.T) {
			gr := r.GroupResource()
			if got := sf.ResourcePrefix(gr); got != r.KeyPrefix {
				t.Errorf("key prefix: kube-apiserver %q, table %q", got, r.KeyPrefix)
			}
			internal, err := legacyscheme.Scheme.New(schema.GroupVersionKind{Group: r.Group, Version: runtime.APIVersionInternal, Kind: r.Kind})
			if err != nil {
				t.Fatalf("internal kind: %v", err)
			}
			m := internal.(metav1.Object)
			m.SetName("x")
			if r.Namespaced {
				m.SetNamespace("ns")
			}
			sc, err := sf.NewConfig(gr, internal)
			if err != nil {
				t.Fatal(err)
			}
			stored, err := runtime.Encode(sc.Codec, internal)
			if err != nil {
				t.Fatalf("kube-apiserver's storage codec: %v", err)
			}
			key := r.Key("/registry", m.GetNamespace(), m.GetName())
			obj, err := codec.Decode(context.Background(), r, []byte(key), stored, 17)
			if err != nil {
				t.Fatalf("reading what kube-apiserver stores (table says %v): %v", r.StorageGVK(), err)
			}
			if obj.Name != "x" || obj.ResourceVersion != 17 {
				t.Errorf("decoded %s/%s at %d", obj.Namespace, obj.Name, obj.ResourceVersion)
			}
		})
	}
}

func TestFieldLabelsMatchKubeAPIServer(t *testing.T) {
	table := storage.Builtins()
	// Candidates: every label any kind accepts, plus a few no kind does.
	candidates := map[string]bool{"spec.containers": true, "status": true, "metadata.labels": true, "name": true}
	for _, r := range table {
		for l := range r.FieldLabels {
			candidates[l] = true
		}
	}
	for _, r := range table {
		if !kubeOwned(r) {
			continue
		}
		for _, label := range slices.Sorted(maps.Keys(candidates)) {
			mapped, _, err := legacyscheme.Scheme.ConvertFieldLabel(r.ServedGVK(), label, "v")
			got, ok := r.FieldLabels[label]
			switch {
			case err == nil && !ok:
				t.Errorf("%s: kube-apiserver accepts %q, table does not", r.GroupVersionResource(), label)
			case err != nil && ok:
				t.Errorf("%s: table accepts %q, kube-apiserver does not (%v)", r.GroupVersionResource(), label, err)
			case err == nil && mapped != got:
				t.Errorf("%s: %q maps to %q in kube-apiserver, %q in the table", r.GroupVersionResource(), label, mapped, got)
			}
		}
	}
}

// notStored are GA kinds with a List type that kube-apiserver serves without
// keeping them in etcd, or does not serve by default.
var notStored = map[schema.GroupVersionKind]string{
	{Version: "v1", Kind: "ComponentStatus"}: "computed from health checks on every request",
	{Version: "v1", Kind: "APIGroup"}:        "discovery document (meta types registered in the core group)",
}

func TestEveryStoredGAKindIsInTheTable(t *testing.T) {
	served := map[schema.GroupVersionKind]bool{}
	for _, r := range storage.Builtins() {
		served[r.ServedGVK()] = true
	}
	for gvk := range legacyscheme.Scheme.AllKnownTypes() {
		base, isList := strings.CutSuffix(gvk.Kind, "List")
		if !isList || gvk.Version == runtime.APIVersionInternal || strings.Contains(gvk.Version, "alpha") || strings.Contains(gvk.Version, "beta") {
			continue
		}
		want := gvk.GroupVersion().WithKind(base)
		if _, ok := legacyscheme.Scheme.AllKnownTypes()[want]; !ok || served[want] || notStored[want] != "" {
			continue
		}
		t.Errorf("%v is a GA kind of kube-apiserver's scheme but not in the table", want)
	}
}
