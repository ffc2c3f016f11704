package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// testCRD is a served, Established CRD of widgets.example.com as
// kube-apiserver serves it (apiextensions.k8s.io/v1), with one selectable
// field and printer columns.
func testCRD(edit func(*apiextensionsv1.CustomResourceDefinition)) []byte {
	crd := &apiextensionsv1.CustomResourceDefinition{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"},
		ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.com", ResourceVersion: "7"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "example.com", Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{
				{Name: "v1beta1", Served: true, Schema: objectSchema()},
				{Name: "v1", Served: true, Storage: true, Schema: objectSchema(),
					SelectableFields: []apiextensionsv1.SelectableField{{JSONPath: ".spec.color"}},
					AdditionalPrinterColumns: []apiextensionsv1.CustomResourceColumnDefinition{
						{Name: "Color", Type: "string", JSONPath: ".spec.color"},
						{Name: "Size", Type: "integer", JSONPath: ".spec.size", Priority: 1},
					}},
			},
			Conversion: &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.NoneConverter},
		},
		Status: apiextensionsv1.CustomResourceDefinitionStatus{
			AcceptedNames: apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList",
				ShortNames: []string{"wd"}, Categories: []string{"all"}},
			Conditions: []apiextensionsv1.CustomResourceDefinitionCondition{
				{Type: apiextensionsv1.NamesAccepted, Status: apiextensionsv1.ConditionTrue},
				{Type: apiextensionsv1.Established, Status: apiextensionsv1.ConditionTrue},
			},
			StoredVersions: []string{"v1"},
		},
	}
	if edit != nil {
		edit(crd)
	}
	b, err := json.Marshal(crd)
	if err != nil {
		panic(err)
	}
	return b
}

// objectSchema is an object of any fields (kube-apiserver would prune any
// field a schema does not know, on write and on read).
func objectSchema() *apiextensionsv1.CustomResourceValidation {
	return &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: new(true)}}
}

