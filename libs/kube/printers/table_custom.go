package printers

import (
	"context"
	"encoding/json"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"herald.dev/libs/kube"
	"herald.dev/libs/storage"
)

// customTable renders items of custom resource r as kube-apiserver's
// apiextensions server does: its CRD's printer columns through
// k8s.io/apiextensions-apiserver's table convertor, each row's object the
// item's PartialObjectMetadata (the default includeObject=Metadata, read
// through the unstructured accessors as kube-apiserver reads a custom
// resource's), the item itself, or nothing.
func customTable(r *kube.Resource, items [][]byte, listMeta metav1.ListMeta, withColumns bool, include IncludeObject) ([]byte, error) {
	list := &unstructured.UnstructuredList{Items: make([]unstructured.Unstructured, len(items))}
	for i, it := range items {
		if err := list.Items[i].UnmarshalJSON(it); err != nil {
			return nil, err
		}
	}
	t, err := r.TableConvertor().ConvertToTable(context.Background(), list, &metav1.TableOptions{NoHeaders: !withColumns})
	if err != nil {
		return nil, err
	}
	t.TypeMeta = metav1.TypeMeta{Kind: "Table", APIVersion: "meta.k8s.io/v1"}
	t.ListMeta = listMeta
	if t.Rows == nil {
		t.Rows = []metav1.TableRow{}
	}
	for i := range t.Rows {
		if include == IncludeNone || include == IncludeFull {
			t.Rows[i].Object = rowObject(items[i], include)
			continue
		}
		p, err := storage.Metadata(items[i], true, metav1.SchemeGroupVersion)
		if err != nil {
			return nil, err
		}
		raw, err := json.Marshal(p)
		if err != nil {
			return nil, err
		}
		t.Rows[i].Object = runtime.RawExtension{Raw: raw}
	}
	return json.Marshal(t)
}
