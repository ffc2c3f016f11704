package kubeapi

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// TestCRDDefaultedOnRead is Kubernetes' conformance test "custom resource
// defaulting for requests and from storage works" side by side: a custom
// resource written before its CRD's schema had a default reads with the
// default from both servers once the CRD has it (kube-apiserver defaults
// what it reads from etcd), and after the default moves to another field
// the object written with the first default keeps it and gets the new one.
// GET and LIST answers are compared byte for byte.
func TestCRDDefaultedOnRead(t *testing.T) {
	f := env(t)
	t.Cleanup(func() { f.logTail(t) })
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	const plural = "defaultees"
	crdName := plural + "." + crdGroup
	def := obj{"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": obj{"name": crdName},
		"spec": obj{
			"group": crdGroup, "scope": "Cluster",
			"names": obj{"plural": plural, "singular": "defaultee", "kind": "Defaultee", "listKind": "DefaulteeList"},
			"versions": []obj{{"name": "v1", "served": true, "storage": true,
				"schema": obj{"openAPIV3Schema": obj{"type": "object", "properties": obj{"a": obj{"type": "string"}, "b": obj{"type": "string"}}}}}},
		}}
	if _, err := f.dyn.Resource(crdGVR).Create(ctx, &unstructured.Unstructured{Object: def}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.dyn.Resource(crdGVR).Delete(context.Background(), crdName, metav1.DeleteOptions{}) })
	if err := f.waitEstablished(ctx, crdName); err != nil {
		t.Fatal(err)
	}
	gvr := schema.GroupVersionResource{Group: crdGroup, Version: "v1", Resource: plural}
	cr := func(name string) error {
		_, err := f.dyn.Resource(gvr).Create(ctx, &unstructured.Unstructured{Object: obj{
			"apiVersion": crdGroup + "/v1", "kind": "Defaultee", "metadata": obj{"name": name}}}, metav1.CreateOptions{})
		return err
	}
	if err := cr("cr-1"); err != nil {
		t.Fatal(err)
	}
	path := "/apis/" + crdGroup + "/v1/" + plural
	patchCRD := func(p string) {
		t.Helper()
		if _, err := f.dyn.Resource(crdGVR).Patch(ctx, crdName, types.JSONPatchType, []byte(p), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// field reads a top-level string of object name from base ("" when
	// it has none).
	field := func(base, name, key string) (string, error) {
		resp, body, err := f.readAll(ctx, base, path+"/"+name, nil, mediaJSON)
		if err != nil {
			return "", err
		}
		if resp.StatusCode != 200 {
			return "", fmt.Errorf("GET %s: %d %s", name, resp.StatusCode, body)
		}
		var o map[string]any
		if err := json.Unmarshal(body, &o); err != nil {
			return "", err
		}
		s, _ := o[key].(string)
		return s, nil
	}
	// until waits (bounded) until both servers read want at name's key,
	// then compares their GET and LIST answers.
	until := func(name, key, want string) {
		t.Helper()
		for _, srv := range []struct{ what, base string }{{"kube-apiserver", f.kubeURL}, {"Herald", f.heraldURL}} {
			var got string
			var err error
			if werr := waitFor(ctx, 30*time.Second, func() bool {
				got, err = field(srv.base, name, key)
				return err == nil && got == want
			}); werr != nil {
				t.Fatalf("%s: %s of %s is %q (%v), want %q after the CRD's change", srv.what, key, name, got, err, want)
			}
		}
		if v := f.eventually(ctx, 10*time.Second, f.fetchJSON(path+"/"+name, nil, mediaJSON), agreeOpts{}); v != "" {
			t.Errorf("GET %s: %s", name, v)
		}
		if v := f.eventually(ctx, 10*time.Second, f.fetchJSON(path, nil, mediaJSON), agreeOpts{listRV: true}); v != "" {
			t.Errorf("LIST: %s", v)
		}
	}

	patchCRD(`[{"op":"add","path":"/spec/versions/0/schema/openAPIV3Schema/properties/a/default","value":"A"}]`)
	until("cr-1", "a", "A")

	if err := cr("cr-2"); err != nil { // written with a: A
		t.Fatal(err)
	}
	patchCRD(`[{"op":"remove","path":"/spec/versions/0/schema/openAPIV3Schema/properties/a/default"},` +
		`{"op":"add","path":"/spec/versions/0/schema/openAPIV3Schema/properties/b/default","value":"B"}]`)
	until("cr-2", "b", "B")
	if a, err := field(f.heraldURL, "cr-2", "a"); err != nil || a != "A" {
		t.Errorf("Herald: cr-2's a is %q (%v), want A (stored)", a, err)
	}
	until("cr-1", "b", "B")
	if a, err := field(f.heraldURL, "cr-1", "a"); err != nil || a != "" {
		t.Errorf("Herald: cr-1's a is %q (%v), want none (never stored, no default any more)", a, err)
	}
}