func TestCustomResources(t *testing.T) {
	name, rs, err := CustomResources(testCRD(nil))
	if err != nil || name != "widgets.example.com" || len(rs) != 1 {
		t.Fatalf("CustomResources = %q %d resources, %v", name, len(rs), err)
	}
	r := rs[0]
	if r.Group != "example.com" || r.Version != "v1" || r.Kind != "Widget" || r.Plural != "widgets" || r.Singular != "widget" ||
		!r.Namespaced || r.Key != "example.com/widgets" || strings.Join(r.ShortNames, ",") != "wd" || strings.Join(r.Categories, ",") != "all" {
		t.Errorf("resource: %+v", r)
	}
	if len(r.Fields) != 1 || r.Fields[0].Name != "spec.color" {
		t.Errorf("fields: %+v", r.Fields)
	}
	if !r.Custom() || r.CRDName() != "widgets.example.com" || !r.Discoverable() || !r.custom.rewriteVersion {
		t.Errorf("custom info: %+v", r.custom)
	}
	_, terminating, _ := CustomResources(testCRD(func(c *apiextensionsv1.CustomResourceDefinition) {
		c.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	}))
	if len(terminating) != 1 || !sameResource(&r, &terminating[0]) {
		t.Errorf("a terminating CRD's resource is served differently: %+v", terminating)
	}

	cases := []struct {
		name    string
		edit    func(*apiextensionsv1.CustomResourceDefinition)
		served  bool
		invalid bool
	}{
		{"names not accepted yet", func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Status.Conditions, c.Status.AcceptedNames = nil, apiextensionsv1.CustomResourceDefinitionNames{}
		}, false, false},
		{"accepted, not established", func(c *apiextensionsv1.CustomResourceDefinition) { c.Status.Conditions = c.Status.Conditions[:1] }, true, false},
		{"storage version not served", func(c *apiextensionsv1.CustomResourceDefinition) { c.Spec.Versions[1].Served = false }, false, false},
		{"webhook, one stored version", func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Spec.Conversion = &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.WebhookConverter}
		}, true, false},
		{"webhook, objects in another version", func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Spec.Conversion = &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.WebhookConverter}
			c.Status.StoredVersions = []string{"v1beta1", "v1"}
		}, false, false},
		{"no storage version", func(c *apiextensionsv1.CustomResourceDefinition) { c.Spec.Versions[1].Storage = false }, false, true},
		{"two storage versions", func(c *apiextensionsv1.CustomResourceDefinition) { c.Spec.Versions[0].Storage = true }, false, true},
		{"name not plural.group", func(c *apiextensionsv1.CustomResourceDefinition) { c.Name = "gadgets.example.com" }, false, true},
		{"group without a dot", func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Spec.Group, c.Name = "example", "widgets.example"
		}, false, true},
		{"bad scope", func(c *apiextensionsv1.CustomResourceDefinition) { c.Spec.Scope = "Galaxy" }, false, true},
		{"schema not an object", func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Spec.Versions[1].Schema.OpenAPIV3Schema.Type = "string"
		}, false, true},
		{"no schema (a legacy v1beta1 CRD)", func(c *apiextensionsv1.CustomResourceDefinition) { c.Spec.Versions[1].Schema = nil }, true, false},
		{"selectable field not a path", func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Spec.Versions[1].SelectableFields = []apiextensionsv1.SelectableField{{JSONPath: "spec.color"}}
		}, false, true},
		{"selectable field with an index", func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Spec.Versions[1].SelectableFields = []apiextensionsv1.SelectableField{{JSONPath: ".spec.items[0]"}}
		}, false, true},
		{"printer column unparsable", func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Spec.Versions[1].AdditionalPrinterColumns[0].JSONPath = ".spec[["
		}, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, rs, err := CustomResources(testCRD(tc.edit))
			if tc.invalid != (err != nil) || err != nil && !errors.Is(err, ErrInvalidCRD) {
				t.Fatalf("err = %v, want invalid %v", err, tc.invalid)
			}
			if tc.served != (len(rs) == 1) {
				t.Errorf("%d resources, want served %v", len(rs), tc.served)
			}
		})
	}
	for _, bad := range []string{"", "[]", "{", `{"spec":7}`} {
		if _, _, err := CustomResources([]byte(bad)); !errors.Is(err, ErrInvalidCRD) {
			t.Errorf("CustomResources(%q) = %v, want ErrInvalidCRD", bad, err)
		}
	}
}

