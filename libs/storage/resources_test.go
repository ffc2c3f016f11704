package storage

import (
	"errors"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

func gvr(g, v, r string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: g, Version: v, Resource: r}
}

func TestBuiltinTableKnownFacts(t *testing.T) {
	table := NewBuiltinTable()
	codec := newTestCodec(t, nil)
	tests := []struct {
		gvr        schema.GroupVersionResource
		key        string
		kind       string
		storage    schema.GroupVersionKind
		namespaced bool
		short      []string
		categories []string
		labels     []string // must be accepted
		refused    []string // must not be accepted
	}{
		{gvr: gvr("", "v1", "pods"), key: "pods", kind: "Pod", storage: schema.GroupVersionKind{Version: "v1", Kind: "Pod"},
			namespaced: true, short: []string{"po"}, categories: []string{"all"},
			labels:  []string{"metadata.name", "metadata.namespace", "spec.nodeName", "status.phase", "spec.host", "status.podIP", "spec.hostNetwork"},
			refused: []string{"spec.containers"}},
		{gvr: gvr("", "v1", "services"), key: "services/specs", kind: "Service", storage: schema.GroupVersionKind{Version: "v1", Kind: "Service"},
			namespaced: true, short: []string{"svc"}, categories: []string{"all"}, labels: []string{"spec.clusterIP", "spec.type"}},
		{gvr: gvr("", "v1", "endpoints"), key: "services/endpoints", kind: "Endpoints", storage: schema.GroupVersionKind{Version: "v1", Kind: "Endpoints"},
			namespaced: true, short: []string{"ep"}},
		{gvr: gvr("", "v1", "nodes"), key: "minions", kind: "Node", storage: schema.GroupVersionKind{Version: "v1", Kind: "Node"},
			short: []string{"no"}, labels: []string{"metadata.name", "spec.unschedulable"}, refused: []string{"metadata.namespace"}},
		{gvr: gvr("", "v1", "replicationcontrollers"), key: "controllers", kind: "ReplicationController",
			storage: schema.GroupVersionKind{Version: "v1", Kind: "ReplicationController"}, namespaced: true, short: []string{"rc"},
			categories: []string{"all"}, labels: []string{"status.replicas"}},
		{gvr: gvr("", "v1", "secrets"), key: "secrets", kind: "Secret", storage: schema.GroupVersionKind{Version: "v1", Kind: "Secret"},
			namespaced: true, labels: []string{"type"}},
		{gvr: gvr("", "v1", "namespaces"), key: "namespaces", kind: "Namespace", storage: schema.GroupVersionKind{Version: "v1", Kind: "Namespace"},
			short: []string{"ns"}, labels: []string{"status.phase", "metadata.name"}, refused: []string{"metadata.namespace"}},
		{gvr: gvr("", "v1", "events"), key: "events", kind: "Event", storage: schema.GroupVersionKind{Version: "v1", Kind: "Event"},
			namespaced: true, short: []string{"ev"}, labels: []string{"involvedObject.name", "reason", "source", "type"}},
		{gvr: gvr("events.k8s.io", "v1", "events"), key: "events", kind: "Event", storage: schema.GroupVersionKind{Version: "v1", Kind: "Event"},
			namespaced: true, short: []string{"ev"}, labels: []string{"regarding.name", "reportingController", "type"},
			refused: []string{"involvedObject.name", "source"}},
		{gvr: gvr("networking.k8s.io", "v1", "ingresses"), key: "ingress", kind: "Ingress",
			storage: schema.GroupVersionKind{Group: "networking.k8s.io", Version: "v1", Kind: "Ingress"}, namespaced: true, short: []string{"ing"}},
		{gvr: gvr("apps", "v1", "replicasets"), key: "replicasets", kind: "ReplicaSet",
			storage: schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "ReplicaSet"}, namespaced: true,
			short: []string{"rs"}, categories: []string{"all"}, refused: []string{"status.replicas"}},
		{gvr: gvr("apps", "v1", "deployments"), key: "deployments", kind: "Deployment",
			storage: schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}, namespaced: true,
			short: []string{"deploy"}, categories: []string{"all"}},
		{gvr: gvr("batch", "v1", "jobs"), key: "jobs", kind: "Job", storage: schema.GroupVersionKind{Group: "batch", Version: "v1", Kind: "Job"},
			namespaced: true, categories: []string{"all"}, labels: []string{"status.successful"}},
		{gvr: gvr("certificates.k8s.io", "v1", "certificatesigningrequests"), key: "certificatesigningrequests", kind: "CertificateSigningRequest",
			storage: schema.GroupVersionKind{Group: "certificates.k8s.io", Version: "v1", Kind: "CertificateSigningRequest"},
			short:   []string{"csr"}, labels: []string{"spec.signerName"}},
		{gvr: gvr("autoscaling", "v1", "horizontalpodautoscalers"), key: "horizontalpodautoscalers", kind: "HorizontalPodAutoscaler",
			storage:    schema.GroupVersionKind{Group: "autoscaling", Version: "v2", Kind: "HorizontalPodAutoscaler"},
			namespaced: true, short: []string{"hpa"}, categories: []string{"all"}},
		{gvr: gvr("coordination.k8s.io", "v1", "leases"), key: "leases", kind: "Lease",
			storage: schema.GroupVersionKind{Group: "coordination.k8s.io", Version: "v1", Kind: "Lease"}, namespaced: true},
		{gvr: gvr("rbac.authorization.k8s.io", "v1", "rolebindings"), key: "rolebindings", kind: "RoleBinding",
			storage: schema.GroupVersionKind{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "RoleBinding"}, namespaced: true},
		{gvr: gvr("apiextensions.k8s.io", "v1", "customresourcedefinitions"), key: "apiextensions.k8s.io/customresourcedefinitions",
			kind: "CustomResourceDefinition", storage: schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1beta1", Kind: "CustomResourceDefinition"},
			short: []string{"crd", "crds"}, categories: []string{"api-extensions"}},
		{gvr: gvr("resource.k8s.io", "v1", "resourceslices"), key: "resourceslices", kind: "ResourceSlice",
			storage: schema.GroupVersionKind{Group: "resource.k8s.io", Version: "v1", Kind: "ResourceSlice"},
			labels:  []string{"spec.nodeName", "spec.driver", "spec.pool.name"}},
	}
	for _, tt := range tests {
		t.Run(tt.gvr.String(), func(t *testing.T) {
			r := table.Lookup(tt.gvr)
			if r == nil {
				t.Fatalf("not in the table")
			}
			if r.KeyPrefix != tt.key || r.Kind != tt.kind || r.StorageGVK() != tt.storage || r.Namespaced != tt.namespaced {
				t.Errorf("got key %q kind %q storage %v namespaced %v", r.KeyPrefix, r.Kind, r.StorageGVK(), r.Namespaced)
			}
			if !slices.Equal(r.ShortNames, tt.short) || !slices.Equal(r.Categories, tt.categories) {
				t.Errorf("short names %v categories %v", r.ShortNames, r.Categories)
			}
			for _, l := range append([]string{"metadata.name"}, tt.labels...) {
				if _, ok := r.FieldLabels[l]; !ok {
					t.Errorf("field label %q not accepted", l)
				}
			}
			for _, l := range tt.refused {
				if _, ok := r.FieldLabels[l]; ok {
					t.Errorf("field label %q accepted", l)
				}
			}
		})
	}
	if got := table.Lookup(gvr("", "v1", "pods")).FieldLabels["spec.host"]; got != "spec.nodeName" {
		t.Errorf("pods spec.host maps to %q", got)
	}
	if got := table.Lookup(gvr("events.k8s.io", "v1", "events")).FieldLabels["regarding.name"]; got != "involvedObject.name" {
		t.Errorf("events.k8s.io regarding.name maps to %q", got)
	}
	// Every built-in decodes into a Go type.
	for _, r := range table.Resources() {
		if !codec.Typed(r.StorageGVK()) || !codec.Typed(r.ServedGVK()) {
			t.Errorf("%s: storage %v or served %v kind unknown to the scheme", r.GroupVersionResource(), r.StorageGVK(), r.ServedGVK())
		}
	}
	if n := len(table.Resources()); n < 60 {
		t.Errorf("only %d built-in resources", n)
	}
}

