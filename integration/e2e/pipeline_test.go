package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"herald.dev/integration/checker"
	"herald.dev/integration/stack"
	"herald.dev/libs/storage"
)

// TestWatchSeesEveryChangeOnce writes 1,000 creates, updates and deletes to
// etcd while a client watches through frontdoor: the client must see every
// change exactly once, in increasing resourceVersion, and a LIST afterwards
// must equal etcd's contents.
func TestWatchSeesEveryChangeOnce(t *testing.T) {
	e := startStack(t, stack.Options{})
	ctx := testContext(t, 3*time.Minute)

	var list podList
	if code := e.get(t, "/api/v1/pods", &list); code != http.StatusOK {
		t.Fatalf("initial LIST: %d", code)
	}
	_, events := e.openWatch(t, ctx, "/api/v1/pods?watch=true&resourceVersion="+list.Metadata.ResourceVersion)

	var want []checker.WatchEvent
	const pods = 400
	for i := range pods {
		ns := fmt.Sprintf("ns-%d", i%7)
		want = append(want, e.put(t, ctx, ns, fmt.Sprintf("p-%03d", i), podJSON(ns, fmt.Sprintf("p-%03d", i), "node-1", 0), true))
	}
	for i := range pods {
		ns := fmt.Sprintf("ns-%d", i%7)
		want = append(want, e.put(t, ctx, ns, fmt.Sprintf("p-%03d", i), podJSON(ns, fmt.Sprintf("p-%03d", i), "node-2", 1), false))
	}
	for i := 0; i < pods; i += 2 {
		want = append(want, e.del(t, ctx, fmt.Sprintf("ns-%d", i%7), fmt.Sprintf("p-%03d", i)))
	}
	if len(want) != 1000 {
		t.Fatalf("wrote %d changes, want 1000", len(want))
	}
	got := collect(t, ctx, events, want[len(want)-1].RV)
	for _, err := range checker.CheckWatch(want, got) {
		t.Error(err)
	}

	// A LIST (consistent read) equals etcd's contents at its revision.
	if code := e.get(t, "/api/v1/pods", &list); code != http.StatusOK {
		t.Fatalf("LIST: %d", code)
	}
	listRev, _ := strconv.ParseInt(list.Metadata.ResourceVersion, 10, 64)
	if listRev < want[len(want)-1].RV {
		t.Fatalf("consistent LIST at %d is older than the last write %d", listRev, want[len(want)-1].RV)
	}
	etcdResp, err := e.etcd.Get(ctx, "/registry/pods/", clientv3.WithPrefix(), clientv3.WithRev(listRev))
	if err != nil {
		t.Fatal(err)
	}
	assertListEqualsEtcd(t, list.Items, etcdResp.Kvs)
}

// assertListEqualsEtcd compares served objects with etcd's key-values: the
// same objects, each exactly kube-apiserver's JSON of the stored value
// (libs/storage's decoding and kube's serializer, resourceVersion equal to
// the mod revision).
func assertListEqualsEtcd(t *testing.T, items []json.RawMessage, kvs []*mvccKV) {
	t.Helper()
	codec, err := storage.NewCodec(nil)
	if err != nil {
		t.Fatal(err)
	}
	pods := storage.NewBuiltinTable().Lookup(schema.GroupVersionResource{Version: "v1", Resource: "pods"})
	served := map[string]json.RawMessage{}
	for _, it := range items {
		var o struct {
			Metadata struct{ Namespace, Name string } `json:"metadata"`
		}
		if err := json.Unmarshal(it, &o); err != nil {
			t.Fatal(err)
		}
		served[o.Metadata.Namespace+"/"+o.Metadata.Name] = it
	}
	if len(served) != len(kvs) {
		t.Errorf("LIST has %d objects, etcd %d", len(served), len(kvs))
	}
	for _, kv := range kvs {
		key := checker.KeyName("/registry/pods/", string(kv.Key))
		o, ok := served[key]
		if !ok {
			t.Errorf("LIST lacks %s", key)
			continue
		}
		stored, err := codec.Decode(context.Background(), pods, kv.Key, kv.Value, kv.ModRevision)
		if err != nil {
			t.Errorf("%s: %v", key, err)
			continue
		}
		want, err := stored.JSON()
		if err != nil {
			t.Fatal(err)
		}
		if string(o) != asListItem(strings.TrimSuffix(string(want), "\n")) {
			t.Errorf("%s: served\n%s\nkube-apiserver serves\n%s", key, o, want)
		}
	}
}

