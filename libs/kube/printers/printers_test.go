package printers

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"herald.dev/libs/kube"
)

// The end-to-end test (integration/kubeapi) compares every built-in kind's
// Table with kube-apiserver's; these pin the rules that its objects do not
// exercise.
func TestBuiltinTableRows(t *testing.T) {
	reg, err := kube.NewRegistry(kube.DefaultPrefix, kube.DefaultResources())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 1, 0, 0, 0, time.UTC)
	created := `"creationTimestamp":"2026-01-01T00:00:00Z"`
	for _, tc := range []struct {
		group, version, plural string
		obj                    string
		columns                int
		cells                  []any
		conditions             int
	}{
		{"", "v1", "pods", `{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p",` + created + `},
			"spec":{"nodeName":"n","containers":[{"name":"a"},{"name":"b"}],"initContainers":[{"name":"s","restartPolicy":"Always"}]},
			"status":{"phase":"Succeeded","podIPs":[{"ip":"10.0.0.1"}],
			"initContainerStatuses":[{"name":"s","ready":true,"started":true,"restartCount":1,"state":{"running":{}}}],
			"containerStatuses":[{"name":"a","ready":true,"restartCount":2,"state":{"running":{}}},
			{"name":"b","state":{"terminated":{"exitCode":0,"reason":"Completed"}}}]}}`,
			9, []any{"p", "2/3", "NotReady", "3", "60m", "10.0.0.1", "n", "<none>", "<none>"}, 1},
		{"rbac.authorization.k8s.io", "v1", "roles", `{"metadata":{"name":"r",` + created + `}}`,
			2, []any{"r", "2026-01-01T00:00:00Z"}, 0},
		{"", "v1", "services", `{"metadata":{"name":"s",` + created + `},"spec":{"type":"NodePort","clusterIPs":["10.96.0.1"],
			"ports":[{"port":80,"nodePort":30080,"protocol":"TCP"}],"selector":{"app":"web"}}}`,
			7, []any{"s", "NodePort", "10.96.0.1", "<none>", "80:30080/TCP", "60m", "app=web"}, 0},
		{"", "v1", "endpoints", `{"metadata":{"name":"e",` + created + `},"subsets":[{"addresses":[{"ip":"10.0.0.1"},{"ip":"10.0.0.2"}],
			"ports":[{"port":80},{"port":443}]}]}`,
			3, []any{"e", "10.0.0.1:80,10.0.0.2:80,10.0.0.1:443 + 1 more...", "60m"}, 0},
	} {
		t.Run(tc.plural, func(t *testing.T) {
			r, ok := reg.Lookup(tc.group, tc.version, tc.plural)
			if !ok {
				t.Fatalf("%s not registered", tc.plural)
			}
			var table metav1.Table
			if err := json.Unmarshal(Table(r, [][]byte{[]byte(tc.obj)}, metav1.ListMeta{}, true, now), &table); err != nil {
				t.Fatal(err)
			}
			if len(table.ColumnDefinitions) != tc.columns || len(table.Rows) != 1 {
				t.Fatalf("%d columns, %d rows", len(table.ColumnDefinitions), len(table.Rows))
			}
			row := table.Rows[0]
			var cells []any
			for _, c := range tc.cells {
				b, _ := json.Marshal(c)
				var v any
				json.Unmarshal(b, &v)
				cells = append(cells, v)
			}
			if !reflect.DeepEqual(row.Cells, cells) {
				t.Errorf("cells %#v, want %#v", row.Cells, cells)
			}
			if len(row.Conditions) != tc.conditions {
				t.Errorf("conditions %v", row.Conditions)
			}
		})
	}
}

func TestTableIncludeObject(t *testing.T) {
	reg, err := kube.NewRegistry(kube.DefaultPrefix, kube.DefaultResources())
	if err != nil {
		t.Fatal(err)
	}
	r, _ := reg.Lookup("", "v1", "configmaps")
	obj := `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"c"},"data":{"k":"v"}}`
	for include, want := range map[IncludeObject]string{
		"":              `{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"c"}}`,
		IncludeMetadata: `{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"c"}}`,
		IncludeFull:     obj,
		IncludeNone:     `null`,
	} {
		var table struct {
			Rows []struct {
				Object json.RawMessage `json:"object"`
			} `json:"rows"`
		}
		if err := json.Unmarshal(TableWith(r, [][]byte{[]byte(obj + "\n")}, metav1.ListMeta{}, false, include, time.Now()), &table); err != nil {
			t.Fatal(err)
		}
		if got := string(table.Rows[0].Object); got != want {
			t.Errorf("includeObject=%q: row object %s, want %s", include, got, want)
		}
	}
}