func TestBuiltinsIsACopy(t *testing.T) {
	a := Builtins()
	a[0].KeyPrefix = "changed"
	a[0].FieldLabels["x"] = "x"
	b := Builtins()
	if b[0].KeyPrefix == "changed" || b[0].FieldLabels["x"] != "" {
		t.Fatal("Builtins shares state between callers")
	}
}

func TestNewTableRefusesConflicts(t *testing.T) {
	pods := NewBuiltinTable().Lookup(gvr("", "v1", "pods"))
	dup := *pods
	if _, err := NewTable([]*Resource{pods, &dup}); err == nil {
		t.Error("duplicate resource accepted")
	}
	other := *pods
	other.Version, other.Namespaced = "v2", false
	if _, err := NewTable([]*Resource{pods, &other}); err == nil {
		t.Error("shared key prefix with another scope accepted")
	}
	bad := *pods
	bad.KeyPrefix = "/pods"
	if _, err := NewTable([]*Resource{&bad}); err == nil {
		t.Error("key prefix with a slash accepted")
	}
}

func TestParseKey(t *testing.T) {
	table := NewBuiltinTable()
	tests := []struct {
		key      string
		resource string
		ns, name string
		n        int
	}{
		{key: "/registry/pods/default/web-0", resource: "pods", ns: "default", name: "web-0", n: 1},
		{key: "/registry/services/specs/default/kubernetes", resource: "services", ns: "default", name: "kubernetes", n: 1},
		{key: "/registry/services/endpoints/default/kubernetes", resource: "endpoints", ns: "default", name: "kubernetes", n: 1},
		{key: "/registry/minions/node-7", resource: "nodes", name: "node-7", n: 1},
		{key: "/registry/ingress/ns1/web", resource: "ingresses", ns: "ns1", name: "web", n: 1},
		{key: "/registry/events/default/e1", resource: "events", ns: "default", name: "e1", n: 2},
		{key: "/registry/horizontalpodautoscalers/default/h", resource: "horizontalpodautoscalers", ns: "default", name: "h", n: 2},
		{key: "/registry/apiextensions.k8s.io/customresourcedefinitions/foos.example.com", resource: "customresourcedefinitions", name: "foos.example.com", n: 1},
	}
	for _, tt := range tests {
		ki, err := table.ParseKey("/registry", tt.key)
		if err != nil {
			t.Errorf("%s: %v", tt.key, err)
			continue
		}
		if ki.Resources[0].Resource != tt.resource || ki.Namespace != tt.ns || ki.Name != tt.name || len(ki.Resources) != tt.n {
			t.Errorf("%s: got %s %q/%q (%d resources)", tt.key, ki.Resources[0].Resource, ki.Namespace, ki.Name, len(ki.Resources))
		}
		if got := ki.Resources[0].Key("/registry", tt.ns, tt.name); got != tt.key {
			t.Errorf("Key() = %q, want %q", got, tt.key)
		}
	}
	for _, bad := range []string{
		"/registry/pods/default", "/registry/pods/default/a/b", "/registry/minions/a/b", "/registry/unknown/x",
		"/other/pods/default/a", "/registry/", "/registry/pods//a", "", "/registry/services/specs",
	} {
		if _, err := table.ParseKey("/registry", bad); !errors.Is(err, ErrUnknownKey) {
			t.Errorf("%q: err = %v, want ErrUnknownKey", bad, err)
		}
	}
}
