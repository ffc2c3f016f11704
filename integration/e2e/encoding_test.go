package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	clientscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"herald.dev/integration/stack"
)

const protobufType = "application/vnd.kubernetes.protobuf"

// contentTypes records the Content-Type of every response a client gets.
type contentTypes struct {
	mu   sync.Mutex
	seen map[string]int
}

func (c *contentTypes) wrap(cfg *rest.Config) {
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(r *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(r)
			if err == nil {
				c.mu.Lock()
				if c.seen == nil {
					c.seen = map[string]int{}
				}
				c.seen[resp.Header.Get("Content-Type")]++
				c.mu.Unlock()
			}
			return resp, err
		})
	}
}

// only reports whether every response had a Content-Type in want.
func (c *contentTypes) only(want ...string) (bool, map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for ct := range c.seen {
		found := false
		for _, w := range want {
			found = found || ct == w
		}
		if !found {
			return false, c.seen
		}
	}
	return len(c.seen) > 0, c.seen
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// clientset returns a clientset asking for accept (content type ct), its
// responses' Content-Types recorded in rec.
func (e *env) clientset(t *testing.T, ct, accept string, rec *contentTypes) *kubernetes.Clientset {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", e.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ContentType, cfg.AcceptContentTypes = ct, accept
	if rec != nil {
		rec.wrap(cfg)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// putNode writes a node where kube-apiserver keeps it (and where Herald's
// registry did before it learnt kube-apiserver's layout).
func (e *env) putNode(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	v := fmt.Sprintf(`{"apiVersion":"v1","kind":"Node","metadata":{"name":%q,"labels":{"zone":"a"}},"spec":{"podCIDR":"10.0.0.0/24"},"status":{"capacity":{"cpu":"4","memory":"16Gi"}}}`, name)
	for _, k := range []string{"/registry/minions/", "/registry/nodes/"} {
		if _, err := e.etcd.Put(ctx, k+name, v); err != nil {
			t.Fatal(err)
		}
	}
}

// TestProtobufClient: a clientset speaking only protobuf lists, gets and
// watches pods and nodes through Herald, every response is protobuf, and
// the objects equal those a JSON client gets.
func TestProtobufClient(t *testing.T) {
	e := startStack(t, stack.Options{})
	ctx := testContext(t, 2*time.Minute)
	const ns = "pb"
	for i := range 3 {
		e.put(t, ctx, ns, fmt.Sprintf("p%d", i), podJSON(ns, fmt.Sprintf("p%d", i), "n1", i), true)
	}
	e.putNode(t, ctx, "enc-n1")
	var rec contentTypes
	pb := e.clientset(t, protobufType, protobufType, &rec)
	js := e.clientset(t, "application/json", "application/json", nil)

	// LIST and GET: equal objects, protobuf on the wire.
	pl, err := pb.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	jl, err := js.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{ResourceVersion: pl.ResourceVersion, ResourceVersionMatch: metav1.ResourceVersionMatchExact})
	if err != nil {
		t.Fatal(err)
	}
	// A JSON list's items carry their kind, protobuf's never do.
	for i := range jl.Items {
		jl.Items[i].TypeMeta = metav1.TypeMeta{}
	}
	if len(pl.Items) != 3 || !reflect.DeepEqual(pl.Items, jl.Items) || pl.ResourceVersion != jl.ResourceVersion {
		t.Fatalf("protobuf list differs from JSON list:\n%+v\n%+v", pl, jl)
	}
	page, err := pb.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{Limit: 2})
	if err != nil || len(page.Items) != 2 || page.Continue == "" || page.RemainingItemCount == nil || *page.RemainingItemCount != 1 {
		t.Fatalf("protobuf page: %v %+v", err, page.ListMeta)
	}
	p, err := pb.CoreV1().Pods(ns).Get(ctx, "p1", metav1.GetOptions{})
	if err != nil || !reflect.DeepEqual(p.ObjectMeta, jl.Items[1].ObjectMeta) || !reflect.DeepEqual(p.Spec, jl.Items[1].Spec) || p.Spec.NodeName != "n1" {
		t.Fatalf("protobuf GET: %v %+v", err, p)
	}
	if _, err := pb.CoreV1().Pods(ns).Get(ctx, "nope", metav1.GetOptions{}); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("GET of a missing pod: %v", err)
	}
	nodes, err := pb.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || len(nodes.Items) != 1 || nodes.Items[0].Name != "enc-n1" || nodes.Items[0].Status.Capacity.Memory().String() != "16Gi" {
		t.Fatalf("protobuf node list: %v %+v", err, nodes)
	}
	n, err := pb.CoreV1().Nodes().Get(ctx, "enc-n1", metav1.GetOptions{})
	if err != nil || n.Spec.PodCIDR != "10.0.0.0/24" || n.ResourceVersion == "" {
		t.Fatalf("protobuf node GET: %v %+v", err, n)
	}

	// WATCH from the list: every event decoded by client-go's protobuf
	// watch decoder.
	w, err := pb.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: pl.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	add := e.put(t, ctx, ns, "p9", podJSON(ns, "p9", "n2", 9), true)
	mod := e.put(t, ctx, ns, "p9", podJSON(ns, "p9", "n2", 10), false)
	del := e.del(t, ctx, ns, "p0")
	for _, want := range []struct {
		typ  watch.EventType
		name string
		rv   int64
	}{{watch.Added, "p9", add.RV}, {watch.Modified, "p9", mod.RV}, {watch.Deleted, "p0", del.RV}} {
		select {
		case ev, ok := <-w.ResultChan():
			pod, isPod := ev.Object.(*corev1.Pod)
			if !ok || ev.Type != want.typ || !isPod || pod.Name != want.name || pod.ResourceVersion != fmt.Sprint(want.rv) {
				t.Fatalf("watch event %v %#v, want %s %s@%d", ev.Type, ev.Object, want.typ, want.name, want.rv)
			}
		case <-ctx.Done():
			t.Fatal("no watch event")
		}
	}
	e.putNode(t, ctx, "enc-n2")
	nw, err := pb.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{ResourceVersion: nodes.ResourceVersion, FieldSelector: "metadata.name=enc-n2"})
	if err != nil {
		t.Fatal(err)
	}
	defer nw.Stop()
	select {
	case ev := <-nw.ResultChan():
		if node, ok := ev.Object.(*corev1.Node); !ok || ev.Type != watch.Added || node.Name != "enc-n2" {
			t.Fatalf("node watch: %v %#v", ev.Type, ev.Object)
		}
	case <-ctx.Done():
		t.Fatal("no node event")
	}

	// WatchList: initial events, then the bookmark that ends them.
	yes := true
	wl, err := pb.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{SendInitialEvents: &yes, AllowWatchBookmarks: true,
		ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan})
	if err != nil {
		t.Fatal(err)
	}
	defer wl.Stop()
	var initial []string
	for len(initial) < 4 {
		ev := <-wl.ResultChan()
		pod, _ := ev.Object.(*corev1.Pod)
		if pod == nil {
			t.Fatalf("WatchList event %v %#v", ev.Type, ev.Object)
		}
		if ev.Type == watch.Bookmark {
			if pod.Annotations[metav1.InitialEventsAnnotationKey] != "true" || len(initial) != 3 {
				t.Fatalf("bookmark after %v: %+v", initial, pod.ObjectMeta)
			}
			break
		}
		initial = append(initial, pod.Name)
	}
	if ok, seen := rec.only(protobufType, protobufType+";stream=watch"); !ok {
		t.Errorf("protobuf client got %v", seen)
	}
}

