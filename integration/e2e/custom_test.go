package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	apiextensionsv1beta1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"herald.dev/integration/stack"
	"herald.dev/libs/kube"
)

// TestCustomResource serves a custom resource from a registry file: it is
// discovered, listed, watched, and kubectl finds it.
func TestCustomResource(t *testing.T) {
	res := append(kube.DefaultResources(), kube.Resource{
		Group: "example.com", Version: "v1", Kind: "Widget", Plural: "widgets", ShortNames: []string{"wd"},
		Namespaced: true, Key: "example.com/widgets", Fields: []kube.Field{{Name: "spec.size"}},
	})
	b, _ := json.Marshal(map[string]any{"resources": res})
	file := filepath.Join(t.TempDir(), "resources.json")
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
	flag := "--resources-file=" + file
	e := startStack(t, stack.Options{Flags: map[string][]string{"ingest": {flag}, "cache": {flag}, "fanout": {flag}, "frontdoor": {flag}}})
	ctx := testContext(t, time.Minute)

	var list podList
	e.get(t, "/apis/example.com/v1/widgets", &list)
	_, evs := e.openWatch(t, ctx, "/apis/example.com/v1/namespaces/shop/widgets?watch=true&fieldSelector=spec.size%3Dlarge&resourceVersion="+list.Metadata.ResourceVersion)
	put := func(name, size string) int64 {
		v, _ := json.Marshal(map[string]any{"apiVersion": "example.com/v1", "kind": "Widget",
			"metadata": map[string]any{"name": name, "namespace": "shop"}, "spec": map[string]any{"size": size}})
		resp, err := e.etcd.Put(ctx, "/registry/example.com/widgets/shop/"+name, string(v))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	put("small-one", "small")
	rev := put("big-one", "large")
	got := collect(t, ctx, evs, rev)
	if len(got) != 1 || got[0].Key != "shop/big-one" || got[0].Type != "ADDED" {
		t.Fatalf("widget watch saw %+v", got)
	}

	var groups struct {
		Groups []struct {
			Name string `json:"name"`
		} `json:"groups"`
	}
	e.get(t, "/apis", &groups)
	var gs []string
	for _, g := range groups.Groups {
		gs = append(gs, g.Name)
	}
	want, _ := builtinGroups()
	want = append(want, "example.com")
	slices.Sort(want)
	if !slices.Equal(gs, want) {
		t.Errorf("/apis groups %v, want %v", gs, want)
	}
	var wl struct {
		Kind       string            `json:"kind"`
		APIVersion string            `json:"apiVersion"`
		Items      []json.RawMessage `json:"items"`
	}
	e.get(t, "/apis/example.com/v1/namespaces/shop/widgets", &wl)
	if wl.Kind != "WidgetList" || wl.APIVersion != "example.com/v1" || len(wl.Items) != 2 {
		t.Errorf("widget list: %s %s %d items", wl.Kind, wl.APIVersion, len(wl.Items))
	}
	// Custom resources have no protobuf of their own (kube-apiserver's
	// CRD handler): 406 when only protobuf is acceptable (its Status in
	// protobuf, as the handler writes errors), JSON when JSON is
	// acceptable too, and their metadata in protobuf.
	for _, tc := range []struct {
		accept, ct string
		code       int
	}{
		{protobufType, protobufType, 406},
		{protobufType + ",application/json", "application/json", 200},
		{protobufType + ";as=PartialObjectMetadataList;g=meta.k8s.io;v=v1", protobufType, 200},
	} {
		code, hdr, body := e.do(t, "/apis/example.com/v1/namespaces/shop/widgets", map[string]string{"Accept": tc.accept})
		if code != tc.code || hdr.Get("Content-Type") != tc.ct {
			t.Errorf("widgets as %s: %d %s %q", tc.accept, code, hdr.Get("Content-Type"), body)
		}
	}
	if kubectl, err := exec.LookPath("kubectl"); err == nil {
		out, err := exec.CommandContext(ctx, kubectl, "--kubeconfig", e.Kubeconfig, "get", "wd", "-A", "-o", "name").CombinedOutput()
		if err != nil || string(out) != "widget.example.com/big-one\nwidget.example.com/small-one\n" {
			t.Errorf("kubectl get wd -A: %v\n%s", err, out)
		}
	}
}

// TestCRDLearnedFromStream: a CRD written to etcd as kube-apiserver stores
// it (apiextensions.k8s.io/v1beta1 JSON) while the stack runs is learned
// from the stream: its custom resource becomes listable, watchable (with
// its selectable field), discoverable and printable with its columns, the
// CRD itself is served as v1, an invalid CRD is skipped and counted, and
// deleting the CRD stops serving its resource and ends its watches.
func TestCRDLearnedFromStream(t *testing.T) {
	e := startStack(t, stack.Options{})
	ctx := testContext(t, 2*time.Minute)
	const path = "/apis/example.org/v1/namespaces/shop/gadgets"
	if code, body := e.getRaw(t, path); code != http.StatusNotFound {
		t.Fatalf("before the CRD: %d %s", code, body)
	}
	crd := func(scope string) string {
		b, _ := json.Marshal(&apiextensionsv1beta1.CustomResourceDefinition{
			TypeMeta:   metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1beta1", Kind: "CustomResourceDefinition"},
			ObjectMeta: metav1.ObjectMeta{Name: "gadgets.example.org", UID: "0c1e5a4e-3b7e-4c55-9d1e-2f1f0f6e6a01", CreationTimestamp: metav1.Now()},
			Spec: apiextensionsv1beta1.CustomResourceDefinitionSpec{
				Group: "example.org", Scope: apiextensionsv1beta1.ResourceScope(scope),
				Names: apiextensionsv1beta1.CustomResourceDefinitionNames{Plural: "gadgets", Singular: "gadget", Kind: "Gadget", ListKind: "GadgetList", ShortNames: []string{"gd"}},
				Versions: []apiextensionsv1beta1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
					Schema:           &apiextensionsv1beta1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1beta1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptrTo(true)}},
					SelectableFields: []apiextensionsv1beta1.SelectableField{{JSONPath: ".spec.color"}},
					AdditionalPrinterColumns: []apiextensionsv1beta1.CustomResourceColumnDefinition{
						{Name: "Color", Type: "string", JSONPath: ".spec.color"}, {Name: "Age", Type: "date", JSONPath: ".metadata.creationTimestamp"}}}},
			},
			Status: apiextensionsv1beta1.CustomResourceDefinitionStatus{
				AcceptedNames: apiextensionsv1beta1.CustomResourceDefinitionNames{Plural: "gadgets", Singular: "gadget", Kind: "Gadget", ListKind: "GadgetList", ShortNames: []string{"gd"}},
				Conditions: []apiextensionsv1beta1.CustomResourceDefinitionCondition{
					{Type: apiextensionsv1beta1.NamesAccepted, Status: apiextensionsv1beta1.ConditionTrue},
					{Type: apiextensionsv1beta1.Established, Status: apiextensionsv1beta1.ConditionTrue}},
				StoredVersions: []string{"v1"},
			},
		})
		return string(b)
	}
	const crdKey = "/registry/apiextensions.k8s.io/customresourcedefinitions/gadgets.example.org"
	if _, err := e.etcd.Put(ctx, crdKey, crd("Namespaced")); err != nil {
		t.Fatal(err)
	}
	var list podList
	eventually(t, ctx, "the CRD's resource is listable", func() string {
		if code, body := e.getRaw(t, path); code != http.StatusOK {
			return fmt.Sprintf("list: %d %s", code, body)
		}
		return ""
	})
	e.get(t, path, &list)
	var served struct {
		APIVersion string `json:"apiVersion"`
		Spec       struct {
			Versions []struct {
				AdditionalPrinterColumns []struct {
					JSONPath string `json:"jsonPath"`
				} `json:"additionalPrinterColumns"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if code := e.get(t, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gadgets.example.org", &served); code != http.StatusOK ||
		served.APIVersion != "apiextensions.k8s.io/v1" || len(served.Spec.Versions) != 1 || len(served.Spec.Versions[0].AdditionalPrinterColumns) != 2 {
		t.Errorf("the CRD as served: %d %+v", code, served)
	}
	var disc metav1.APIResourceList
	eventually(t, ctx, "the CRD's resource is discoverable", func() string {
		disc = metav1.APIResourceList{}
		code, body := e.getRaw(t, "/apis/example.org/v1")
		if code != http.StatusOK {
			return fmt.Sprintf("discovery: %d", code)
		}
		return fmt.Sprint(json.Unmarshal([]byte(body), &disc))[:0]
	})
	if len(disc.APIResources) != 1 || disc.APIResources[0].Name != "gadgets" || disc.APIResources[0].Kind != "Gadget" ||
		!disc.APIResources[0].Namespaced || !slices.Equal(disc.APIResources[0].ShortNames, []string{"gd"}) {
		t.Errorf("discovery: %+v", disc.APIResources)
	}

	_, evs := e.openWatch(t, ctx, path+"?watch=true&fieldSelector=spec.color%3Dred&resourceVersion="+list.Metadata.ResourceVersion)
	put := func(name, color string) int64 {
		v, _ := json.Marshal(map[string]any{"apiVersion": "example.org/v1", "kind": "Gadget",
			"metadata": map[string]any{"name": name, "namespace": "shop", "creationTimestamp": "2026-01-01T00:00:00Z"}, "spec": map[string]any{"color": color}})
		resp, err := e.etcd.Put(ctx, "/registry/example.org/gadgets/shop/"+name, string(v))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	put("blue-one", "blue")
	rev := put("red-one", "red")
	if got := collect(t, ctx, evs, rev); len(got) != 1 || got[0].Key != "shop/red-one" || got[0].Type != "ADDED" {
		t.Fatalf("gadget watch saw %+v", got)
	}
	code, _, body := e.do(t, path, map[string]string{"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})
	var table metav1.Table
	if err := json.Unmarshal([]byte(body), &table); code != http.StatusOK || err != nil {
		t.Fatalf("table: %d %v %s", code, err, body)
	}
	var cols []string
	for _, c := range table.ColumnDefinitions {
		cols = append(cols, c.Name)
	}
	if !slices.Equal(cols, []string{"Name", "Color", "Age"}) || len(table.Rows) != 2 || table.Rows[1].Cells[0] != "red-one" || table.Rows[1].Cells[1] != "red" {
		t.Errorf("table columns %v rows %+v", cols, table.Rows)
	}

	// A CRD Herald cannot serve (an unknown scope) is skipped and counted;
	// the resource is not served meanwhile.
	if _, err := e.etcd.Put(ctx, crdKey, crd("Galaxy")); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "the invalid CRD is counted", func() string {
		if n := metricLabeled(t, e.Proc("cache-0"), "herald_cache_undecodable_values_total", `reason="invalid_crd"`); n != 1 {
			return fmt.Sprintf("invalid_crd: %v", n)
		}
		return ""
	})
	for ev := range evs {
		if ev.Type == "ERROR" || ev.Type == "DECODE-ERROR" {
			t.Errorf("the watch ended with %s", ev.Object)
		}
	}
	eventually(t, ctx, "an invalid CRD's resource is not served", func() string {
		if code, _ := e.getRaw(t, path); code != http.StatusNotFound {
			return fmt.Sprintf("list: %d", code)
		}
		return ""
	})
	// Valid again, then deleted.
	if _, err := e.etcd.Put(ctx, crdKey, crd("Namespaced")); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "the CRD's resource is served again, with its objects", func() string {
		list = podList{}
		code, body := e.getRaw(t, path)
		if code != http.StatusOK {
			return fmt.Sprintf("list: %d", code)
		}
		if err := json.Unmarshal([]byte(body), &list); err != nil || len(list.Items) != 2 {
			return fmt.Sprintf("list: %v, %d items", err, len(list.Items))
		}
		return ""
	})
	if _, err := e.etcd.Delete(ctx, crdKey); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "a deleted CRD's resource is not served", func() string {
		if code, _ := e.getRaw(t, path); code != http.StatusNotFound {
			return fmt.Sprintf("list: %d", code)
		}
		if code, _ := e.getRaw(t, "/apis/example.org/v1"); code != http.StatusNotFound {
			return fmt.Sprintf("discovery: %d", code)
		}
		return ""
	})
}

func ptrTo[T any](v T) *T { return &v }
