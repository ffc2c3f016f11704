package frontdoor

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	clientscheme "k8s.io/client-go/kubernetes/scheme"
)

// LIST and GET answer in the negotiated encoding, errors found after the
// negotiation too; the negotiation comes before the request's options are
// looked at, as in kube-apiserver.
func TestNegotiatedResponses(t *testing.T) {
	s, _ := testServer(t, "http://127.0.0.1:1", nil)
	pb := protobuf.NewSerializer(clientscheme.Scheme, clientscheme.Scheme)
	get := func(target, accept string) (int, string, []byte) {
		req := httptest.NewRequest(http.MethodGet, target, nil)
		req.Header.Set("Authorization", "Bearer "+tokAdmin)
		req.Header.Set("Accept", accept)
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		b, _ := io.ReadAll(rec.Result().Body)
		return rec.Code, rec.Result().Header.Get("Content-Type"), b
	}
	const proto = "application/vnd.kubernetes.protobuf"

	code, ct, body := get("/api/v1/namespaces/ns1/pods?limit=5", proto)
	obj, _, err := pb.Decode(body, nil, nil)
	if l, ok := obj.(*corev1.PodList); code != 200 || ct != proto || err != nil || !ok || len(l.Items) != 1 || l.ResourceVersion != "7" || l.Items[0].Name != "p" {
		t.Fatalf("protobuf LIST: %d %s %v %#v", code, ct, err, obj)
	}
	code, ct, body = get("/api/v1/namespaces/ns1/pods/p", proto)
	obj, _, err = pb.Decode(body, nil, nil)
	if p, ok := obj.(*corev1.Pod); code != 200 || ct != proto || err != nil || !ok || p.Name != "p" {
		t.Fatalf("protobuf GET: %d %s %v %#v", code, ct, err, obj)
	}
	// A GET as a Table carries the object's resourceVersion (5), not the
	// cache's revision (7), as kube-apiserver's (Kubernetes' e2e test "API
	// Streaming ... server supports sending resources in Table format"
	// compares it with the watch's Table of the same object).
	code, _, body = get("/api/v1/namespaces/ns1/pods/older", "application/json;as=Table;v=v1;g=meta.k8s.io")
	var tbl metav1.Table
	if err := json.Unmarshal(body, &tbl); code != 200 || err != nil || tbl.Kind != "Table" || len(tbl.Rows) != 1 || tbl.ResourceVersion != "5" {
		t.Fatalf("Table GET: %d %v resourceVersion %q: %s", code, err, tbl.ResourceVersion, body)
	}
	code, _, body = get("/api/v1/namespaces/ns1/pods?limit=5", "application/json;as=Table;v=v1;g=meta.k8s.io")
	if err := json.Unmarshal(body, &tbl); code != 200 || err != nil || tbl.ResourceVersion != "7" {
		t.Fatalf("Table LIST: %d %v resourceVersion %q, want the list's 7", code, err, tbl.ResourceVersion)
	}
	code, ct, body = get("/api/v1/namespaces/ns1/pods/missing", proto)
	obj, _, err = pb.Decode(body, nil, nil)
	if st, ok := obj.(*metav1.Status); code != 404 || ct != proto || err != nil || !ok || st.Reason != metav1.StatusReasonNotFound {
		t.Fatalf("protobuf 404: %d %s %v %#v", code, ct, err, obj)
	}
	code, ct, body = get("/api/v1/namespaces/ns1/pods?limit=x", proto)
	if obj, _, err = pb.Decode(body, nil, nil); code != 400 || ct != proto || err != nil {
		t.Fatalf("protobuf 400: %d %s %v %#v", code, ct, err, obj)
	}
	// 406 first, in JSON: nothing was acceptable. The router's message
	// names the route's media types.
	code, ct, body = get("/api/v1/namespaces/ns1/pods?limit=x", "text/html")
	if c, reason, msg := statusOf(t, body); code != 406 || ct != "application/json" || c != 406 || reason != "NotAcceptable" ||
		msg != "406: Not Acceptable\n\nAvailable representations: application/json, application/yaml, application/vnd.kubernetes.protobuf, application/json;stream=watch, application/vnd.kubernetes.protobuf;stream=watch" {
		t.Fatalf("406 before 400: %d %s %s", code, ct, body)
	}
	code, _, body = get("/api/v1/namespaces/ns1/pods?watch=true&timeoutSeconds=x", "application/yaml")
	if code != 400 {
		t.Fatalf("a YAML watch with a bad option: %d %s (kube-apiserver validates options before the stream's media type)", code, body)
	}
	// Byte for byte what kube-apiserver v1.37 answers.
	code, ct, body = get("/api/v1/namespaces/ns1/pods?watch=true", "application/yaml")
	if code != 406 || ct != "application/yaml" || string(body) != "apiVersion: v1\ncode: 406\nkind: Status\nmessage: 'only the following media types are accepted: application/json;stream=watch,\n  application/vnd.kubernetes.protobuf;stream=watch'\nmetadata: {}\nreason: NotAcceptable\nstatus: Failure\n" {
		t.Fatalf("YAML watch: %d %s %q", code, ct, body)
	}
	// JSON as kube's serializer ends it, with a newline; pretty without.
	code, ct, body = get("/api/v1/namespaces/ns1/pods", "application/json")
	if code != 200 || ct != "application/json" || !bytes.HasSuffix(body, []byte("}]}\n")) {
		t.Fatalf("JSON LIST: %d %s %q", code, ct, body)
	}
	code, _, body = get("/api/v1/namespaces/ns1/pods/p?pretty=true", "")
	if code != 200 || string(body) != "{\n  \"kind\": \"Pod\",\n  \"apiVersion\": \"v1\",\n  \"metadata\": {\n    \"name\": \"p\",\n    \"namespace\": \"ns1\",\n    \"resourceVersion\": \"7\"\n  }\n}" {
		t.Fatalf("pretty GET: %d %q", code, body)
	}
	// List items carry no TypeMeta, as kube-apiserver encodes them.
	code, ct, body = get("/api/v1/namespaces/ns1/pods", "application/yaml")
	if code != 200 || ct != "application/yaml" || !bytes.HasPrefix(body, []byte("apiVersion: v1\nitems:\n- metadata:\n")) {
		t.Fatalf("YAML LIST: %d %s %s", code, ct, body)
	}
	code, _, body = get("/api/v1/namespaces/ns1/pods", "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1")
	if code != 200 || string(body) != `{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"7"},"items":[{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"p","namespace":"ns1","resourceVersion":"7"}}]}`+"\n" {
		t.Fatalf("metadata LIST: %d %s", code, body)
	}
}
