package cache

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/stream"
)

// putValue writes value at key in etcd and appends the revision to the
// stream, as ingest does.
func (h *history) putValue(t *testing.T, key, value string) int64 {
	t.Helper()
	resp, err := h.etcd.Put(t.Context(), key, value, clientv3.WithPrevKV())
	if err != nil {
		t.Fatal(err)
	}
	rev := resp.Header.Revision
	created := rev
	if resp.PrevKv != nil {
		created = resp.PrevKv.CreateRevision
	}
	changes := []*heraldv1.Change{{Kind: heraldv1.Change_PUT, Key: key, Value: []byte(value), CreateRevision: created}}
	for _, rec := range stream.Frame(rev, changes, 1<<20, 0) {
		data, err := stream.Encode(rec)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.js.Publish(t.Context(), stream.SubjectOf(registry(t), changes), data); err != nil {
			t.Fatal(err)
		}
	}
	h.revs = append(h.revs, rev)
	return rev
}

// gadgetCRD is the CRD of gadgets.example.com (cluster-scoped, v1) as
// kube-apiserver stores it (apiextensions.k8s.io/v1beta1) once
// Established, its schema's property a
// defaulted to defaultA unless that is "".
func gadgetCRD(defaultA string) string {
	a := `{"type":"string"}`
	if defaultA != "" {
		a = fmt.Sprintf(`{"type":"string","default":%q}`, defaultA)
	}
	return `{"apiVersion":"apiextensions.k8s.io/v1beta1","kind":"CustomResourceDefinition","metadata":{"name":"gadgets.example.com","uid":"u1"},` +
		`"spec":{"group":"example.com","scope":"Cluster","names":{"plural":"gadgets","singular":"gadget","kind":"Gadget","listKind":"GadgetList"},` +
		`"versions":[{"name":"v1","served":true,"storage":true,"schema":{"openAPIV3Schema":{"type":"object","properties":{"a":` + a + `,"b":{"type":"string"}}}}}],` +
		`"conversion":{"strategy":"None"},"preserveUnknownFields":false},` +
		`"status":{"acceptedNames":{"plural":"gadgets","singular":"gadget","kind":"Gadget","listKind":"GadgetList"},` +
		`"conditions":[{"type":"NamesAccepted","status":"True"},{"type":"Established","status":"True"}],"storedVersions":["v1"]}}`
}

// TestCustomResourceDefaultedFromTheCurrentSchema: a custom resource
// written before its CRD's schema had a default reads with the default
// once the CRD has it, in a GET, a LIST and a watch's initial state, as
// kube-apiserver reads it from etcd (the conformance test "custom
// resource defaulting for requests and from storage works"); the
// revision of the CRD's change cuts the resource's watches, as
// kube-apiserver's replaced storage does.
func TestCustomResourceDefaultedFromTheCurrentSchema(t *testing.T) {
	h := startHistory(t)
	const crdKey, crKey = "/registry/apiextensions.k8s.io/customresourcedefinitions/gadgets.example.com", "/registry/example.com/gadgets/g1"
	h.putValue(t, crdKey, gadgetCRD(""))
	_, v, _ := startShard(t, h, 0)
	written := h.putValue(t, crKey, `{"apiVersion":"example.com/v1","kind":"Gadget","metadata":{"name":"g1","uid":"u2","generation":1}}`)

	get := func(rev int64) map[string]any {
		t.Helper()
		resp, err := v.List(t.Context(), &heraldv1.ListRequest{Resource: "gadgets.example.com", Name: "g1", ResourceVersion: fmt.Sprint(rev)})
		if err != nil {
			t.Fatalf("GET at %d: %v", rev, err)
		}
		var obj map[string]any
		if err := json.Unmarshal(resp.Items[0], &obj); err != nil {
			t.Fatal(err)
		}
		return obj
	}
	if obj := get(written); obj["a"] != nil {
		t.Fatalf("before the default: a = %v", obj["a"])
	}
	w := &watchStream{ctx: t.Context(), sent: make(chan *heraldv1.WatchResponse, 100)}
	watchDone := make(chan error, 1)
	go func() {
		watchDone <- v.Watch(&heraldv1.WatchRequest{Resource: "gadgets.example.com", AfterRevision: written, Follow: true}, w)
	}()
	<-w.sent // the start: a bookmark at written

	patched := h.putValue(t, crdKey, gadgetCRD("A"))
	if obj := get(patched); obj["a"] != "A" {
		t.Errorf("GET after the CRD's default: a = %v, want A (%v)", obj["a"], obj)
	}
	list, err := v.List(t.Context(), &heraldv1.ListRequest{Resource: "gadgets.example.com"})
	if err != nil || len(list.Items) != 1 || !strings.Contains(string(list.Items[0]), `"a":"A"`) {
		t.Errorf("LIST after the CRD's default: %v %s", err, list.GetItems())
	}
	select {
	case err := <-watchDone:
		if status.Code(err) != codes.Aborted {
			t.Errorf("watch across the CRD's schema change ended with %v, want Aborted (resume)", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("a watch following across the CRD's schema change was not cut after 10s")
	}
	w2 := &watchStream{ctx: t.Context(), sent: make(chan *heraldv1.WatchResponse, 100)}
	if err := v.Watch(&heraldv1.WatchRequest{Resource: "gadgets.example.com", InitialEvents: true}, w2); err != nil {
		t.Fatal(err)
	}
	close(w2.sent)
	found := false
	for r := range w2.sent {
		for _, ev := range r.Events {
			if ev.Type == heraldv1.EventType_ADDED {
				found = true
				if !strings.Contains(string(ev.Object), `"a":"A"`) {
					t.Errorf("initial ADDED after the CRD's default: %s", ev.Object)
				}
			}
		}
	}
	if !found {
		t.Error("no initial ADDED event")
	}

	// Removing the default keeps a value an object was written with, and
	// a new default appears (the conformance test's second half).
	h.putValue(t, "/registry/example.com/gadgets/g2", `{"apiVersion":"example.com/v1","a":"A","kind":"Gadget","metadata":{"name":"g2","uid":"u3","generation":1}}`)
	noA := h.putValue(t, crdKey, strings.Replace(gadgetCRD(""), `"b":{"type":"string"}`, `"b":{"type":"string","default":"B"}`, 1))
	resp, err := v.List(t.Context(), &heraldv1.ListRequest{Resource: "gadgets.example.com", Name: "g2", ResourceVersion: fmt.Sprint(noA)})
	if err != nil {
		t.Fatal(err)
	}
	var g2 map[string]any
	if err := json.Unmarshal(resp.Items[0], &g2); err != nil {
		t.Fatal(err)
	}
	if g2["a"] != "A" || g2["b"] != "B" {
		t.Errorf("g2 after the defaults changed: a = %v, b = %v; want A, B", g2["a"], g2["b"])
	}
	if obj := get(noA); obj["a"] != nil || obj["b"] != "B" {
		t.Errorf("g1 after the defaults changed: a = %v, b = %v; want none, B", obj["a"], obj["b"])
	}
}