// TestProtobufWatchFraming reads a protobuf watch's bytes: kube-apiserver's
// length-delimited frames of a raw WatchEvent embedding the object's
// "k8s\x00" encoding, the same bytes as the protobuf GET of the object.
func TestProtobufWatchFraming(t *testing.T) {
	e := startStack(t, stack.Options{})
	ctx := testContext(t, time.Minute)
	first := e.put(t, ctx, "fr", "a", podJSON("fr", "a", "n1", 1), true)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/api/v1/namespaces/fr/pods?watch=true&resourceVersion=%d", e.FrontdoorURL, first.RV), nil)
	req.Header.Set("Accept", protobufType)
	resp, err := e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != protobufType+";stream=watch" {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("watch: %d %v %s", resp.StatusCode, resp.Header, b)
	}
	e.put(t, ctx, "fr", "b", podJSON("fr", "b", "n1", 2), true)
	var size [4]byte
	if _, err := io.ReadFull(resp.Body, size[:]); err != nil {
		t.Fatal(err)
	}
	frame := make([]byte, binary.BigEndian.Uint32(size[:]))
	if _, err := io.ReadFull(resp.Body, frame); err != nil {
		t.Fatal(err)
	}
	if bytes.HasPrefix(frame, []byte("k8s\x00")) {
		t.Fatal("the WatchEvent itself must not carry the envelope")
	}
	var ev metav1.WatchEvent
	if err := ev.Unmarshal(frame); err != nil || ev.Type != "ADDED" || !bytes.HasPrefix(ev.Object.Raw, []byte("k8s\x00")) {
		t.Fatalf("frame: %v %q %q", err, ev.Type, ev.Object.Raw)
	}
	code, _, get := e.do(t, "/api/v1/namespaces/fr/pods/b", map[string]string{"Accept": protobufType})
	if code != 200 || !bytes.Equal(get, ev.Object.Raw) {
		t.Fatalf("GET b: %d; its protobuf differs from the watch event's object", code)
	}
	obj, _, err := protobuf.NewSerializer(clientscheme.Scheme, clientscheme.Scheme).Decode(ev.Object.Raw, nil, nil)
	if p, ok := obj.(*corev1.Pod); err != nil || !ok || p.Name != "b" {
		t.Fatalf("embedded object: %v %#v", err, obj)
	}
}

