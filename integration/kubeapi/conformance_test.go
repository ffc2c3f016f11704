package kubeapi

import (
	"bytes"
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func (c *resourceCase) title() string {
	if c.gvr.Group == "" {
		return c.gvr.Resource
	}
	return c.gvr.Resource + "." + c.gvr.Group
}

// TestResources compares, resource by resource, every read Herald serves
// with kube-apiserver's answer to the same request (see the package doc).
func TestResources(t *testing.T) {
	f := env(t)
	t.Cleanup(func() { f.logTail(t) })
	for _, c := range f.cases {
		t.Run(c.title(), func(t *testing.T) { f.checkResource(t, c) })
	}
}

func query(kv ...string) url.Values {
	q := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	return q
}

// objects names the objects GET is compared on, by namespace ("" for
// cluster-scoped): the case's own (object 2 deleted or being deleted), or
// for a resource only kube-apiserver writes the first five it lists.
func (f *fixture) objects(t *testing.T, c *resourceCase) (names, nss []string) {
	if c.make != nil {
		for _, i := range []int{0, 1, 2, 3, 4} {
			names, nss = append(names, c.name0(i)), append(nss, c.ns(i))
		}
		return names, nss
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	l, err := f.dyn.Resource(c.gvr).List(ctx, metav1.ListOptions{Limit: 5})
	if err != nil {
		t.Fatalf("listing %s from kube-apiserver: %v", c.gvr.Resource, err)
	}
	for _, it := range l.Items {
		names, nss = append(names, it.GetName()), append(nss, it.GetNamespace())
	}
	if len(names) == 0 {
		t.Fatalf("kube-apiserver has no %s", c.gvr.Resource)
	}
	return names, nss
}

// validToken is a continue token both servers can read (a start key under
// any list's prefix, at revision 5).
var validToken = base64.RawURLEncoding.EncodeToString([]byte(`{"v":"meta.k8s.io/v1","rv":5,"start":"x\u0000"}`))

func (f *fixture) checkResource(t *testing.T, c *resourceCase) {
	names, nss := f.objects(t, c)
	var checks []check
	add := func(name string, fetch fetcher, o agreeOpts) {
		checks = append(checks, check{name: name, fetch: fetch, opts: o})
	}
	for i, name := range names {
		p := c.path(nss[i]) + "/" + name
		g := "get/" + name + "/"
		add(g+"json", f.fetchJSON(p, nil, mediaJSON), agreeOpts{})
		add(g+"protobuf", f.fetchProtobuf(p, nil, mediaProtobuf), agreeOpts{})
		add(g+"metadata", f.fetchJSON(p, nil, mediaJSON+asMeta), agreeOpts{})
		add(g+"metadata-protobuf", f.fetchProtobuf(p, nil, mediaProtobuf+asMeta), agreeOpts{})
		add(g+"table", f.fetchJSON(p, nil, acceptTable), agreeOpts{})
		// A GET's only option is resourceVersion: a list's are ignored.
		add(g+"list-options", f.fetchJSON(p, query("labelSelector", "nothing=here", "fieldSelector", "metadata.name=other",
			"limit", "1", "continue", "garbage", "resourceVersionMatch", "Exact"), mediaJSON), agreeOpts{})
	}

	scopes := []struct{ name, ns string }{{"all", ""}}
	if c.namespaced {
		scopes = append(scopes, struct{ name, ns string }{"namespace", nsA})
	}
	consistent := agreeOpts{listRV: true}
	fields := append([]string{"metadata.name=" + names[0], "metadata.name!=" + names[0]}, c.fields...)
	if c.namespaced {
		fields = append(fields, "metadata.namespace="+nsA, "metadata.namespace!="+nsA, "metadata.namespace="+nsA+",metadata.name="+names[0])
	}
	labels := []string{"herald-e2e=yes", "tier in (a,b)", "tier!=a", "!tier", "tier", "herald-e2e=yes,tier notin (c)", "watched=yes", "nothing=here"}
	for _, sc := range scopes {
		p := c.path(sc.ns)
		l := "list/" + sc.name + "/"
		add(l+"json", f.fetchJSON(p, nil, mediaJSON), consistent)
		add(l+"protobuf", f.fetchProtobuf(p, nil, mediaProtobuf), consistent)
		add(l+"metadata", f.fetchJSON(p, nil, mediaJSON+asMetaList), consistent)
		add(l+"metadata-protobuf", f.fetchProtobuf(p, nil, mediaProtobuf+asMetaList), consistent)
		add(l+"table", f.fetchJSON(p, nil, acceptTable), consistent)
		add(l+"table-includeObject", f.fetchJSON(p, query("includeObject", "Object"), acceptTable), consistent)
		add(l+"table-limit", f.fetchPages(p, nil, acceptTable, 2), consistent)
		add(l+"limit", f.fetchPages(p, nil, mediaJSON, 2), consistent)
		add(l+"limit-1", f.fetchPages(p, nil, mediaJSON, 1), consistent)
		add(l+"limit-label", f.fetchPages(p, query("labelSelector", "herald-e2e=yes"), mediaJSON, 1), consistent)
		add(l+"resourceVersion=0", f.fetchJSON(p, query("resourceVersion", "0"), mediaJSON), agreeOpts{stale: true})
		add(l+"resourceVersion=0-limit", f.fetchJSON(p, query("resourceVersion", "0", "limit", "1"), mediaJSON), agreeOpts{stale: true})
		for _, sel := range labels {
			add(l+"label/"+sel, f.fetchJSON(p, query("labelSelector", sel), mediaJSON), consistent)
		}
		for _, sel := range fields {
			add(l+"field/"+sel, f.fetchJSON(p, query("fieldSelector", sel), mediaJSON), consistent)
		}
		add(l+"field+label", f.fetchJSON(p, query("fieldSelector", "metadata.name!="+names[0], "labelSelector", "herald-e2e=yes"), mediaJSON), consistent)
		// WatchList: the initial events, then the bookmark ending them.
		watchList := query("watch", "true", "sendInitialEvents", "true", "allowWatchBookmarks", "true", "resourceVersionMatch", "NotOlderThan")
		add("watchlist/"+sc.name+"/json", f.fetchWatchJSON(p, watchList, mediaJSON, ""), consistent)
		add("watchlist/"+sc.name+"/metadata", f.fetchWatchJSON(p, watchList, mediaJSON+asMeta, ""), consistent)
		if c.marker == "" {
			// Only kube-apiserver writes this resource: no watch phase.
			continue
		}
		w := "watch/" + sc.name + "/"
		from := query("resourceVersion", c.watchFrom)
		with := func(k, v string) url.Values {
			q := cloneValues(from)
			q.Set(k, v)
			return q
		}
		// Paged lists at the revision before the watch phase, whose
		// changes they must not show: exact with resourceVersionMatch, and
		// without it too (kube-apiserver's legacy rule for a list with a
		// limit).
		add(l+"resourceVersion-limit", f.fetchPages(p, from, mediaJSON, 1), agreeOpts{})
		add(l+"resourceVersion-exact-limit", f.fetchPages(p, with("resourceVersionMatch", "Exact"), mediaJSON, 1), agreeOpts{})
		// Each server continues the other's list with the other's token.
		add(l+"resourceVersion-limit-crossed", f.fetchPagesCrossed(p, from, mediaJSON, 1), agreeOpts{})
		add(l+"limit-label-crossed", f.fetchPagesCrossed(p, with("labelSelector", "herald-e2e=yes"), mediaJSON, 1), agreeOpts{})
		add(w+"json", f.fetchWatchJSON(p, from, mediaJSON, c.marker), agreeOpts{})
		add(w+"watch=Yes", f.fetchWatchJSON(p, with("watch", "Yes"), mediaJSON, c.marker), agreeOpts{})
		add(w+"protobuf", f.fetchWatchProtobuf(p, from, mediaProtobuf, c.marker), agreeOpts{})
		add(w+"metadata", f.fetchWatchJSON(p, from, mediaJSON+asMeta, c.marker), agreeOpts{})
		add(w+"metadata-protobuf", f.fetchWatchProtobuf(p, from, mediaProtobuf+asMeta, c.marker), agreeOpts{})
		add(w+"table", f.fetchWatchJSON(p, from, acceptTable, c.marker), agreeOpts{})
		// Object 1 leaves this selector (tier=gone) during the watch
		// phase; object 0 (the marker) stays in it.
		add(w+"label", f.fetchWatchJSON(p, with("labelSelector", "herald-e2e=yes,tier!=gone"), mediaJSON, c.marker), agreeOpts{})
		add(w+"field", f.fetchWatchJSON(p, with("fieldSelector", "metadata.name="+names[0]), mediaJSON, c.marker), agreeOpts{})
	}
	f.runChecks(t, checks)

	p := c.path(nss[0])
	t.Run("errors", func(t *testing.T) {
		for _, e := range []struct {
			name, path, accept string
			q                  url.Values
		}{
			{"bad-label-selector", p, mediaJSON, query("labelSelector", "tier in (a")},
			{"bad-label-key", p, mediaJSON, query("labelSelector", "-bad-=x")},
			{"unknown-field-label", p, mediaJSON, query("fieldSelector", "herald.bogus=x")},
			{"field-selector-syntax", p, mediaJSON, query("fieldSelector", "metadata.name")},
			{"field-metadata.namespace", c.path(""), mediaJSON, query("fieldSelector", "metadata.namespace=x")},
			{"bad-resourceVersion", p, mediaJSON, query("resourceVersion", "abc")},
			{"resourceVersionMatch-without-resourceVersion", p, mediaJSON, query("resourceVersionMatch", "NotOlderThan")},
			{"bad-resourceVersionMatch", p, mediaJSON, query("resourceVersion", "1", "resourceVersionMatch", "Bogus")},
			{"bad-continue", p, mediaJSON, query("limit", "1", "continue", "garbage")},
			{"continue-with-resourceVersion", p, mediaJSON, query("limit", "1", "continue", validToken, "resourceVersion", "5")},
			{"continue-with-bad-resourceVersion", p, mediaJSON, query("limit", "1", "continue", validToken, "resourceVersion", "abc")},
			{"bad-continue-with-resourceVersion", p, mediaJSON, query("limit", "1", "continue", "garbage", "resourceVersion", "5")},
			{"continue-unknown-version", p, mediaJSON, query("limit", "1", "continue", base64.RawURLEncoding.EncodeToString([]byte(`{"v":"herald/v1","rv":5,"after":"/x"}`)))},
			{"continue-traversal", p, mediaJSON, query("limit", "1", "continue", base64.RawURLEncoding.EncodeToString([]byte(`{"v":"meta.k8s.io/v1","rv":5,"start":"../secrets/x"}`)))},
			{"negative-limit", p, mediaJSON, query("limit", "-1")},
			{"watch-bad-resourceVersion", p, mediaJSON, query("watch", "true", "resourceVersion", "abc")},
			{"watch-bad-label-selector", p, mediaJSON, query("watch", "true", "labelSelector", "tier in (a")},
			{"not-found", p + "/does-not-exist", mediaJSON, nil},
			{"not-acceptable", p, "application/x-bogus", nil},
			{"not-acceptable-protobuf-as", p, mediaProtobuf + ";as=Bogus;g=meta.k8s.io;v=v1", nil},
			{"accept-yaml", p + "/" + names[0], "application/yaml", nil},
			{"unknown-subresource", p + "/" + names[0] + "/bogus", mediaJSON, nil},
		} {
			t.Run(e.name, func(t *testing.T) { f.agreeStatus(t, e.path, e.q, e.accept) })
		}
	})
}

// TestBadRequests compares the answers to requests for what does not
// exist at all.
func TestBadRequests(t *testing.T) {
	f := env(t)
	for _, p := range []string{
		"/api/v1/foos",
		"/api/v1/namespaces/" + nsA + "/foos",
		"/api/v2/pods",
		"/apis/apps/v1/foos",
		"/apis/apps/v7/deployments",
		"/apis/nothing.e2e.herald.test/v1/nothings",
		"/apis/" + crdGroup + "/v1/nothings",
		"/apis/" + crdGroup + "/v2/widgets",
		"/api/v1/namespaces/does-not-exist/pods/nope",
		"/api/v1/nodes/does-not-exist",
	} {
		t.Run(p, func(t *testing.T) {
			f.agreeStatus(t, p, nil, mediaJSON)
			t.Run("watch", func(t *testing.T) { f.agreeStatus(t, p, query("watch", "true"), mediaJSON) })
		})
	}
	// kube-apiserver waits up to 3 s for its cache to reach a future
	// revision, then answers 504 (ResourceVersionTooLarge).
	t.Run("resourceVersion-too-large", func(t *testing.T) {
		f.agreeStatus(t, "/api/v1/pods", query("resourceVersion", "999999999", "resourceVersionMatch", "NotOlderThan"), mediaJSON)
	})
}

// TestErrorBodies compares error answers byte for byte: their Content-Type
// and body are negotiated as kube-apiserver negotiates them (indented JSON
// for curl, a protobuf Status for a protobuf client), for errors of served
// requests and of authentication alike.
func TestErrorBodies(t *testing.T) {
	f := env(t)
	const curl = "curl/8.5.0"
	for _, tc := range []struct {
		name, path, token, agent, accept string
	}{
		{"missing object, curl", "/api/v1/namespaces/" + nsA + "/pods/nope", "", curl, ""},
		{"bad selector, curl", "/api/v1/pods?labelSelector=a+in+%28", "", curl, ""},
		{"bad token, curl", "/api/v1/pods", "not-a-token", curl, ""},
		{"bad token", "/api/v1/pods", "not-a-token", "", mediaJSON},
		{"bad token, protobuf", "/api/v1/pods", "not-a-token", "", mediaProtobuf + ", " + mediaJSON},
		{"missing object, protobuf", "/api/v1/namespaces/" + nsA + "/pods/nope", "", "", mediaProtobuf + ", " + mediaJSON},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fetch := func(base string) (int, string, string, []string) {
				req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, base+tc.path, nil)
				if tc.token != "" {
					req.Header.Set("Authorization", "Bearer "+tc.token)
				}
				if tc.agent != "" {
					req.Header.Set("User-Agent", tc.agent)
				}
				if tc.accept != "" {
					req.Header.Set("Accept", tc.accept)
				}
				resp, err := f.http.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, resp.Header.Get("Content-Type"), string(b), resp.Header.Values("Cache-Control")
			}
			kc, kt, kb, kcc := fetch(f.kubeURL)
			hc, ht, hb, hcc := fetch(f.heraldURL)
			if kc < 400 || hc != kc || ht != kt || hb != kb || !slices.Equal(hcc, kcc) {
				t.Errorf("kube-apiserver %d %s Cache-Control %q\n%q\nHerald %d %s Cache-Control %q\n%q", kc, kt, kcc, kb, hc, ht, hcc, hb)
			}
		})
	}
}

// TestStorageFormat checks that the test tests what it claims: etcd holds
// kube-apiserver's protobuf, Secrets encrypted with aescbc, custom
// resources as JSON.
func TestStorageFormat(t *testing.T) {
	f := env(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{f.stack.EtcdEndpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	for key, prefix := range map[string]string{
		"/registry/pods/" + nsA + "/pods-0":                        "k8s\x00",
		"/registry/minions/nodes-0":                                "k8s\x00",
		"/registry/services/specs/" + nsA + "/services-0":          "k8s\x00",
		"/registry/secrets/" + nsA + "/secrets-0":                  "k8s:enc:aescbc:v1:key1:",
		"/registry/" + crdGroup + "/widgets/" + nsA + "/widgets-0": "{",
	} {
		resp, err := cli.Get(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) != 1 || !bytes.HasPrefix(resp.Kvs[0].Value, []byte(prefix)) {
			got := ""
			if len(resp.Kvs) == 1 {
				got = clip(resp.Kvs[0].Value, 24)
			}
			t.Errorf("%s: want a value starting with %q, got %q", key, prefix, got)
		}
	}
}
