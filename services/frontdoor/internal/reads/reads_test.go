package reads

import (
	"net/url"
	"testing"

	"herald.dev/libs/kube"
	"herald.dev/libs/kube/request"
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// A LIST's items lose the TypeMeta kube's serializer writes first, as
// kube-apiserver encodes them; anything else is embedded unchanged.
func TestWithoutTypeMeta(t *testing.T) {
	for in, want := range map[string]string{
		`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p"}}`: `{"metadata":{"name":"p"}}`,
		`{"kind":"Pod","apiVersion":"v1"}`:                         `{}`,
		`{"metadata":{},"kind":"Pod","apiVersion":"v1"}`:           `{"metadata":{},"kind":"Pod","apiVersion":"v1"}`,
		`{"kind":"Pod","metadata":{}}`:                             `{"kind":"Pod","metadata":{}}`,
		`{"kind":"Pod`:                                             `{"kind":"Pod`,
		`{"kind":"Pod","apiVersion":"v1`:                           `{"kind":"Pod","apiVersion":"v1`,
		``:                                                         ``,
	} {
		got := in
		if rest, ok := withoutTypeMeta([]byte(in)); ok {
			got = "{" + string(rest)
		}
		if got != want {
			t.Errorf("%s: got %s, want %s", in, got, want)
		}
	}
}

// ListRequest validates a LIST's or GET's options before the cache sees
// them: a GET reads only its resourceVersion, a negative limit lists
// everything, a bad limit or selector is refused.
func TestListRequest(t *testing.T) {
	reg, err := kube.NewRegistry("/registry", kube.DefaultResources())
	if err != nil {
		t.Fatal(err)
	}
	parse := func(target string) (request.Info, url.Values) {
		u, _ := url.Parse(target)
		info, err := request.Parse(reg, u.Path, u.Query())
		if err != nil {
			t.Fatal(err)
		}
		return info, u.Query()
	}
	info, q := parse("/api/v1/namespaces/ns/pods?limit=-5&labelSelector=a%3Db&resourceVersion=7&resourceVersionMatch=NotOlderThan")
	req, err := ListRequest(info, q)
	if err != nil || req.Limit != 0 || req.LabelSelector != "a=b" || req.Namespace != "ns" || req.ResourceVersion != "7" {
		t.Fatalf("list: %+v %v", req, err)
	}
	info, q = parse("/api/v1/namespaces/ns/pods/p?limit=x&labelSelector=%3D%3D&resourceVersion=7")
	if req, err := ListRequest(info, q); err != nil || req.Name != "p" || req.Limit != 0 || req.LabelSelector != "" || req.ResourceVersion != "7" {
		t.Fatalf("get: %+v %v", req, err)
	}
	for _, target := range []string{"/api/v1/pods?limit=x", "/api/v1/pods?labelSelector=%3D%3D", "/api/v1/pods?resourceVersionMatch=Exact"} {
		info, q := parse(target)
		if _, err := ListRequest(info, q); err == nil {
			t.Errorf("%s: accepted", target)
		}
	}
}

// A list is assembled from the items' bytes, without their TypeMeta.
func TestEncodeList(t *testing.T) {
	reg, err := kube.NewRegistry("/registry", kube.DefaultResources())
	if err != nil {
		t.Fatal(err)
	}
	res, ok := reg.Lookup("", "v1", "pods")
	if !ok {
		t.Fatal("no pods")
	}
	n := int64(3)
	got := string(encodeList(res, &heraldv1.ListResponse{Revision: 42, Continue: "c", RemainingItemCount: &n,
		Items: [][]byte{[]byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"a"}}` + "\n"), []byte(`{"metadata":{"name":"b"}}`)}}))
	want := `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"42","continue":"c","remainingItemCount":3},"items":[{"metadata":{"name":"a"}},{"metadata":{"name":"b"}}]}`
	if got != want {
		t.Fatalf("\n%s\nwant\n%s", got, want)
	}
}
