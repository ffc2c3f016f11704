package printers

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"herald.dev/libs/kube"
)

// TestCustomTable renders a custom resource's Table with its CRD's printer
// columns, as kube-apiserver's CRD handler does.
func TestCustomTable(t *testing.T) {
	_, rs, err := kube.CustomResources(testCRD(nil))
	if err != nil {
		t.Fatal(err)
	}
	g, err := kube.NewRegistry(kube.DefaultPrefix, kube.DefaultResources())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.SetCRD("widgets.example.com", rs); err != nil {
		t.Fatal(err)
	}
	r, _ := g.ByID("widgets.example.com")
	item := []byte(`{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w1","namespace":"shop","resourceVersion":"9","creationTimestamp":"2026-01-01T00:00:00Z"},"spec":{"color":"red","size":3}}`)
	var table metav1.Table
	if err := json.Unmarshal(Table(r, [][]byte{item}, metav1.ListMeta{ResourceVersion: "9"}, true, time.Now()), &table); err != nil {
		t.Fatal(err)
	}
	var cols []string
	for _, c := range table.ColumnDefinitions {
		cols = append(cols, c.Name)
	}
	if strings.Join(cols, ",") != "Name,Color,Size" || table.ColumnDefinitions[2].Priority != 1 {
		t.Errorf("columns %v", table.ColumnDefinitions)
	}
	if len(table.Rows) != 1 || len(table.Rows[0].Cells) != 3 || table.Rows[0].Cells[0] != "w1" || table.Rows[0].Cells[1] != "red" || table.Rows[0].Cells[2] != float64(3) {
		t.Fatalf("rows %+v", table.Rows)
	}
	var row metav1.PartialObjectMetadata
	if err := json.Unmarshal(table.Rows[0].Object.Raw, &row); err != nil || row.Kind != "PartialObjectMetadata" || row.Name != "w1" || row.ResourceVersion != "9" {
		t.Errorf("row object %s: %v", table.Rows[0].Object.Raw, err)
	}
	if table.ResourceVersion != "9" || table.Kind != "Table" {
		t.Errorf("table %+v", table.TypeMeta)
	}
}

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