// typeMetaPrefix is the TypeMeta kube's JSON serializer writes first.
var typeMetaPrefix = regexp.MustCompile(`^\{"kind":"[^"]*","apiVersion":"[^"]*",?`)

// asListItem is obj (kube's JSON of an object) as kube-apiserver writes it
// in a list: without kind and apiVersion.
func asListItem(obj string) string {
	return typeMetaPrefix.ReplaceAllLiteralString(obj, "{")
}

// TestIngestRestartMidBurst kills ingest (SIGKILL) in the middle of a burst
// of writes and restarts it: the stream must hold every revision once, in
// order, and a watching client must see every change once.
func TestIngestRestartMidBurst(t *testing.T) {
	e := startStack(t, stack.Options{})
	ctx := testContext(t, 3*time.Minute)
	from := e.rev(t, ctx)
	_, events := e.openWatch(t, ctx, "/api/v1/pods?watch=true&resourceVersion="+strconv.FormatInt(from, 10))

	const writes = 600
	wantCh := make(chan []checker.WatchEvent)
	killAt := make(chan struct{})
	go func() {
		var want []checker.WatchEvent
		for i := range writes {
			if i == writes/4 {
				close(killAt)
			}
			ns := fmt.Sprintf("ns-%d", (i%200)%3)
			name := fmt.Sprintf("p-%03d", i%200)
			want = append(want, e.put(t, ctx, ns, name, podJSON(ns, name, "n", i), i < 200))
		}
		wantCh <- want
	}()
	<-killAt
	ingest := e.Proc("ingest-0")
	ingest.Kill()
	if err := ingest.Start(); err != nil {
		t.Fatal(err)
	}
	want := <-wantCh
	last := want[len(want)-1].RV

	got := collect(t, ctx, events, last)
	for _, err := range checker.CheckWatch(want, got) {
		t.Error(err)
	}

	recs, err := checker.ReadStream(ctx, e.js, "HERALD")
	if err != nil {
		t.Fatal(err)
	}
	if history := e.checkStream(t, ctx, recs, from, last); len(history) != writes {
		t.Fatalf("etcd history has %d changes, want %d", len(history), writes)
	}
	if n := metric(t, ingest, "herald_ingest_leader_terms_total"); n != 1 {
		t.Errorf("restarted ingest has %v leadership terms, want 1", n)
	}
}

