package e2e

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"herald.dev/integration/checker"
	"herald.dev/integration/stack"
)

// conformance is the stack the API conformance suite runs against: a small
// window so that "older than the window" is reachable, short waits and
// bookmark intervals so that timeouts and bookmarks are observable quickly.
func conformanceStack(t *testing.T) *env {
	return startStack(t, stack.Options{Flags: map[string][]string{
		"cache":  {"--default-watch-cache-size=40", "--wait-timeout=1s"},
		"fanout": {"--bookmark-interval=200ms", "--ring-size=16"},
	}})
}

type status struct {
	Kind    string `json:"kind"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Code    int    `json:"code"`
	Message string `json:"message"`
	Details *struct {
		Name              string `json:"name"`
		RetryAfterSeconds int    `json:"retryAfterSeconds"`
		Causes            []struct {
			Reason string `json:"reason"`
		} `json:"causes"`
	} `json:"details"`
}

// do sends a GET with optional headers and returns code, headers, body.
func (e *env) do(t *testing.T, path string, hdr map[string]string) (int, http.Header, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, e.FrontdoorURL+path, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

func (e *env) wantStatus(t *testing.T, path string, code int, reason string) status {
	t.Helper()
	got, _, body := e.do(t, path, nil)
	var st status
	json.Unmarshal(body, &st)
	if got != code || st.Kind != "Status" || st.Code != code || st.Reason != reason || st.Status != "Failure" {
		t.Fatalf("GET %s: HTTP %d %s; want %d %s", path, got, body, code, reason)
	}
	return st
}

func names(items []json.RawMessage) []string {
	var out []string
	for _, it := range items {
		var m objMeta
		json.Unmarshal(it, &m)
		out = append(out, m.Metadata.Namespace+"/"+m.Metadata.Name+"@"+m.Metadata.ResourceVersion)
	}
	sort.Strings(out)
	return out
}

// etcdNames lists etcd's pods at rev in the same form as names.
func (e *env) etcdNames(t *testing.T, ctx context.Context, prefix string, rev int64, match func(string) bool) []string {
	t.Helper()
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	resp, err := e.etcd.Get(ctx, prefix, opts...)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, kv := range resp.Kvs {
		if match != nil && !match(string(kv.Value)) {
			continue
		}
		out = append(out, checker.KeyName("/registry/pods/", string(kv.Key))+"@"+strconv.FormatInt(kv.ModRevision, 10))
	}
	sort.Strings(out)
	return out
}

func TestConformance(t *testing.T) {
	e := conformanceStack(t)
	ctx := testContext(t, 4*time.Minute)
	// etcd's revision once the stack is up: the stream's history starts at
	// or before it (ingest's first record, after its own election and
	// generation keys), and every pod below is written after it.
	startRV := e.rev(t, ctx)
	// Fixture: 12 pods in two namespaces on two nodes with two apps.
	var lastRV int64
	for i := range 12 {
		ns := []string{"a", "b"}[i%2]
		name := fmt.Sprintf("p%02d", i)
		ev := e.put(t, ctx, ns, name, labeledPod(ns, name, fmt.Sprintf("n%d", i%2), []string{"web", "db"}[i%3%2]), true)
		lastRV = ev.RV
	}
	fixtureRV := lastRV

	t.Run("discovery", func(t *testing.T) {
		var res struct {
			GroupVersion string `json:"groupVersion"`
			Resources    []struct {
				Name       string   `json:"name"`
				Namespaced bool     `json:"namespaced"`
				Kind       string   `json:"kind"`
				Verbs      []string `json:"verbs"`
			} `json:"resources"`
		}
		if code := e.get(t, "/api/v1", &res); code != 200 || res.GroupVersion != "v1" {
			t.Fatalf("/api/v1: %d %+v", code, res)
		}
		found := map[string]bool{}
		for _, r := range res.Resources {
			found[fmt.Sprint(r.Name, r.Namespaced, r.Kind, strings.Join(r.Verbs, ","))] = true
		}
		for _, want := range []string{"podstruePodget,list,watch", "nodesfalseNodeget,list,watch", "namespacesfalseNamespaceget,list,watch"} {
			if !found[want] {
				t.Errorf("/api/v1 lacks %s: %+v", want, res.Resources)
			}
		}
		var groups struct {
			Groups []struct {
				Name string `json:"name"`
			} `json:"groups"`
		}
		// Every group and resource of the built-in registry (libs/storage's
		// table of kube-apiserver's resources), nothing else.
		wantGroups, appsResources := builtinGroups()
		e.get(t, "/apis", &groups)
		var gotGroups []string
		for _, g := range groups.Groups {
			gotGroups = append(gotGroups, g.Name)
		}
		if !slices.Equal(gotGroups, wantGroups) {
			t.Errorf("/apis: %v, want %v", gotGroups, wantGroups)
		}
		e.get(t, "/apis/apps/v1", &res)
		if res.GroupVersion != "apps/v1" || len(res.Resources) != appsResources {
			t.Errorf("/apis/apps/v1: %+v, want %d resources", res, appsResources)
		}
		var v struct {
			Major, Minor string
		}
		if code := e.get(t, "/version", &v); code != 200 || v.Major != "1" {
			t.Errorf("/version: %d %+v", code, v)
		}
	})

	t.Run("list modes", func(t *testing.T) {
		var l podList
		e.get(t, "/api/v1/pods", &l)
		if got, want := names(l.Items), e.etcdNames(t, ctx, "/registry/pods/", 0, nil); fmt.Sprint(got) != fmt.Sprint(want) || l.Metadata.ResourceVersion != strconv.FormatInt(fixtureRV, 10) {
			t.Fatalf("consistent LIST at %s = %v, want %v at %d", l.Metadata.ResourceVersion, got, want, fixtureRV)
		}
		e.get(t, "/api/v1/pods?resourceVersion=0", &l)
		if len(l.Items) != 12 {
			t.Errorf("RV=0 LIST has %d items", len(l.Items))
		}
		// Exact at an older revision in the window: etcd's state then.
		old := fixtureRV - 4
		e.get(t, "/api/v1/pods?resourceVersion="+strconv.FormatInt(old, 10)+"&resourceVersionMatch=Exact", &l)
		if got, want := names(l.Items), e.etcdNames(t, ctx, "/registry/pods/", old, nil); fmt.Sprint(got) != fmt.Sprint(want) || l.Metadata.ResourceVersion != strconv.FormatInt(old, 10) {
			t.Errorf("Exact LIST at %d = %v (rv %s), want %v", old, got, l.Metadata.ResourceVersion, want)
		}
		e.get(t, "/api/v1/pods?resourceVersion="+strconv.FormatInt(old, 10)+"&resourceVersionMatch=NotOlderThan", &l)
		if rv, _ := strconv.ParseInt(l.Metadata.ResourceVersion, 10, 64); rv < old || len(l.Items) != 12 {
			t.Errorf("NotOlderThan LIST: rv %d, %d items", rv, len(l.Items))
		}
		// A revision the cache never reaches: 504 with ResourceVersionTooLarge.
		st := e.wantStatus(t, "/api/v1/pods?resourceVersion=99999999&resourceVersionMatch=NotOlderThan", 504, "Timeout")
		if st.Details == nil || st.Details.RetryAfterSeconds != 1 || len(st.Details.Causes) != 1 || st.Details.Causes[0].Reason != "ResourceVersionTooLarge" {
			t.Errorf("too large: %+v", st)
		}
		e.wantStatus(t, "/api/v1/pods?resourceVersion=0&resourceVersionMatch=Exact", 422, "Invalid")
		e.wantStatus(t, "/api/v1/pods?resourceVersionMatch=NotOlderThan", 422, "Invalid")
		e.wantStatus(t, "/api/v1/pods?resourceVersion=1&resourceVersionMatch=Newest", 422, "Invalid")
		e.wantStatus(t, "/api/v1/pods?sendInitialEvents=true", 422, "Invalid")
		e.wantStatus(t, "/api/v1/pods?resourceVersion=-5", 400, "BadRequest")
	})

	t.Run("get", func(t *testing.T) {
		var p objMeta
		if code := e.get(t, "/api/v1/namespaces/a/pods/p00", &p); code != 200 || p.Kind != "Pod" || p.Metadata.Name != "p00" || p.Metadata.Namespace != "a" {
			t.Fatalf("GET: %d %+v", code, p)
		}
		st := e.wantStatus(t, "/api/v1/namespaces/a/pods/nope", 404, "NotFound")
		if st.Details == nil || st.Details.Name != "nope" {
			t.Errorf("404 details: %+v", st)
		}
		e.wantStatus(t, "/api/v1/namespaces/b/pods/p00", 404, "NotFound") // p00 lives in a
	})

	t.Run("selectors", func(t *testing.T) {
		var l podList
		e.get(t, "/api/v1/pods?labelSelector=app%3Dweb&fieldSelector=spec.nodeName%3Dn0", &l)
		want := e.etcdNames(t, ctx, "/registry/pods/", 0, func(v string) bool {
			return strings.Contains(v, `"app":"web"`) && strings.Contains(v, `"nodeName":"n0"`)
		})
		if got := names(l.Items); fmt.Sprint(got) != fmt.Sprint(want) || len(want) == 0 {
			t.Errorf("selected %v, want %v", got, want)
		}
		e.get(t, "/api/v1/namespaces/b/pods?fieldSelector=metadata.name%3Dp01", &l)
		if len(l.Items) != 1 {
			t.Errorf("metadata.name selector: %d items", len(l.Items))
		}
		e.get(t, "/api/v1/pods?labelSelector=app%20in%20(db)", &l)
		if len(l.Items) != 4 {
			t.Errorf("set-based selector: %d items, want 4", len(l.Items))
		}
	})

	t.Run("pagination", func(t *testing.T) {
		var all []json.RawMessage
		var l podList
		path := "/api/v1/pods?limit=5"
		pages := 0
		rv := ""
		for {
			var page struct {
				podList
				Metadata struct {
					ResourceVersion    string `json:"resourceVersion"`
					Continue           string `json:"continue"`
					RemainingItemCount *int64 `json:"remainingItemCount"`
				} `json:"metadata"`
			}
			if code := e.get(t, path, &page); code != 200 {
				t.Fatalf("page %d: %d", pages, code)
			}
			if rv == "" {
				rv = page.Metadata.ResourceVersion
			} else if page.Metadata.ResourceVersion != rv {
				t.Errorf("page %d at %s, first at %s", pages, page.Metadata.ResourceVersion, rv)
			}
			all = append(all, page.Items...)
			pages++
			if page.Metadata.Continue == "" {
				if page.Metadata.RemainingItemCount != nil {
					t.Errorf("last page has remainingItemCount")
				}
				break
			}
			if want := int64(12 - len(all)); page.Metadata.RemainingItemCount == nil || *page.Metadata.RemainingItemCount != want {
				t.Errorf("page %d remainingItemCount %v, want %d", pages, page.Metadata.RemainingItemCount, want)
			}
			// Writes between pages do not show: the list is at one revision.
			e.put(t, ctx, "a", fmt.Sprintf("late-%d", pages), labeledPod("a", fmt.Sprintf("late-%d", pages), "n0", "web"), true)
			path = "/api/v1/pods?limit=5&continue=" + url.QueryEscape(page.Metadata.Continue)
		}
		rvN, _ := strconv.ParseInt(rv, 10, 64)
		if got, want := names(all), e.etcdNames(t, ctx, "/registry/pods/", rvN, nil); pages != 3 || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%d pages: %v, want %v", pages, got, want)
		}
		_ = l
		// A token whose revision left the window: 410 Expired.
		var first struct {
			Metadata struct {
				Continue string `json:"continue"`
			} `json:"metadata"`
		}
		e.get(t, "/api/v1/pods?limit=2", &first)
		for i := range 45 {
			e.put(t, ctx, "churn", "c", labeledPod("churn", "c", "n0", "web"), i == 0)
		}
		// A consistent LIST (no resourceVersion) answers once the cache has
		// applied etcd's current revision: the writes above are in, and the
		// token's revision has left the window (without it the continued
		// LIST could reach a cache still behind them, and get 200).
		var caughtUp struct{}
		e.get(t, "/api/v1/pods?limit=1", &caughtUp)
		e.wantStatus(t, "/api/v1/pods?limit=2&continue="+url.QueryEscape(first.Metadata.Continue), 410, "Expired")
		e.wantStatus(t, "/api/v1/pods?limit=2&continue=bm90LWEtdG9rZW4", 400, "BadRequest")
	})

	t.Run("watch from before the stream's history", func(t *testing.T) {
		_, evs := e.openWatch(t, ctx, "/api/v1/pods?watch=true&resourceVersion=1")
		ev := <-evs
		var st status
		json.Unmarshal(ev.Object, &st)
		if ev.Type != "ERROR" || st.Code != 410 || st.Reason != "Expired" || !strings.HasPrefix(st.Message, "too old resource version: 1 (") {
			t.Fatalf("got %s %s", ev.Type, ev.Object)
		}
		if _, ok := <-evs; ok {
			t.Fatalf("stream continued after the ERROR event")
		}
	})

	t.Run("deep resume from the stream", func(t *testing.T) {
		// Older than the 40-event window, but inside the stream's history:
		// every change since, from the stream, then from the window.
		now := e.rev(t, ctx)
		history, err := checker.EtcdHistory(ctx, e.etcd, "/registry/pods/", startRV+1, now)
		if err != nil {
			t.Fatal(err)
		}
		want := checker.ExpectedEvents("/registry/pods/", history, nil)
		if len(want) <= 40 {
			t.Fatalf("only %d changes so far; the window must have been passed", len(want))
		}
		_, evs := e.openWatch(t, ctx, fmt.Sprintf("/api/v1/pods?watch=true&resourceVersion=%d", startRV))
		got := collect(t, ctx, evs, want[len(want)-1].RV)
		for _, err := range checker.CheckWatch(want, got) {
			t.Error(err)
		}
	})

	t.Run("watch initial state then changes", func(t *testing.T) {
		for _, rv := range []string{"", "0"} {
			wctx, cancel := context.WithCancel(ctx)
			_, evs := e.openWatch(t, wctx, "/api/v1/namespaces/a/pods?watch=true&resourceVersion="+rv)
			var l podList
			e.get(t, "/api/v1/namespaces/a/pods?resourceVersion=0", &l)
			seen := map[string]bool{}
			for range len(l.Items) {
				ev := <-evs
				if ev.Type != "ADDED" {
					t.Fatalf("rv=%q: initial event %s", rv, ev.Type)
				}
				seen[ev.toCheck().Key] = true
			}
			if len(seen) != len(l.Items) {
				t.Fatalf("rv=%q: %d distinct initial objects, want %d", rv, len(seen), len(l.Items))
			}
			want := e.put(t, ctx, "a", "p00", labeledPod("a", "p00", "n0", "web"), false)
			got := collect(t, ctx, evs, want.RV)
			if len(got) != 1 || got[0] != want {
				t.Fatalf("rv=%q: after initial state got %+v, want %+v", rv, got, want)
			}
			cancel()
		}
	})

	t.Run("watchlist", func(t *testing.T) {
		_, evs := e.openWatch(t, ctx, "/api/v1/namespaces/b/pods?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true")
		added := 0
		for ev := range evs {
			if ev.Type == "ADDED" {
				added++
				continue
			}
			m := ev.meta()
			if ev.Type != "BOOKMARK" || m.Metadata.Annotations["k8s.io/initial-events-end"] != "true" || m.Kind != "Pod" {
				t.Fatalf("after %d ADDED: %s %s", added, ev.Type, ev.Object)
			}
			break
		}
		if added != 6 {
			t.Fatalf("%d initial events, want 6", added)
		}
		e.wantStatus(t, "/api/v1/pods?watch=true&sendInitialEvents=true&allowWatchBookmarks=true", 422, "Invalid")
		e.wantStatus(t, "/api/v1/pods?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan", 422, "Invalid")
		e.wantStatus(t, "/api/v1/pods?watch=true&resourceVersionMatch=NotOlderThan", 422, "Invalid")
		e.wantStatus(t, "/api/v1/pods?watch=true&sendInitialEvents=maybe&resourceVersionMatch=NotOlderThan", 400, "BadRequest")
	})

	t.Run("bookmarks", func(t *testing.T) {
		var l podList
		e.get(t, "/api/v1/pods", &l)
		_, evs := e.openWatch(t, ctx, "/api/v1/pods?watch=true&allowWatchBookmarks=true&resourceVersion="+l.Metadata.ResourceVersion)
		ev := <-evs
		m := ev.meta()
		bm, _ := strconv.ParseInt(m.Metadata.ResourceVersion, 10, 64)
		listRV, _ := strconv.ParseInt(l.Metadata.ResourceVersion, 10, 64)
		if ev.Type != "BOOKMARK" || m.Kind != "Pod" || bm < listRV || m.Metadata.Name != "" {
			t.Fatalf("want a bookmark, got %s %s", ev.Type, ev.Object)
		}
	})

	t.Run("timeoutSeconds", func(t *testing.T) {
		var l podList
		e.get(t, "/api/v1/pods", &l)
		start := time.Now()
		_, evs := e.openWatch(t, ctx, "/api/v1/pods?watch=true&timeoutSeconds=1&resourceVersion="+l.Metadata.ResourceVersion)
		for ev := range evs {
			t.Errorf("unexpected event %s %s", ev.Type, ev.Object)
		}
		if d := time.Since(start); d < 900*time.Millisecond || d > 20*time.Second {
			t.Fatalf("watch with timeoutSeconds=1 lasted %s", d)
		}
		e.wantStatus(t, "/api/v1/pods?watch=true&timeoutSeconds=x", 400, "BadRequest")
	})

	t.Run("selector transitions", func(t *testing.T) {
		var l podList
		e.get(t, "/api/v1/pods", &l)
		_, evs := e.openWatch(t, ctx, "/api/v1/pods?watch=true&labelSelector=app%3Dweb&fieldSelector=spec.nodeName%3Dn1&resourceVersion="+l.Metadata.ResourceVersion)
		leave := e.put(t, ctx, "b", "t1", labeledPod("b", "t1", "n1", "web"), true)
		_ = e.put(t, ctx, "b", "t2", labeledPod("b", "t2", "n0", "web"), true) // never matches
		out := e.put(t, ctx, "b", "t1", labeledPod("b", "t1", "n1", "db"), false)
		back := e.put(t, ctx, "b", "t1", labeledPod("b", "t1", "n1", "web"), false)
		mod := e.put(t, ctx, "b", "t1", labeledPod("b", "t1", "n1", "web")+" ", false)
		gone := e.del(t, ctx, "b", "t1")
		want := []checker.WatchEvent{
			leave,
			{Type: "DELETED", Key: "b/t1", RV: out.RV},
			{Type: "ADDED", Key: "b/t1", RV: back.RV},
			mod,
			gone,
		}
		got := collect(t, ctx, evs, gone.RV)
		for _, err := range checker.CheckWatch(want, got) {
			t.Error(err)
		}
	})

	t.Run("tables", func(t *testing.T) {
		accept := "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
		code, hdr, body := e.do(t, "/api/v1/namespaces/a/pods?limit=500", map[string]string{"Accept": accept})
		var tbl struct {
			Kind    string `json:"kind"`
			Columns []struct {
				Name     string `json:"name"`
				Priority int    `json:"priority"`
			} `json:"columnDefinitions"`
			Rows []struct {
				Cells  []any           `json:"cells"`
				Object json.RawMessage `json:"object"`
			} `json:"rows"`
		}
		json.Unmarshal(body, &tbl)
		// kube-apiserver's printers: the default columns at priority 0, the
		// wide ones (-o wide) after them at priority 1.
		var cols []string
		for _, c := range tbl.Columns {
			if c.Priority == 0 {
				cols = append(cols, c.Name)
			}
		}
		if code != 200 || tbl.Kind != "Table" || hdr.Get("Content-Type") != "application/json" || // as kube-apiserver answers a Table
			strings.Join(cols, ",") != "Name,Ready,Status,Restarts,Age" || len(tbl.Rows) < 6 || tbl.Rows[0].Cells[2] != "Running" {
			t.Fatalf("pods table: %d %s", code, body)
		}
		_, _, body = e.do(t, "/api/v1/nodes", map[string]string{"Accept": accept})
		json.Unmarshal(body, &tbl)
		cols = nil
		for _, c := range tbl.Columns {
			if c.Priority == 0 {
				cols = append(cols, c.Name)
			}
		}
		if strings.Join(cols, ",") != "Name,Status,Roles,Age,Version" {
			t.Fatalf("nodes table: %s", body)
		}
	})

	t.Run("gzip", func(t *testing.T) {
		big := strings.Repeat("x", 4096)
		for i := range 40 {
			e.put(t, ctx, "big", fmt.Sprintf("b%02d", i), labeledPod("big", fmt.Sprintf("b%02d", i), big, "web"), true)
		}
		req, _ := http.NewRequest(http.MethodGet, e.FrontdoorURL+"/api/v1/namespaces/big/pods", nil)
		req.Header.Set("Accept-Encoding", "gzip")
		resp, err := e.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.Header.Get("Content-Encoding") != "gzip" {
			t.Fatalf("large LIST not gzipped: %v", resp.Header)
		}
		zr, err := gzip.NewReader(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		var l podList
		if err := json.NewDecoder(zr).Decode(&l); err != nil || len(l.Items) != 40 {
			t.Fatalf("gzipped LIST: %v, %d items", err, len(l.Items))
		}
		// A small one is not.
		code, hdr, _ := e.do(t, "/api/v1/namespaces/a/pods", map[string]string{"Accept-Encoding": "gzip"})
		if code != 200 || hdr.Get("Content-Encoding") != "" {
			t.Fatalf("small LIST: %d %v", code, hdr)
		}
		// A WatchList stream is gzipped; its initial events decode.
		req, _ = http.NewRequestWithContext(ctx, http.MethodGet, e.FrontdoorURL+"/api/v1/namespaces/big/pods?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true", nil)
		req.Header.Set("Accept-Encoding", "gzip")
		resp2, err := e.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp2.Body.Close()
		if resp2.Header.Get("Content-Encoding") != "gzip" {
			t.Fatalf("watchlist not gzipped: %v", resp2.Header)
		}
		zr, _ = gzip.NewReader(resp2.Body)
		dec := json.NewDecoder(zr)
		for i := range 41 {
			var ev watchEvent
			if err := dec.Decode(&ev); err != nil {
				t.Fatalf("event %d: %v", i, err)
			}
			if (i < 40 && ev.Type != "ADDED") || (i == 40 && ev.Type != "BOOKMARK") {
				t.Fatalf("event %d: %s", i, ev.Type)
			}
		}
	})
}

// labeledPod is a pod with an app label on a node.
func labeledPod(ns, name, node, app string) string {
	b, _ := json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": name, "namespace": ns, "labels": map[string]string{"app": app}, "creationTimestamp": "2026-01-01T00:00:00Z"},
		"spec":     map[string]any{"nodeName": node, "containers": []map[string]any{{"name": "c", "image": "img"}}},
		"status":   map[string]any{"phase": "Running", "containerStatuses": []map[string]any{{"name": "c", "ready": true, "restartCount": 0, "state": map[string]any{"running": map[string]any{}}}}},
	})
	return string(b)
}

// TestUnavailableAndLimits: a cache that is down gives 503 with
// Retry-After; a fanout at its watcher limit gives 429 with Retry-After.
func TestUnavailableAndLimits(t *testing.T) {
	e := startStack(t, stack.Options{Flags: map[string][]string{"fanout": {"--max-watchers=2"}}})
	ctx := testContext(t, time.Minute)
	var l podList
	e.get(t, "/api/v1/pods", &l)
	for range 2 {
		if code, _ := e.openWatch(t, ctx, "/api/v1/pods?watch=true&resourceVersion="+l.Metadata.ResourceVersion); code != 200 {
			t.Fatalf("watch: %d", code)
		}
	}
	code, hdr, body := e.do(t, "/api/v1/pods?watch=true&resourceVersion="+l.Metadata.ResourceVersion, nil)
	var st status
	json.Unmarshal(body, &st)
	if code != 429 || st.Reason != "TooManyRequests" || hdr.Get("Retry-After") != "1" {
		t.Fatalf("third watch: %d %v %s", code, hdr, body)
	}
	e.Proc("cache-0").Kill()
	code, hdr, body = e.do(t, "/api/v1/pods", nil)
	json.Unmarshal(body, &st)
	if code != 503 || st.Reason != "ServiceUnavailable" || hdr.Get("Retry-After") != "1" {
		t.Fatalf("LIST with the cache down: %d %v %s", code, hdr, body)
	}
}
