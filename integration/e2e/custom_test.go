package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

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
	if strings.Join(gs, ",") != "apps,example.com" {
		t.Errorf("/apis groups %v", gs)
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
	if kubectl, err := exec.LookPath("kubectl"); err == nil {
		out, err := exec.CommandContext(ctx, kubectl, "--kubeconfig", e.Kubeconfig, "get", "wd", "-A", "-o", "name").CombinedOutput()
		if err != nil || string(out) != "widget.example.com/big-one\nwidget.example.com/small-one\n" {
			t.Errorf("kubectl get wd -A: %v\n%s", err, out)
		}
	}
}