// TestCustomResourceWarning: a deprecated storage version's requests carry
// apiextensions-apiserver's Warning: the CRD's deprecationWarning, or its
// default naming the newest served version that is not deprecated.
func TestCustomResourceWarning(t *testing.T) {
	text := func(s string) *string { return &s }
	for _, tc := range []struct {
		name string
		edit func(*apiextensionsv1.CustomResourceDefinition)
		want string
	}{
		{"not deprecated", nil, ""},
		{"deprecated, no newer version", func(c *apiextensionsv1.CustomResourceDefinition) { c.Spec.Versions[1].Deprecated = true },
			`299 - "example.com/v1 Widget is deprecated"`},
		{"deprecated, newer ones served", func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Spec.Versions[0].Storage, c.Spec.Versions[1].Storage = true, false
			c.Spec.Versions[0].Deprecated = true
			c.Spec.Versions = append(c.Spec.Versions,
				apiextensionsv1.CustomResourceDefinitionVersion{Name: "v2alpha1", Served: true, Schema: objectSchema()},
				apiextensionsv1.CustomResourceDefinitionVersion{Name: "v3", Served: false, Schema: objectSchema()},
				apiextensionsv1.CustomResourceDefinitionVersion{Name: "v4", Served: true, Deprecated: true, Schema: objectSchema()})
		}, `299 - "example.com/v1beta1 Widget is deprecated; use example.com/v1 Widget"`},
		{"the CRD's own warning", func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Spec.Versions[1].Deprecated, c.Spec.Versions[1].DeprecationWarning = true, text(`widgets are "going away"`)
		}, `299 - "widgets are \"going away\""`},
		{"an empty warning", func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Spec.Versions[1].Deprecated, c.Spec.Versions[1].DeprecationWarning = true, text("")
		}, ""},
	} {
		_, rs, err := CustomResources(testCRD(tc.edit))
		if err != nil || len(rs) != 1 {
			t.Fatalf("%s: %d resources, %v", tc.name, len(rs), err)
		}
		if got := rs[0].Warning(); got != tc.want {
			t.Errorf("%s: Warning() = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestRegistryCustomResources(t *testing.T) {
	g := defaultRegistry(t)
	_, widgets, err := CustomResources(testCRD(nil))
	if err != nil {
		t.Fatal(err)
	}
	gen := g.Generation()
	if changed, err := g.SetCRD("widgets.example.com", widgets); !changed || err != nil {
		t.Fatalf("SetCRD = %v, %v", changed, err)
	}
	if g.Generation() == gen {
		t.Error("generation did not change")
	}
	r, ok := g.Lookup("example.com", "v1", "widgets")
	if !ok || r.ID() != "widgets.example.com" {
		t.Fatalf("Lookup: %v %v", r, ok)
	}
	if byID, _ := g.ByID("widgets.example.com"); byID != r {
		t.Error("ByID returns another resource")
	}
	if _, ok := g.Lookup("example.com", "v1beta1", "widgets"); ok {
		t.Error("a version other than the storage version is served")
	}
	if got, ns, name, ok := g.ParseKey("/registry/example.com/widgets/shop/w1"); got != r || ns != "shop" || name != "w1" || !ok {
		t.Errorf("ParseKey = %v %q %q %v", got, ns, name, ok)
	}
	if got, _, _, ok := g.ParseKey("/registry/example.com/widgets/w1"); got != r || ok {
		t.Errorf("ParseKey of a key without a namespace = %v %v", got, ok)
	}
	if got, _, _, _ := g.ParseKey("/registry/example.com/gadgets/shop/g1"); got != nil {
		t.Errorf("ParseKey of an unknown custom resource = %v", got)
	}
	if got, _, _, ok := g.ParseKey("/registry/pods/default/web-0"); got == nil || got.ID() != "pods" || !ok {
		t.Errorf("ParseKey of a pod = %v %v", got, ok)
	}
	if n := len(g.Resources()); n != len(g.StaticResources())+1 {
		t.Errorf("%d resources, want the static ones and the custom one", n)
	}
	// A status change of the CRD that serves the same keeps the resource.
	_, same, _ := CustomResources(testCRD(func(c *apiextensionsv1.CustomResourceDefinition) { c.ResourceVersion = "8" }))
	if changed, err := g.SetCRD("widgets.example.com", same); changed || err != nil {
		t.Errorf("SetCRD of an equal resource = %v, %v", changed, err)
	}
	if again, _ := g.ByID("widgets.example.com"); again != r {
		t.Error("an equal resource replaced the one set")
	}
	// Another CRD cannot take the same resource.
	if _, err := g.SetCRD("other.example.com", widgets); err == nil {
		t.Error("two CRDs serve one resource")
	}
	// A CRD cannot shadow a built-in resource.
	pods := widgets[0]
	pods.Group, pods.Plural, pods.Key = "", "pods", "pods"
	if _, err := g.SetCRD("pods.", []Resource{pods}); err == nil {
		t.Error("a CRD serves pods")
	}
	if !g.RemoveCRD("widgets.example.com") {
		t.Error("RemoveCRD removed nothing")
	}
	if _, ok := g.ByID("widgets.example.com"); ok {
		t.Error("removed resource still served")
	}
	if got, _, _, _ := g.ParseKey("/registry/example.com/widgets/shop/w1"); got != nil {
		t.Error("removed resource still parses keys")
	}
	// ReplaceCRDs sets them all, leaving out those refused.
	if changed, err := g.ReplaceCRDs(map[string][]Resource{"widgets.example.com": widgets, "pods.": {pods}}); !changed || err == nil {
		t.Errorf("ReplaceCRDs = %v, %v", changed, err)
	}
	if _, ok := g.ByID("widgets.example.com"); !ok || len(g.CustomResources()) != 1 {
		t.Errorf("after ReplaceCRDs: %d custom resources", len(g.CustomResources()))
	}
	if changed, _ := g.ReplaceCRDs(nil); !changed || len(g.CustomResources()) != 0 {
		t.Error("ReplaceCRDs(nil) left custom resources")
	}
}

// TestDecodeCustomResourceOtherVersion: an object stored in another version
// of the kind is served in the storage version with the None conversion
// strategy (kube-apiserver rewrites only its apiVersion), and skipped when
// only the CRD's conversion webhook could convert it.
func TestDecodeCustomResourceOtherVersion(t *testing.T) {
	d, _ := testDecoder(t, "")
	in := `{"apiVersion":"example.com/v1beta1","kind":"Widget","metadata":{"name":"w","namespace":"shop"},"spec":{"color":"red"}}`
	for _, tc := range []struct {
		name    string
		edit    func(*apiextensionsv1.CustomResourceDefinition)
		want    string
		invalid string
	}{
		{"none", nil, `{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"generation":1,"name":"w","namespace":"shop","resourceVersion":"9"},"spec":{"color":"red"}}`, ""},
		{"webhook", func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Spec.Conversion = &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.WebhookConverter}
		}, "", ReasonWrongKind},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := defaultRegistry(t)
			_, rs, err := CustomResources(testCRD(tc.edit))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := g.SetCRD("widgets.example.com", rs); err != nil {
				t.Fatal(err)
			}
			w := mustResource(t, g, "widgets.example.com")
			o, err := d.Decode(context.Background(), w, "/registry/example.com/widgets/shop/w", "shop", "w", []byte(in), 9)
			if tc.invalid != "" {
				if Reason(err) != tc.invalid || o != nil {
					t.Fatalf("Decode = %v, %v; want %s", o, err, tc.invalid)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(o.JSON) != tc.want || o.Fields["spec.color"] != "red" {
				t.Fatalf("JSON %s fields %v\nwant %s", o.JSON, o.Fields, tc.want)
			}
		})
	}
}