// TestNegotiation: what kube-apiserver refuses is refused the same way,
// and the other encodings are served.
func TestNegotiation(t *testing.T) {
	e := startStack(t, stack.Options{})
	ctx := testContext(t, time.Minute)
	e.put(t, ctx, "ng", "a", podJSON("ng", "a", "n1", 1), true)
	const (
		pom  = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
		poml = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
	)
	cases := []struct {
		path, accept, ct string
		code             int
		body             string // contained in the body
	}{
		// kube-apiserver's router refuses these before its handler runs.
		// Indented, as kube-apiserver writes a Status for an Accept it
		// cannot serve at all.
		{"/api/v1/namespaces/ng/pods/a", "text/html", "application/json", 406,
			"\"message\": \"406: Not Acceptable\\n\\nAvailable representations: application/json, application/yaml, application/vnd.kubernetes.protobuf\",\n  \"reason\": \"NotAcceptable\",\n  \"details\": {},\n  \"code\": 406"},
		{"/api/v1/namespaces/ng/pods", "application/*", "application/json", 406,
			`Available representations: application/json, application/yaml, application/vnd.kubernetes.protobuf, application/json;stream=watch, application/vnd.kubernetes.protobuf;stream=watch"`},
		// Its handler refuses these, in the media type it negotiated.
		{"/api/v1/namespaces/ng/pods?watch=true", "application/yaml", "application/yaml", 406,
			"message: 'only the following media types are accepted: application/json;stream=watch,\n  application/vnd.kubernetes.protobuf;stream=watch'\nmetadata: {}\nreason: NotAcceptable\n"},
		{"/api/v1/namespaces/ng/pods", "application/json;sv=v2", "application/json", 406,
			`only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf`},
		{"/api/v1/namespaces/ng/pods", pom, "application/json", 406,
			`you requested PartialObjectMetadata, but the requested object is a list (*core.PodList)`},
		{"/api/v1/namespaces/ng/pods/a", poml, "application/json", 406,
			`you requested PartialObjectMetadataList, but the requested object is not a list (*core.Pod)`},
		{"/api/v1/namespaces/ng/pods/a", pom, "application/json", 200,
			`{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"a","namespace":"ng",`},
		{"/api/v1/namespaces/ng/pods", poml, "application/json", 200,
			`{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":`},
		{"/api/v1/namespaces/ng/pods/a", "application/yaml", "application/yaml", 200, "apiVersion: v1\nkind: Pod\nmetadata:\n"},
		{"/api/v1/namespaces/ng/pods/a", "application/json;q=0.5,application/vnd.kubernetes.protobuf", protobufType, 200, "k8s\x00"},
	}
	for _, tc := range cases {
		code, hdr, body := e.do(t, tc.path, map[string]string{"Accept": tc.accept})
		if code != tc.code || hdr.Get("Content-Type") != tc.ct || !strings.Contains(string(body), tc.body) {
			t.Errorf("GET %s Accept %s: %d %s %q; want %d %s with %q", tc.path, tc.accept, code, hdr.Get("Content-Type"), body, tc.code, tc.ct, tc.body)
		}
	}
	// A watch asking for PartialObjectMetadataList ends, empty, at its first
	// event (kube-apiserver cannot encode its events that way).
	code, _, body := e.do(t, "/api/v1/namespaces/ng/pods?watch=true", map[string]string{"Accept": poml})
	if code != 200 || len(body) != 0 {
		t.Errorf("metadata list watch: %d %q", code, body)
	}
	// A metadata watch: PartialObjectMetadata events.
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.FrontdoorURL+"/api/v1/namespaces/ng/pods?watch=true", nil)
	req.Header.Set("Accept", pom)
	resp, err := e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line, err := readLine(resp.Body)
	if err != nil || !strings.HasPrefix(line, `{"type":"ADDED","object":{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"a"`) {
		t.Fatalf("metadata watch: %v %s", err, line)
	}
}

func readLine(r io.Reader) (string, error) {
	var b []byte
	one := make([]byte, 1)
	for {
		if _, err := r.Read(one); err != nil {
			return string(b), err
		}
		if one[0] == '\n' {
			return string(b), nil
		}
		b = append(b, one[0])
	}
}