// TestBadInput: a stored value that is not a valid object is skipped (with a
// metric and one log line naming key and revision) and the pipeline goes on;
// requests get Kubernetes Status errors.
func TestBadInput(t *testing.T) {
	e := startStack(t, stack.Options{})
	ctx := testContext(t, time.Minute)
	var list podList
	e.get(t, "/api/v1/namespaces/default/pods", &list)
	_, events := e.openWatch(t, ctx, "/api/v1/namespaces/default/pods?watch=true&resourceVersion="+list.Metadata.ResourceVersion)

	bad, err := e.etcd.Put(ctx, "/registry/pods/default/broken", "{not json")
	if err != nil {
		t.Fatal(err)
	}
	mismatch, err := e.etcd.Put(ctx, "/registry/pods/default/liar", podJSON("default", "someone-else", "n", 0))
	if err != nil {
		t.Fatal(err)
	}
	good := e.put(t, ctx, "default", "fine", podJSON("default", "fine", "n", 0), true)
	got := collect(t, ctx, events, good.RV)
	if len(got) != 1 || got[0] != good {
		t.Fatalf("watch saw %+v, want only %+v", got, good)
	}
	e.get(t, "/api/v1/namespaces/default/pods", &list)
	if len(list.Items) != 1 {
		t.Fatalf("LIST has %d items, want only the valid pod", len(list.Items))
	}
	if n := metric(t, e.Proc("cache-0"), "herald_cache_undecodable_values_total"); n != 2 {
		t.Errorf("herald_cache_undecodable_values_total = %v, want 2", n)
	}
	logs, _ := os.ReadFile(e.logs)
	for _, want := range []string{
		fmt.Sprintf("key=/registry/pods/default/broken revision=%d reason=corrupt", bad.Header.Revision),
		fmt.Sprintf("key=/registry/pods/default/liar revision=%d reason=key_mismatch", mismatch.Header.Revision),
	} {
		if n := strings.Count(string(logs), `msg="skipping a stored value that cannot be decoded" component=cache resource=pods `+want); n != 1 {
			t.Errorf("cache logged %q %d times, want once", want, n)
		}
	}

	cases := []struct {
		name, path, token string
		code              int
		reason            string
	}{
		{"unknown resource", "/api/v1/widgets", "", 404, "NotFound"},
		{"unknown group", "/apis/example.com/v1/widgets", "", 404, ""}, // kube-apiserver's plain-text "404 page not found"
		{"missing object", "/api/v1/namespaces/default/pods/nope", "", 404, "NotFound"},
		{"no token", "/api/v1/pods", "-", 401, "Unauthorized"},
		{"wrong token", "/api/v1/pods", "Bearer not-a-token", 401, "Unauthorized"},
		{"malformed resourceVersion", "/api/v1/pods?resourceVersion=abc", "", 400, "BadRequest"},
		// kube-apiserver's own answer (its storage's error, not a Status
		// error): a drop-in answers the same.
		{"malformed watch resourceVersion", "/api/v1/pods?watch=true&resourceVersion=abc", "", 500, ""},
		{"malformed limit", "/api/v1/pods?limit=x", "", 400, "BadRequest"}, // a negative one lists everything, as in kube-apiserver
		{"malformed continue", "/api/v1/pods?limit=1&continue=xyz", "", 400, "BadRequest"},
		{"malformed selector", "/api/v1/pods?labelSelector=a%20in%20(", "", 400, "BadRequest"},
		{"unsupported field", "/api/v1/pods?fieldSelector=spec.bogus%3Dx", "", 400, "BadRequest"},
		{"match without rv", "/api/v1/pods?resourceVersionMatch=Exact", "", 422, "Invalid"},
	}
	plain := &http.Client{Transport: e.TLSTransport()}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodGet, e.FrontdoorURL+c.path, nil)
			client := e.http
			switch c.token {
			case "-":
				client = plain
			case "":
			default:
				req.Header.Set("Authorization", c.token)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if c.code == http.StatusNotFound && c.reason == "" {
				if resp.StatusCode != c.code || string(body) != "404 page not found\n" {
					t.Errorf("%s: HTTP %d %q, want %d and kube-apiserver's plain 404", c.path, resp.StatusCode, body, c.code)
				}
				return
			}
			var st objMeta
			json.Unmarshal(body, &st)
			if resp.StatusCode != c.code || st.Kind != "Status" || st.Code != c.code || st.Reason != c.reason {
				t.Errorf("%s: HTTP %d, Status kind=%q code=%d reason=%q message=%q; want %d %s", c.path, resp.StatusCode, st.Kind, st.Code, st.Reason, st.Message, c.code, c.reason)
			}
		})
	}
}

// mvccKV is etcd's key-value type.
type mvccKV = mvccpb.KeyValue
