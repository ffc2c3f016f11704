package kube

import (
	"context"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
)

// widgetSchema is the schema of widgets with properties a and b (strings)
// and spec.color, spec.size; a and spec.size have defaults when given.
func widgetSchema(defaultA, defaultSize string) *apiextensionsv1.CustomResourceValidation {
	props := map[string]apiextensionsv1.JSONSchemaProps{
		"a": {Type: "string"},
		"b": {Type: "string"},
		"spec": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"color": {Type: "string"},
			"size":  {Type: "string"},
		}},
	}
	if defaultA != "" {
		props["a"] = apiextensionsv1.JSONSchemaProps{Type: "string", Default: &apiextensionsv1.JSON{Raw: []byte(`"` + defaultA + `"`)}}
	}
	if defaultSize != "" {
		spec := props["spec"]
		spec.Properties["size"] = apiextensionsv1.JSONSchemaProps{Type: "string", Default: &apiextensionsv1.JSON{Raw: []byte(`"` + defaultSize + `"`)}}
		props["spec"] = spec
	}
	return &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object", Properties: props}}
}

// TestDecodeCustomResourceAsStoredAndDefaulted: a stored custom resource
// reads as kube-apiserver's apiextensions server reads it from etcd: its
// CRD's schema defaults what it leaves out (a default added to the schema
// after the object was written included), fields the schema does not know
// are pruned, nulls it does not allow dropped, and an object stored in
// another version (None conversion) is defaulted from that version's
// schema and pruned to the served one's. The conformance test "custom
// resource defaulting for requests and from storage works" reads a
// default added after the write.
func TestDecodeCustomResourceAsStoredAndDefaulted(t *testing.T) {
	d, _ := testDecoder(t, "")
	const key = "/registry/example.com/widgets/shop/w"
	for _, tc := range []struct {
		name string
		edit func(*apiextensionsv1.CustomResourceDefinition)
		in   string
		want string
	}{
		{"no defaults", func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Spec.Versions[1].Schema = widgetSchema("", "")
		}, `{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w","namespace":"shop"},"spec":{"color":"red"}}`,
			`{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"generation":1,"name":"w","namespace":"shop","resourceVersion":"9"},"spec":{"color":"red"}}`},
		{"defaults added after the write", func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Spec.Versions[1].Schema = widgetSchema("A", "M")
		}, `{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"generation":3,"name":"w","namespace":"shop"},"spec":{"color":"red"}}`,
			`{"a":"A","apiVersion":"example.com/v1","kind":"Widget","metadata":{"generation":3,"name":"w","namespace":"shop","resourceVersion":"9"},"spec":{"color":"red","size":"M"}}`},
		{"a value is not defaulted over", func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Spec.Versions[1].Schema = widgetSchema("A", "M")
		}, `{"a":"x","apiVersion":"example.com/v1","kind":"Widget","metadata":{"generation":1,"name":"w","namespace":"shop"},"spec":{"size":"S"}}`,
			`{"a":"x","apiVersion":"example.com/v1","kind":"Widget","metadata":{"generation":1,"name":"w","namespace":"shop","resourceVersion":"9"},"spec":{"size":"S"}}`},
		{"unknown fields pruned, disallowed nulls dropped", func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Spec.Versions[1].Schema = widgetSchema("", "")
		}, `{"apiVersion":"example.com/v1","b":null,"junk":1,"kind":"Widget","metadata":{"generation":1,"name":"w","namespace":"shop"},"spec":{"color":"red","old":true}}`,
			`{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"generation":1,"name":"w","namespace":"shop","resourceVersion":"9"},"spec":{"color":"red"}}`},
		{"unknown fields kept where the schema preserves them", func(c *apiextensionsv1.CustomResourceDefinition) {
			s := widgetSchema("A", "")
			s.OpenAPIV3Schema.XPreserveUnknownFields = new(true)
			c.Spec.Versions[1].Schema = s
		}, `{"apiVersion":"example.com/v1","junk":1,"kind":"Widget","metadata":{"generation":1,"name":"w","namespace":"shop"}}`,
			`{"a":"A","apiVersion":"example.com/v1","junk":1,"kind":"Widget","metadata":{"generation":1,"name":"w","namespace":"shop","resourceVersion":"9"}}`},
		{"stored in another version", func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Spec.Versions[0].Schema = widgetSchema("A", "")
			old := c.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties
			old["legacy"] = apiextensionsv1.JSONSchemaProps{Type: "string"}
			c.Spec.Versions[1].Schema = widgetSchema("", "M")
		}, `{"apiVersion":"example.com/v1beta1","kind":"Widget","legacy":"l","metadata":{"generation":1,"name":"w","namespace":"shop"},"spec":{"color":"red"}}`,
			// Defaulted from v1beta1's schema (a), not v1's (spec.size);
			// legacy, unknown to v1, pruned.
			`{"a":"A","apiVersion":"example.com/v1","kind":"Widget","metadata":{"generation":1,"name":"w","namespace":"shop","resourceVersion":"9"},"spec":{"color":"red"}}`},
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
			o, err := d.Decode(context.Background(), w, key, "shop", "w", []byte(tc.in), 9)
			if err != nil {
				t.Fatal(err)
			}
			if string(o.JSON) != tc.want {
				t.Fatalf("JSON\n%s\nwant\n%s", o.JSON, tc.want)
			}
			if string(o.WithRev(10)) == string(o.JSON) {
				t.Fatal("WithRev did not find the resourceVersion")
			}
		})
	}
}

// TestCustomResourceSchemaChangeReadsDifferently: a CRD whose schemas
// change (a default added, as in the conformance test) defines a resource
// whose objects read differently, so that the cache reads them again; a
// change elsewhere (status, printer columns) does not.
func TestCustomResourceSchemaChangeReadsDifferently(t *testing.T) {
	resource := func(edit func(*apiextensionsv1.CustomResourceDefinition)) *Resource {
		t.Helper()
		_, rs, err := CustomResources(testCRD(edit))
		if err != nil || len(rs) != 1 {
			t.Fatalf("CustomResources: %d resources, %v", len(rs), err)
		}
		return &rs[0]
	}
	base := resource(func(c *apiextensionsv1.CustomResourceDefinition) { c.Spec.Versions[1].Schema = widgetSchema("", "") })
	same := resource(func(c *apiextensionsv1.CustomResourceDefinition) {
		c.Spec.Versions[1].Schema = widgetSchema("", "")
		c.ResourceVersion = "8"
		c.Spec.Versions[1].AdditionalPrinterColumns = nil
	})
	defaulted := resource(func(c *apiextensionsv1.CustomResourceDefinition) { c.Spec.Versions[1].Schema = widgetSchema("A", "") })
	otherVersion := resource(func(c *apiextensionsv1.CustomResourceDefinition) {
		c.Spec.Versions[1].Schema = widgetSchema("", "")
		c.Spec.Versions[0].Schema = widgetSchema("A", "")
	})
	if !SameObjects(base, same) {
		t.Error("a CRD change outside its schemas reads objects differently")
	}
	if SameObjects(base, defaulted) {
		t.Error("a default added to the storage version's schema reads objects the same")
	}
	if SameObjects(base, otherVersion) {
		t.Error("a default added to another stored version's schema reads objects the same")
	}
	if sameResource(base, defaulted) {
		t.Error("sameResource: a schema change is the same resource")
	}
}
