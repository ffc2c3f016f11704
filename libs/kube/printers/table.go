package printers

import (
	"bytes"
	"encoding/json"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/duration"

	"herald.dev/libs/kube"
	"herald.dev/libs/storage"
)

// tableObject is the part of an object a Table row needs.
type tableObject struct {
	Metadata json.RawMessage `json:"metadata"`
	Spec     struct {
		Containers []struct{} `json:"containers"`
	} `json:"spec"`
	Status struct {
		Phase             string `json:"phase"`
		Reason            string `json:"reason"`
		ContainerStatuses []struct {
			Ready        bool  `json:"ready"`
			RestartCount int32 `json:"restartCount"`
			State        struct {
				Waiting *struct {
					Reason string `json:"reason"`
				} `json:"waiting"`
				Terminated *struct {
					Reason string `json:"reason"`
				} `json:"terminated"`
			} `json:"state"`
		} `json:"containerStatuses"`
	} `json:"status"`
}

func columns(r *kube.Resource) []metav1.TableColumnDefinition {
	name := metav1.TableColumnDefinition{Name: "Name", Type: "string", Format: "name", Description: "Name of the object."}
	age := metav1.TableColumnDefinition{Name: "Age", Type: "string", Description: "Time since the object was created."}
	if r.Group == "" && r.Plural == "pods" {
		return []metav1.TableColumnDefinition{
			name,
			{Name: "Ready", Type: "string", Description: "Ready containers out of all containers."},
			{Name: "Status", Type: "string", Description: "The pod's phase, or why it is not running."},
			{Name: "Restarts", Type: "string", Description: "Container restarts."},
			age,
		}
	}
	return []metav1.TableColumnDefinition{name, age}
}

func row(r *kube.Resource, item []byte, now time.Time) metav1.TableRow {
	var o tableObject
	_ = json.Unmarshal(item, &o)
	var meta metav1.ObjectMeta
	_ = json.Unmarshal(o.Metadata, &meta)
	age := "<unknown>"
	if !meta.CreationTimestamp.IsZero() {
		age = duration.HumanDuration(now.Sub(meta.CreationTimestamp.Time))
	}
	partial, _ := json.Marshal(struct {
		Kind       string          `json:"kind"`
		APIVersion string          `json:"apiVersion"`
		Metadata   json.RawMessage `json:"metadata"`
	}{"PartialObjectMetadata", "meta.k8s.io/v1", o.Metadata})
	out := metav1.TableRow{Object: runtime.RawExtension{Raw: partial}}
	if r.Group == "" && r.Plural == "pods" {
		ready, restarts := 0, int32(0)
		status := o.Status.Phase
		if o.Status.Reason != "" {
			status = o.Status.Reason
		}
		for _, c := range o.Status.ContainerStatuses {
			if c.Ready {
				ready++
			}
			restarts += c.RestartCount
			switch {
			case c.State.Waiting != nil && c.State.Waiting.Reason != "":
				status = c.State.Waiting.Reason
			case c.State.Terminated != nil && c.State.Terminated.Reason != "":
				status = c.State.Terminated.Reason
			}
		}
		if meta.DeletionTimestamp != nil {
			status = "Terminating"
		}
		if status == "" {
			status = "Unknown"
		}
		out.Cells = []any{meta.Name, strconv.Itoa(ready) + "/" + strconv.Itoa(len(o.Spec.Containers)), status, strconv.Itoa(int(restarts)), age}
		return out
	}
	out.Cells = []any{meta.Name, age}
	return out
}

// IncludeObject is a Table request's includeObject option: what each row
// carries of its object.
type IncludeObject string

// The values kube-apiserver accepts (metav1.IncludeObjectPolicy); "" is
// IncludeMetadata.
const (
	IncludeNone     IncludeObject = "None"
	IncludeMetadata IncludeObject = "Metadata"
	IncludeFull     IncludeObject = "Object"
)

// Table renders items (objects of r as served) as a meta.k8s.io/v1 Table
// whose rows carry each object's PartialObjectMetadata. withColumns false
// leaves out the column definitions (watch events after the first).
func Table(r *kube.Resource, items [][]byte, listMeta metav1.ListMeta, withColumns bool, now time.Time) []byte {
	return TableWith(r, items, listMeta, withColumns, IncludeMetadata, now)
}

// TableWith is Table with the rows' objects as include says. A built-in
// kind gets kube-apiserver's columns and cells for it (printers.go), a
// custom resource its CRD's printer columns (table_custom.go).
func TableWith(r *kube.Resource, items [][]byte, listMeta metav1.ListMeta, withColumns bool, include IncludeObject, now time.Time) []byte {
	if r.Custom() {
		if b, err := customTable(r, items, listMeta, withColumns, include); err == nil {
			return b
		}
		// Items the cache decoded always read back; should one not, the
		// generic columns below still describe every item.
	}
	t := metav1.Table{
		TypeMeta: metav1.TypeMeta{Kind: "Table", APIVersion: "meta.k8s.io/v1"},
		ListMeta: listMeta,
		Rows:     make([]metav1.TableRow, 0, len(items)),
	}
	p, builtin := builtinPrinters[schema.GroupKind{Group: r.Group, Kind: r.Kind}]
	if withColumns {
		if builtin {
			t.ColumnDefinitions = p.columns
		} else {
			t.ColumnDefinitions = columns(r)
		}
	}
	if builtin && p.order != nil && len(items) > 1 {
		ordered := make([][]byte, len(items))
		for i, j := range p.order(items) {
			ordered[i] = items[j]
		}
		items = ordered
	}
	for _, it := range items {
		var out metav1.TableRow
		if builtin {
			// A value the cache decoded always fits its type; a row
			// without cells is the only sign of one that does not.
			_ = p.row(it, now, &out)
			out.Object = rowObject(it, include)
		} else {
			out = row(r, it, now)
		}
		t.Rows = append(t.Rows, out)
	}
	b, _ := json.Marshal(t)
	return b
}

// rowObject is what a row carries of item, as kube-apiserver's asTable
// sets it: the PartialObjectMetadata, the object itself, or nothing.
func rowObject(item []byte, include IncludeObject) runtime.RawExtension {
	switch include {
	case IncludeNone:
		return runtime.RawExtension{}
	case IncludeFull:
		return runtime.RawExtension{Raw: bytes.TrimSuffix(item, []byte("\n"))}
	}
	var o struct {
		APIVersion string          `json:"apiVersion"`
		Kind       string          `json:"kind"`
		Metadata   json.RawMessage `json:"metadata"`
	}
	_ = json.Unmarshal(item, &o)
	if o.Kind == "DaemonSet" {
		// The internal object's metadata (libs/storage.Metadata).
		if p, err := storage.Metadata(item, false, metav1.SchemeGroupVersion); err == nil {
			o.Metadata, _ = json.Marshal(&p.ObjectMeta)
		}
	}
	partial, _ := json.Marshal(struct {
		Kind       string          `json:"kind"`
		APIVersion string          `json:"apiVersion"`
		Metadata   json.RawMessage `json:"metadata"`
	}{"PartialObjectMetadata", "meta.k8s.io/v1", o.Metadata})
	return runtime.RawExtension{Raw: partial}
}
