package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

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
