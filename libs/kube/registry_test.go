package kube

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"herald.dev/libs/storage"
)

// TestDefaultRegistryIsTheBuiltinTable: every built-in resource Herald can
// serve in its stored version is registered with kube-apiserver's key
// layout, scope, short names, categories and field labels; the ones that
// need a conversion are not.
func TestDefaultRegistryIsTheBuiltinTable(t *testing.T) {
	g := defaultRegistry(t)
	served := 0
	for _, st := range storage.Builtins() {
		r, ok := g.Lookup(st.Group, st.Version, st.Resource)
		if st.NeedsConversion() {
			if ok {
				t.Errorf("%s needs a conversion but is served", st.GroupVersionResource())
			}
			continue
		}
		served++
		if !ok {
			t.Errorf("%s is not served", st.GroupVersionResource())
			continue
		}
		if r.Kind != st.Kind || r.Namespaced != st.Namespaced || r.KeyPrefix() != "/registry/"+st.KeyPrefix+"/" ||
			!slices.Equal(r.ShortNames, st.ShortNames) || !slices.Equal(r.Categories, st.Categories) {
			t.Errorf("%s: %+v, table %+v", r.ID(), r, st)
		}
		if r.Stored().StorageGVK() != st.StorageGVK() {
			t.Errorf("%s decodes as %v, stored as %v", r.ID(), r.Stored().StorageGVK(), st.StorageGVK())
		}
		for label, field := range st.FieldLabels {
			if !r.Selectable(label) {
				t.Errorf("%s: field label %s not selectable", r.ID(), label)
			}
			i := slices.IndexFunc(r.Fields, func(f Field) bool { return f.Name == label })
			if i >= 0 && (r.Fields[i].Path != field || !r.computed[i]) {
				t.Errorf("%s: field %s reads %s (computed %v), want %s", r.ID(), label, r.Fields[i].Path, r.computed[i], field)
			}
		}
		for _, f := range r.Fields {
			if _, ok := st.FieldLabels[f.Name]; !ok {
				t.Errorf("%s: field %s is not one kube-apiserver accepts", r.ID(), f.Name)
			}
		}
	}
	if len(g.Resources()) != served || served < 50 {
		t.Errorf("%d resources registered, %d built-in served", len(g.Resources()), served)
	}
	for _, tc := range []struct{ id, key string }{
		{"services", "/registry/services/specs/"}, {"endpoints", "/registry/services/endpoints/"},
		{"nodes", "/registry/minions/"}, {"ingresses.networking.k8s.io", "/registry/ingress/"},
		{"replicationcontrollers", "/registry/controllers/"}, {"deployments.apps", "/registry/deployments/"},
	} {
		if r, ok := g.ByID(tc.id); !ok || r.KeyPrefix() != tc.key {
			t.Errorf("%s: key prefix %v", tc.id, r)
		}
	}
	pods, _ := g.ByID("pods")
	for _, f := range []string{"spec.host", "spec.nodeName", "status.phase", "metadata.namespace"} {
		if !pods.Selectable(f) {
			t.Errorf("pods: %s not selectable", f)
		}
	}
	if _, ok := g.Lookup("autoscaling", "v1", "horizontalpodautoscalers"); ok {
		t.Error("autoscaling/v1 HPAs (stored as v2) are served")
	}
	// events.k8s.io Events are core Events converted: keys parse to the
	// core resource, whose readers include them, and they read its stream.
	ev, ok := g.Lookup("events.k8s.io", "v1", "events")
	core, _ := g.ByID("events")
	if !ok {
		t.Fatal("events.k8s.io events are not served")
	}
	if r, _, _, _ := g.ParseKey("/registry/events/ns/e"); r != core || !slices.Equal(core.Readers(), []*Resource{core, ev}) || ev.KeyOwner() != core {
		t.Errorf("events.k8s.io events: key parsed to %v, readers %v, key owner %v", r.ID(), core.Readers(), ev.KeyOwner().ID())
	}
}

// TestRegistryFile: a registry file narrows the built-in resources (an
// entry names a built-in by group, version and plural and inherits its
// layout) or extends them (custom resources); DefaultResources written to a
// file read back the same; contradictions with the table are refused.
func TestRegistryFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	narrow := write("narrow.json", map[string]any{"resources": []map[string]any{
		{"version": "v1", "kind": "Service", "plural": "services", "namespaced": true},
		{"version": "v1", "kind": "Pod", "plural": "pods", "namespaced": true, "fields": []Field{{Name: "spec.nodeName"}}},
		{"group": "example.com", "version": "v1", "kind": "Widget", "plural": "widgets", "namespaced": true,
			"key": "example.com/widgets", "fields": []Field{{Name: "spec.size"}}},
	}})
	g, err := LoadRegistry(narrow, DefaultPrefix)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(g.Resources()); n != 3 {
		t.Fatalf("%d resources", n)
	}
	svc, _ := g.ByID("services")
	if svc.KeyPrefix() != "/registry/services/specs/" || !slices.Equal(svc.ShortNames, []string{"svc"}) || !svc.Selectable("spec.clusterIP") {
		t.Errorf("services from a file: %+v", svc)
	}
	pods, _ := g.ByID("pods")
	if !pods.Selectable("spec.nodeName") || pods.Selectable("status.phase") || !pods.computed[0] {
		t.Errorf("pods from a file: fields %+v computed %v", pods.Fields, pods.computed)
	}
	w, _ := g.ByID("widgets.example.com")
	if w.KeyPrefix() != "/registry/example.com/widgets/" || w.Stored().StorageGVK().Kind != "Widget" || w.computed[0] {
		t.Errorf("widgets: %+v", w)
	}

	all := write("all.json", map[string]any{"resources": DefaultResources()})
	back, err := LoadRegistry(all, DefaultPrefix)
	if err != nil {
		t.Fatal(err)
	}
	def := defaultRegistry(t)
	if len(back.Resources()) != len(def.Resources()) {
		t.Fatalf("read back %d resources, want %d", len(back.Resources()), len(def.Resources()))
	}
	for i, r := range def.Resources() {
		b := back.Resources()[i]
		if b.ID() != r.ID() || b.KeyPrefix() != r.KeyPrefix() || !slices.Equal(b.Fields, r.Fields) || !slices.Equal(b.computed, r.computed) ||
			!slices.Equal(b.Categories, r.Categories) || b.Stored().StorageGVK() != r.Stored().StorageGVK() || b.Stored().KeyPrefix != r.Stored().KeyPrefix {
			t.Errorf("%s read back as %+v", r.ID(), b)
		}
	}

	for name, bad := range map[string]map[string]any{
		"needs a conversion": {"group": "autoscaling", "version": "v1", "kind": "HorizontalPodAutoscaler", "plural": "horizontalpodautoscalers", "namespaced": true},
		"wrong kind":         {"version": "v1", "kind": "Pood", "plural": "pods", "namespaced": true},
		"wrong scope":        {"version": "v1", "kind": "Node", "plural": "nodes", "namespaced": true},
		"no kind":            {"version": "v1", "plural": "things"},
	} {
		if _, err := LoadRegistry(write("bad.json", map[string]any{"resources": []any{bad}}), DefaultPrefix); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
