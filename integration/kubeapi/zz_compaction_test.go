package kubeapi

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// This file's test compacts etcd: it runs last (the file sorts last), so
// that no other test of the shared fixture finds its history compacted.

// TestContinueAfterCompaction is Kubernetes' conformance test "should
// support continue listing from the last key if the original version has
// been compacted away, though the list is inconsistent" side by side: a
// paged list's first page from each server, an object created after it,
// etcd compacted as kube-apiserver's compactor compacts it; then each
// server answers its token 410 Expired with kube-apiserver's message and
// an inconsistent continue token, and the pages either token leads to, on
// either server, list the same names (the new object included) after the
// first page's last one. A list at the compacted revision exactly gets
// 410 from both.
func TestContinueAfterCompaction(t *testing.T) {
	f := env(t)
	t.Cleanup(func() { f.logTail(t) })
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	const ns = "herald-e2e-chunking"
	nsGVR := schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	if _, err := f.dyn.Resource(nsGVR).Create(ctx, &unstructured.Unstructured{Object: obj{"apiVersion": "v1", "kind": "Namespace", "metadata": obj{"name": ns}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cms := f.dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}).Namespace(ns)
	create := func(name string) {
		t.Helper()
		if _, err := cms.Create(ctx, &unstructured.Unstructured{Object: obj{"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": obj{"name": name}, "data": obj{"k": name}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var want []string
	for i := range 30 {
		create(fmt.Sprintf("cm-%02d", i))
		want = append(want, fmt.Sprintf("cm-%02d", i))
	}
	path := "/api/v1/namespaces/" + ns + "/configmaps"
	type page struct {
		code   int
		list   metav1.List
		status metav1.Status
		names  []string
	}
	get := func(base string, kv ...string) page {
		t.Helper()
		resp, body, err := f.readAll(ctx, base, path, query(kv...), mediaJSON)
		if err != nil {
			t.Fatal(err)
		}
		p := page{code: resp.StatusCode}
		if p.code != http.StatusOK {
			if err := json.Unmarshal(body, &p.status); err != nil {
				t.Fatalf("%s%s %v: %d %s", base, path, kv, p.code, body)
			}
			return p
		}
		var l struct {
			Metadata metav1.ListMeta `json:"metadata"`
			Items    []struct {
				Metadata metav1.ObjectMeta `json:"metadata"`
			} `json:"items"`
		}
		if err := json.Unmarshal(body, &l); err != nil {
			t.Fatal(err)
		}
		p.list.ListMeta = l.Metadata
		for _, it := range l.Items {
			p.names = append(p.names, it.Metadata.Name)
		}
		return p
	}
	servers := []struct{ what, base string }{{"kube-apiserver", f.kubeURL}, {"Herald", f.heraldURL}}
	firsts := map[string]page{}
	for _, s := range servers {
		p := get(s.base, "limit", "10")
		if p.code != http.StatusOK || !slices.Equal(p.names, want[:10]) || p.list.Continue == "" {
			t.Fatalf("%s: first page %d %v continue %q", s.what, p.code, p.names, p.list.Continue)
		}
		firsts[s.what] = p
	}
	create("cm-15a") // after the first pages: the inconsistent lists show it
	want = slices.Insert(want, 16, "cm-15a")

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{f.stack.EtcdEndpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	compacted := compactAsKubeAPIServer(ctx, t, cli)

	// Each server's token, until it expires (kube-apiserver's cache learns
	// the compaction within about 16s).
	expired := map[string]page{}
	for _, s := range servers {
		var p page
		if werr := waitFor(ctx, 90*time.Second, func() bool {
			p = get(s.base, "limit", "10", "continue", firsts[s.what].list.Continue)
			return p.code != http.StatusOK
		}); werr != nil {
			t.Fatalf("%s: the first page's token (revision %s) still served 90s after etcd compacted %d", s.what, firsts[s.what].list.ResourceVersion, compacted)
		}
		expired[s.what] = p
	}
	k, h := expired["kube-apiserver"], expired["Herald"]
	if k.code != http.StatusGone || h.code != k.code || h.status.Reason != k.status.Reason || h.status.Message != k.status.Message ||
		h.status.Code != k.status.Code || k.status.Continue == "" || h.status.Continue == "" {
		t.Fatalf("expired token:\nkube-apiserver %d %+v\nHerald         %d %+v", k.code, k.status, h.code, h.status)
	}
	if kt, ht := decodeToken(t, k.status.Continue), decodeToken(t, h.status.Continue); kt != ht {
		t.Errorf("inconsistent tokens: kube-apiserver %+v, Herald %+v", kt, ht)
	}

	// Either token, on either server: the rest of the list at a revision
	// after the compaction, in pages of at most 10 at that revision.
	for _, tokenOf := range servers {
		for _, s := range servers {
			t.Run(tokenOf.what+"'s token on "+s.what, func(t *testing.T) {
				names := slices.Clone(want[:10])
				tok, rv := expired[tokenOf.what].status.Continue, ""
				for tok != "" {
					p := get(s.base, "limit", "10", "continue", tok)
					if p.code != http.StatusOK {
						t.Fatalf("page after %v: %d %+v", names[len(names)-1], p.code, p.status)
					}
					if rv == "" {
						rv = p.list.ResourceVersion
						if rv == firsts[s.what].list.ResourceVersion {
							t.Errorf("the inconsistent list is at the first page's revision %s", rv)
						}
					} else if p.list.ResourceVersion != rv {
						t.Errorf("a later page at %s, the inconsistent list's first at %s", p.list.ResourceVersion, rv)
					}
					if len(p.names) > 10 || p.list.Continue != "" && (p.list.RemainingItemCount == nil ||
						int(*p.list.RemainingItemCount)+len(p.names)+len(names) != len(want)) {
						t.Errorf("page of %d, remainingItemCount %v after %d names", len(p.names), p.list.RemainingItemCount, len(names))
					}
					names = append(names, p.names...)
					tok = p.list.Continue
				}
				if !slices.Equal(names, want) {
					t.Errorf("names\n%v\nwant\n%v", names, want)
				}
			})
		}
	}

	// A list at the compacted revision exactly.
	var exact []page
	for _, s := range servers {
		exact = append(exact, get(s.base, "limit", "10", "resourceVersion", firsts[s.what].list.ResourceVersion, "resourceVersionMatch", "Exact"))
	}
	if exact[0].code != http.StatusGone || exact[1].code != exact[0].code || exact[1].status.Message != exact[0].status.Message ||
		exact[1].status.Reason != exact[0].status.Reason || exact[1].status.Continue != "" {
		t.Errorf("exact list at the compacted revision:\nkube-apiserver %d %+v\nHerald         %d %+v", exact[0].code, exact[0].status, exact[1].code, exact[1].status)
	}
}

// continueToken is a decoded continue token, its start key without the
// leading "/" one of kube-apiserver's storages writes and the other does
// not.
type continueToken struct {
	Rev   int64
	Start string
}

func decodeToken(t *testing.T, s string) continueToken {
	t.Helper()
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		t.Fatalf("token %q: %v", s, err)
	}
	var w struct {
		Rev   int64  `json:"rv"`
		Start string `json:"start"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		t.Fatalf("token %s: %v", b, err)
	}
	return continueToken{Rev: w.Rev, Start: strings.TrimPrefix(w.Start, "/")}
}

// compactAsKubeAPIServer compacts etcd at its current revision as
// kube-apiserver's compactor does (k8s.io/apiserver's etcd3 Compact): it
// records the revision in compact_rev_key (a compare-and-swap on the key's
// version, which fences concurrent compactors), then compacts; it returns
// the revision.
func compactAsKubeAPIServer(ctx context.Context, t *testing.T, cli *clientv3.Client) int64 {
	t.Helper()
	const key = "compact_rev_key"
	for {
		cur, err := cli.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		var version int64
		if len(cur.Kvs) > 0 {
			version = cur.Kvs[0].Version
		}
		rev := cur.Header.Revision
		resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.Version(key), "=", version)).
			Then(clientv3.OpPut(key, fmt.Sprint(rev))).Commit()
		if err != nil {
			t.Fatal(err)
		}
		if !resp.Succeeded {
			continue // kube-apiserver's own compactor went first
		}
		if _, err := cli.Compact(ctx, rev); err != nil {
			t.Fatal(err)
		}
		return rev
	}
}