// TestShardMapCustomResources: a custom resource lives, unsplit, on the
// shard holding the CRDs' partition, wherever the wildcard points.
func TestShardMapCustomResources(t *testing.T) {
	g := defaultRegistry(t)
	_, rs, err := CustomResources(testCRD(nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.SetCRD("widgets.example.com", rs); err != nil {
		t.Fatal(err)
	}
	widgets, _ := g.ByID("widgets.example.com")
	for spec, want := range map[string]string{
		"*=static:///c:1": "static:///c:1",
		CRDResourceID + "=static:///d:1;*=static:///c:1":                                                "static:///d:1",
		fmt.Sprintf("%s/%d=static:///d:1;*=static:///c:1", CRDResourceID, Partition("")):                "static:///d:1",
		fmt.Sprintf("%s/%d=static:///d:1;*=static:///c:1", CRDResourceID, (Partition("")+1)%Partitions): "static:///c:1",
	} {
		m, err := ParseShardMap(spec, g)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.All(widgets); len(got) != 1 || got[0].Target != want || got[0].Partitions != nil {
			t.Errorf("%s: All(widgets) = %+v, want %s", spec, got, want)
		}
		if got := m.For(widgets, "shop").Target; got != want {
			t.Errorf("%s: For(widgets, shop) = %s, want %s", spec, got, want)
		}
	}
}
