package frontdoor

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/version"

	"herald.dev/services/frontdoor/internal/discovery"
)

// fakeKube is a stand-in kube-apiserver: TokenReview, SubjectAccessReview
// (with a small policy), an upgradeable exec endpoint, and a recorder for
// everything else. It refuses every credential but Herald's.
type fakeKube struct {
	srv          *httptest.Server
	tokenReviews atomic.Int64
	mu           sync.Mutex
	seen         []*http.Request
	bodies       []string
}

const heraldToken = "herald-own-token"

func newFakeKube(t *testing.T) *fakeKube {
	k := &fakeKube{}
	k.srv = httptest.NewTLSServer(http.HandlerFunc(k.serve))
	t.Cleanup(k.srv.Close)
	return k
}

func (k *fakeKube) serve(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+heraldToken {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	switch r.URL.Path {
	case "/readyz":
		w.Write([]byte("ok"))
		return
	case "/slow":
		<-r.Context().Done()
		return
	case "/version":
		if r.Header.Get("Impersonate-User") == "" { // frontdoor's own, once at start; a client's is forwarded
			w.Write([]byte(`{"major":"1","minor":"37","gitVersion":"v1.37.2"}`))
			return
		}
	case "/apis/authentication.k8s.io/v1/tokenreviews":
		k.tokenReviews.Add(1)
		var tr authenticationv1.TokenReview
		json.NewDecoder(r.Body).Decode(&tr)
		if u, ok := clusterUsers[tr.Spec.Token]; ok {
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: u}
		} else {
			// kube-apiserver says why (the webhook authenticator turns
			// this into an error: still a 401, not a failed review).
			tr.Status.Error = "[invalid bearer token, token lookup failed]"
		}
		json.NewEncoder(w).Encode(tr)
		return
	case "/apis/authorization.k8s.io/v1/subjectaccessreviews":
		var sar authorizationv1.SubjectAccessReview
		json.NewDecoder(r.Body).Decode(&sar)
		sar.Status.Allowed = fakePolicy(&sar.Spec)
		json.NewEncoder(w).Encode(sar)
		return
	}
	// kube-apiserver echoes the audit ID it was given, and marks every
	// answer private.
	if id := r.Header.Get("Audit-ID"); id != "" {
		w.Header().Set("Audit-Id", id)
	}
	w.Header().Set("Cache-Control", "no-cache, private")
	b, _ := io.ReadAll(r.Body)
	k.mu.Lock()
	k.seen = append(k.seen, r.Clone(r.Context()))
	k.bodies = append(k.bodies, string(b))
	k.mu.Unlock()
	if r.Header.Get("Upgrade") != "" {
		c, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + r.Header.Get("Upgrade") + "\r\n\r\n")
		rw.Flush()
		io.Copy(c, rw) // echo
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"from":"upstream","path":%q}`, r.URL.Path)
}

// clusterUsers are the tokens the fake cluster's TokenReview accepts: the
// standalone tests' users (helpers_test.go) and carol, who has extras.
var clusterUsers = map[string]authenticationv1.UserInfo{
	"cluster-token": {Username: "carol", UID: "c-1", Groups: []string{"devs", "system:authenticated"}, Extra: map[string]authenticationv1.ExtraValue{"scopes.example.com/x": {"a"}}},
	tokAdmin:        {Username: "admin", UID: "1", Groups: []string{"system:masters", "system:authenticated"}},
	tokAlice:        {Username: "alice", UID: "2", Groups: []string{"system:authenticated"}},
	tokBob:          {Username: "bob", UID: "3", Groups: []string{"system:authenticated"}},
	// Service-account tokens bound to pods (bound_test.go).
	"pod-p-token":      boundUser("p", "uid-p"),
	"pod-gone-token":   boundUser("gone", "uid-gone"),
	"pod-reused-token": boundUser("p", "uid-of-an-earlier-p"),
	"pod-down-token":   boundUser("down", "uid-down"),
	"node-n1-token":    nodeBoundUser("n1", "uid-n1"),
	"node-gone-token":  nodeBoundUser("gone-node", "uid-gone-node"),
	// Service-account tokens naming a Secret in their claims (bound_test.go).
	secretToken(`{"kubernetes.io":{"namespace":"ns1","secret":{"name":"s","uid":"uid-s"}}}`):                         saUser(),
	secretToken(`{"kubernetes.io":{"namespace":"ns1","secret":{"name":"s","uid":"uid-of-an-earlier-s"}}}`):           saUser(),
	secretToken(`{"kubernetes.io/serviceaccount/namespace":"ns1","kubernetes.io/serviceaccount/secret.name":"old"}`): saUser(),
	secretToken(`{"kubernetes.io":{"namespace":"ns2","secret":{"name":"elsewhere","uid":"u"}}}`):                     saUser(),
}

// secretToken is a JWT-shaped token with claims (TokenReview, faked here,
// is what verifies it).
func secretToken(claims string) string {
	return "eyJhbGciOiJSUzI1NiJ9." + base64.RawURLEncoding.EncodeToString([]byte(claims)) + ".c2ln"
}

func saUser() authenticationv1.UserInfo {
	return authenticationv1.UserInfo{Username: "system:serviceaccount:ns1:runner", UID: "sa-uid",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:ns1", "system:authenticated"}}
}

func nodeBoundUser(node, uid string) authenticationv1.UserInfo {
	return authenticationv1.UserInfo{Username: "system:serviceaccount:ns1:runner", UID: "sa-uid",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:ns1", "system:authenticated"},
		Extra: map[string]authenticationv1.ExtraValue{
			"authentication.kubernetes.io/node-name": {node}, "authentication.kubernetes.io/node-uid": {uid}}}
}

func boundUser(pod, uid string) authenticationv1.UserInfo {
	return authenticationv1.UserInfo{Username: "system:serviceaccount:ns1:runner", UID: "sa-uid",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:ns1", "system:authenticated"},
		Extra: map[string]authenticationv1.ExtraValue{
			"authentication.kubernetes.io/pod-name": {pod}, "authentication.kubernetes.io/pod-uid": {uid},
			// The pod's node: not checked for a pod-bound token.
			"authentication.kubernetes.io/node-name": {"gone-node"}, "authentication.kubernetes.io/node-uid": {"uid-gone-node"},
			"authentication.kubernetes.io/credential-id": {"JTI=" + pod}}}
}

// fakePolicy: carol reads pods in ns1 and may impersonate dave (the legacy
// verb); bob may impersonate dave only to list pods (constrained
// impersonation's verbs); admin (system:masters) may do anything.
func fakePolicy(s *authorizationv1.SubjectAccessReviewSpec) bool {
	if slices.Contains(s.Groups, "system:masters") {
		return true
	}
	ra := s.ResourceAttributes
	switch {
	case ra == nil:
		return false
	case s.User == "carol" && ra.Resource == "pods" && ra.Namespace == "ns1" && (ra.Verb == "list" || ra.Verb == "get"):
		return true
	case s.User == "carol" && ra.Verb == "impersonate" && ra.Resource == "users" && ra.Name == "dave":
		return true
	case s.User == "bob" && ra.Verb == "impersonate:user-info" && ra.Group == "authentication.k8s.io" && ra.Resource == "users" && ra.Name == "dave":
		return true
	case s.User == "bob" && ra.Verb == "impersonate-on:user-info:list" && ra.Resource == "pods":
		return true
	case s.User == "dave" && ra.Resource == "pods" && ra.Verb == "list":
		return true
	}
	return false
}

func (k *fakeKube) last(t *testing.T) (*http.Request, string) {
	t.Helper()
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.seen) == 0 {
		t.Fatal("the upstream saw no request")
	}
	return k.seen[len(k.seen)-1], k.bodies[len(k.bodies)-1]
}

func (k *fakeKube) count() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.seen)
}

// kubeconfigFor writes a kubeconfig naming server (trusting its
// certificate) with Herald's token.
func kubeconfigFor(t *testing.T, dir, server string, caPEM []byte) string {
	return writeFile(t, filepath.Join(dir, "upstream.kubeconfig"), []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: %q, certificate-authority: %q}
users:
- name: herald
  user: {token: %q}
contexts:
- name: c
  context: {cluster: c, user: herald}
current-context: c
`, server, writeFile(t, filepath.Join(dir, "upstream-ca.crt"), caPEM), heraldToken)))
}

func clusterServer(t *testing.T, server string, caPEM []byte, mod func(*Config)) *Server {
	t.Helper()
	s, _ := testServer(t, "", func(c *Config) {
		dir := t.TempDir()
		c.Upstream.Kubeconfig = kubeconfigFor(t, dir, server, caPEM)
		c.Upstream.DialTimeout = time.Second
		// Identities and decisions are the cluster's only.
		c.TokenFile, c.AuthorizationDir = "", ""
		if mod != nil {
			mod(c)
		}
	})
	return s
}

func (k *fakeKube) caPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: k.srv.Certificate().Raw})
}

func send(s http.Handler, method, target, token string, body io.Reader, hdr map[string]string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, target, body)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	return rec
}

// TestUpstreamForward: what the cache does not serve goes upstream as the
// caller, under Herald's credentials; nothing the client sent about
// identity survives.
func TestUpstreamForward(t *testing.T) {
	k := newFakeKube(t)
	s := clusterServer(t, k.srv.URL, k.caPEM(), nil)
	for _, tc := range []struct{ method, path string }{
		{http.MethodPost, "/api/v1/namespaces/ns1/configmaps"},
		{http.MethodPatch, "/apis/apps/v1/namespaces/ns1/deployments/web/scale"},
		{http.MethodDelete, "/api/v1/namespaces/ns1/pods/p"},
		{http.MethodGet, "/api/v1/namespaces/ns1/pods/p/log"},
		{http.MethodGet, "/api"},
		{http.MethodGet, "/apis"},
		{http.MethodGet, "/version"},
		{http.MethodGet, "/openapi/v3"},
		{http.MethodGet, "/apis/metrics.k8s.io/v1beta1/nodes"},
	} {
		rec := send(s, tc.method, tc.path, tokAlice, strings.NewReader(`{"x":1}`), map[string]string{
			"X-Remote-User": "root", "X-Remote-Group": "system:masters", "Cookie": "a=b",
			"Accept": "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"})
		if rec.Code != http.StatusCreated || !strings.Contains(rec.Body.String(), `"from":"upstream"`) {
			t.Errorf("%s %s: %d %s, want the upstream's answer", tc.method, tc.path, rec.Code, rec.Body)
			continue
		}
		got, body := k.last(t)
		if got.Method != tc.method || got.URL.Path != tc.path {
			t.Errorf("upstream saw %s %s, want %s %s", got.Method, got.URL.Path, tc.method, tc.path)
		}
		if got.Header.Get("Impersonate-User") != "alice" || got.Header.Get("Impersonate-Uid") != "2" ||
			!slices.Equal(got.Header.Values("Impersonate-Group"), []string{"system:authenticated"}) {
			t.Errorf("%s: impersonation headers %v", tc.path, got.Header)
		}
		if got.Header.Get("X-Remote-User") != "" || got.Header.Get("X-Remote-Group") != "" || got.Header.Get("Cookie") != "" {
			t.Errorf("%s: client identity headers reached the upstream: %v", tc.path, got.Header)
		}
		if !strings.HasPrefix(got.Header.Get("Accept"), "application/json;g=apidiscovery.k8s.io;v=v2") {
			t.Errorf("%s: Accept %q not passed through", tc.path, got.Header.Get("Accept"))
		}
		if tc.method != http.MethodGet && body != `{"x":1}` {
			t.Errorf("%s: body %q", tc.path, body)
		}
	}
	// Counted by kube-apiserver's verb, and by resource when frontdoor
	// knows it (a path may name anything: the label stays bounded).
	for _, tc := range []struct {
		method, path, contentType string
		verb, resource            string
	}{
		{http.MethodPost, "/api/v1/namespaces/ns1/configmaps", "", "create", "configmaps"},
		{http.MethodPatch, "/apis/apps/v1/namespaces/ns1/deployments/web/scale", "application/merge-patch+json", "patch", "deployments.apps"},
		{http.MethodPatch, "/api/v1/namespaces/ns1/configmaps/c", "application/apply-patch+yaml", "apply", "configmaps"},
		{http.MethodGet, "/api/v1/namespaces/ns1/pods/p/log", "", "get", "pods"},
		{http.MethodPost, "/api/v1/namespaces/ns1/pods/p/exec", "", "connect", "pods"},
		{http.MethodGet, "/apis/x1.example.com/v1/things", "", "list", ""},
		{http.MethodGet, "/apis/metrics.k8s.io/v1beta1/nodes", "", "list", ""},
		{http.MethodGet, "/openapi/v3", "", "get", ""},
		{"FOO1", "/api/v1/namespaces/ns1/configmaps", "", "other", "configmaps"},
	} {
		before := testutil.ToFloat64(s.m.requests.WithLabelValues(tc.verb, tc.resource, "201"))
		forwarded := testutil.ToFloat64(s.m.forwarded.WithLabelValues(tc.verb, "201"))
		if rec := send(s, tc.method, tc.path, tokAlice, strings.NewReader(`{}`), map[string]string{"Content-Type": tc.contentType}); rec.Code != http.StatusCreated {
			t.Errorf("%s %s: %d %s", tc.method, tc.path, rec.Code, rec.Body)
		}
		if n := testutil.ToFloat64(s.m.requests.WithLabelValues(tc.verb, tc.resource, "201")) - before; n != 1 {
			t.Errorf("%s %s: apiserver_request_total{verb=%q,resource=%q} +%v, want +1", tc.method, tc.path, tc.verb, tc.resource, n)
		}
		if n := testutil.ToFloat64(s.m.forwarded.WithLabelValues(tc.verb, "201")) - forwarded; n != 1 {
			t.Errorf("%s %s: herald_frontdoor_forwarded_requests_total{verb=%q} +%v, want +1", tc.method, tc.path, tc.verb, n)
		}
	}
	// Reads of cached resources are served here, not upstream.
	n := k.count()
	if code, b, _ := do(s, tokAdmin, "/api/v1/namespaces/ns1/pods/p"); code != http.StatusOK || strings.Contains(string(b), "upstream") {
		t.Errorf("cached GET: %d %s", code, b)
	}
	if k.count() != n {
		t.Error("a cached read went upstream")
	}
}

// TestAuditID: every answer carries kube-apiserver's Audit-Id, the
// client's Audit-ID or a new UUID; a forwarded request carries it to
// kube-apiserver (audited there under the same ID) and its answer has it
// once.
func TestAuditID(t *testing.T) {
	k := newFakeKube(t)
	s := clusterServer(t, k.srv.URL, k.caPEM(), nil)
	seen := map[string]bool{}
	for _, tc := range []struct {
		name, method, path, token string
		code                      int
	}{
		{"cached list", http.MethodGet, "/api/v1/namespaces/ns1/pods", tokAdmin, http.StatusOK},
		{"forwarded", http.MethodPost, "/api/v1/namespaces/ns1/configmaps", tokAdmin, http.StatusCreated},
		{"unauthenticated", http.MethodGet, "/api/v1/namespaces/ns1/pods", "wrong", http.StatusUnauthorized},
		{"forbidden", http.MethodGet, "/api/v1/namespaces/ns2/pods", "cluster-token", http.StatusForbidden},
	} {
		for _, given := range []string{"", "client-chosen-" + tc.name} {
			n := k.count()
			hdr := map[string]string{}
			if given != "" {
				hdr["Audit-ID"] = given
			}
			rec := send(s, tc.method, tc.path, tc.token, strings.NewReader(`{}`), hdr)
			ids := rec.Result().Header.Values("Audit-Id")
			if rec.Code != tc.code || len(ids) != 1 {
				t.Errorf("%s (given %q): %d, Audit-Id %q; want %d and one ID", tc.name, given, rec.Code, ids, tc.code)
				continue
			}
			if cc := rec.Result().Header.Values("Cache-Control"); len(cc) != 1 || cc[0] != "no-cache, private" {
				t.Errorf("%s: Cache-Control %q, want kube-apiserver's once", tc.name, cc)
			}
			id := ids[0]
			switch {
			case given != "" && id != given:
				t.Errorf("%s: Audit-Id %q, want the client's %q", tc.name, id, given)
			case given == "" && (uuid.Validate(id) != nil || seen[id]):
				t.Errorf("%s: Audit-Id %q, want a new UUID", tc.name, id)
			}
			seen[id] = true
			if k.count() > n {
				if got, _ := k.last(t); got.Header.Get("Audit-ID") != id {
					t.Errorf("%s: kube-apiserver got Audit-ID %q, want %q", tc.name, got.Header.Get("Audit-ID"), id)
				}
			}
		}
	}
	// An upstream that does not answer: frontdoor's 503 carries both too.
	// (The token's review is cached first: the failure is the forward's.)
	send(s, http.MethodGet, "/api/v1/namespaces/ns1/pods", tokAdmin, nil, nil)
	k.srv.Close()
	rec := send(s, http.MethodPost, "/api/v1/namespaces/ns1/configmaps", tokAdmin, strings.NewReader(`{}`), map[string]string{"Audit-ID": "down"})
	if h := rec.Result().Header; rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "upstream kube-apiserver is unavailable") ||
		!slices.Equal(h.Values("Audit-Id"), []string{"down"}) || !slices.Equal(h.Values("Cache-Control"), []string{"no-cache, private"}) {
		t.Errorf("upstream down: %d %s, headers %v", rec.Code, rec.Body, h)
	}
}

// TestAuditIDAfterContinue: a forwarded request whose client expects 100
// Continue gets the request's audit ID on kube-apiserver's final answer,
// and is counted with that answer's code, not the 100's.
func TestAuditIDAfterContinue(t *testing.T) {
	k := newFakeKube(t)
	s := clusterServer(t, k.srv.URL, k.caPEM(), nil)
	srv := httptest.NewTLSServer(s)
	defer srv.Close()
	tr := srv.Client().Transport.(*http.Transport)
	tr.ExpectContinueTimeout = 10 * time.Second
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/api/v1/namespaces/ns1/configmaps", strings.NewReader(`{"x":1}`))
	req.Header.Set("Authorization", "Bearer "+tokAdmin)
	req.Header.Set("Expect", "100-continue")
	req.Header.Set("Audit-ID", "with-continue")
	var informational []int
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		Got1xxResponse: func(code int, _ textproto.MIMEHeader) error { informational = append(informational, code); return nil },
	}))
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Values("Audit-Id"); resp.StatusCode != http.StatusCreated || len(got) != 1 || got[0] != "with-continue" {
		t.Errorf("%d, Audit-Id %q; want 201 and the client's ID once", resp.StatusCode, got)
	}
	if !slices.Equal(informational, []int{http.StatusContinue}) {
		t.Errorf("informational answers %v, want one 100 Continue, as from kube-apiserver", informational)
	}
	if got, _ := k.last(t); got.Header.Get("Audit-ID") != "with-continue" {
		t.Errorf("kube-apiserver got Audit-ID %q", got.Header.Get("Audit-ID"))
	}
	// The request is counted as its handler returns, after the answer:
	// Close waits for it.
	srv.Close()
	if n := testutil.ToFloat64(s.m.requests.WithLabelValues("create", "configmaps", "201")); n != 1 {
		t.Errorf("requests counted with code 201: %v, want 1", n)
	}
	if n := testutil.ToFloat64(s.m.requests.WithLabelValues("create", "configmaps", "100")); n != 0 {
		t.Errorf("requests counted with code 100: %v, want 0", n)
	}
}

// TestClusterListOlderThanWindow: a list the cache cannot serve because its
// revision is older than the window goes to kube-apiserver as the caller
// (which reads etcd for it), without the cache's deprecation warning; a
// standalone frontdoor answers the cache's 410.
func TestClusterListOlderThanWindow(t *testing.T) {
	k := newFakeKube(t)
	s := clusterServer(t, k.srv.URL, k.caPEM(), nil)
	for _, tc := range []struct{ token, user, path string }{
		{"cluster-token", "carol", "/api/v1/namespaces/ns1/pods?resourceVersion=1&resourceVersionMatch=Exact"},
		// A deprecated version: the cache's path adds a Warning.
		{tokAdmin, "admin", "/api/v1/namespaces/ns1/endpoints?resourceVersion=1&resourceVersionMatch=Exact&limit=2"},
	} {
		path := tc.path
		n := k.count()
		rec := send(s, http.MethodGet, path, tc.token, nil, nil)
		if rec.Code != http.StatusCreated || !strings.Contains(rec.Body.String(), `"from":"upstream"`) {
			t.Errorf("%s: %d %s, want the upstream's answer", path, rec.Code, rec.Body)
			continue
		}
		if k.count() != n+1 {
			t.Errorf("%s: the upstream saw %d requests, want 1", path, k.count()-n)
		}
		got, _ := k.last(t)
		if want, _ := url.Parse(path); got.URL.Path != want.Path || got.URL.RawQuery != want.RawQuery {
			t.Errorf("upstream saw %s, want %s", got.URL, path)
		}
		if got.Header.Get("Impersonate-User") != tc.user {
			t.Errorf("%s: forwarded as %q, want %s", path, got.Header.Get("Impersonate-User"), tc.user)
		}
		if w := rec.Result().Header.Values("Warning"); len(w) != 0 {
			t.Errorf("%s: warnings %q, want only the upstream's (none)", path, w)
		}
	}
	if got := testutil.ToFloat64(s.m.olderThanWindow.WithLabelValues("endpoints")); got != 1 {
		t.Errorf("endpoints lists forwarded: metric %v, want 1", got)
	}
	// Herald's own answers, not forwarded: a list the caller may not
	// read, a GET's 410, a list's other errors.
	for _, tc := range []struct {
		path string
		code int
	}{
		{"/api/v1/namespaces/ns2/pods?resourceVersion=1&resourceVersionMatch=Exact", http.StatusForbidden},
		{"/api/v1/namespaces/ns1/pods/expired", http.StatusGone},
		{"/api/v1/namespaces/ns1/pods?labelSelector=cache%3Dunavailable", http.StatusServiceUnavailable},
	} {
		n := k.count()
		if rec := send(s, http.MethodGet, tc.path, "cluster-token", nil, nil); rec.Code != tc.code || k.count() != n {
			t.Errorf("%s: %d %s, %d upstream requests; want %d and none", tc.path, rec.Code, rec.Body, k.count()-n, tc.code)
		}
	}

	standalone, _ := testServer(t, "", nil)
	code, b, _ := do(standalone, tokAdmin, "/api/v1/namespaces/ns1/pods?resourceVersion=1&resourceVersionMatch=Exact")
	if code != http.StatusGone || !strings.Contains(string(b), `"reason":"Expired"`) {
		t.Errorf("standalone: %d %s, want the cache's 410 Expired", code, b)
	}
}

// TestUpstreamBodyLimit: a body over the limit is refused before anything
// is forwarded, with or without a Content-Length.
func TestUpstreamBodyLimit(t *testing.T) {
	k := newFakeKube(t)
	s := clusterServer(t, k.srv.URL, k.caPEM(), func(c *Config) { c.MaxBodyBytes = 1 << 10 })
	big := strings.Repeat("x", 2<<10)
	rec := send(s, http.MethodPost, "/api/v1/namespaces/ns1/configmaps", tokAdmin, strings.NewReader(big), nil)
	if rec.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("sized body: %d %s", rec.Code, rec.Body)
	}
	if k.count() != 0 {
		t.Error("an oversized body reached the upstream")
	}
	rec = send(s, http.MethodPost, "/api/v1/namespaces/ns1/configmaps", tokAdmin, io.MultiReader(strings.NewReader(big)), nil)
	if rec.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("chunked body: %d %s", rec.Code, rec.Body)
	}
	if code, _, _ := statusOf(t, rec.Body.Bytes()); code != http.StatusRequestEntityTooLarge {
		t.Errorf("chunked body: Status code %d", code)
	}
}

// TestUpstreamUnreachable: a 503 Status within the dial timeout.
func TestUpstreamUnreachable(t *testing.T) {
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	k := newFakeKube(t)
	s := clusterServer(t, "https://"+addr, k.caPEM(), nil)
	start := time.Now()
	rec := send(s, http.MethodPost, "/api/v1/namespaces/ns1/configmaps", tokAdmin, strings.NewReader("{}"), nil)
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("%d %s, want 503", rec.Code, rec.Body)
	}
	if code, reason, _ := statusOf(t, rec.Body.Bytes()); code != 503 || reason != "ServiceUnavailable" {
		t.Errorf("Status %d %s", code, reason)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %s", d)
	}
}

// TestUpstreamUpgrade: an upgraded connection (exec) is carried both ways.
func TestUpstreamUpgrade(t *testing.T) {
	k := newFakeKube(t)
	s := clusterServer(t, k.srv.URL, k.caPEM(), nil)
	front := httptest.NewServer(s)
	defer front.Close()
	c, err := net.Dial("tcp", front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "POST /api/v1/namespaces/ns1/pods/p/exec?command=sh HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n", tokAdmin)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%d %s, want 101", resp.StatusCode, b)
	}
	for _, msg := range []string{"ping\n", "pong\n"} {
		io.WriteString(c, msg)
		line, err := br.ReadString('\n')
		if err != nil || line != msg {
			t.Fatalf("echo: %q %v, want %q", line, err, msg)
		}
	}
	got, _ := k.last(t)
	if got.Header.Get("Impersonate-User") != "admin" || got.Header.Get("X-Stream-Protocol-Version") == "" {
		t.Errorf("upgrade request headers %v", got.Header)
	}
}

// TestWebSocketBearerProtocol: a WebSocket client may send its token as the
// subprotocol base64url.bearer.authorization.k8s.io.<token> (no
// Authorization header): frontdoor authenticates it and removes it before
// forwarding; malformed or unknown ones are a 401.
func TestWebSocketBearerProtocol(t *testing.T) {
	k := newFakeKube(t)
	s := clusterServer(t, k.srv.URL, k.caPEM(), nil)
	ws := func(protocols string) *httptest.ResponseRecorder {
		return send(s, http.MethodGet, "/api/v1/namespaces/ns1/pods/p/exec?command=sh", "", nil, map[string]string{
			"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
			"Sec-WebSocket-Protocol": protocols})
	}
	bearer := func(tok string) string {
		return "base64url.bearer.authorization.k8s.io." + base64.RawURLEncoding.EncodeToString([]byte(tok))
	}
	n := k.count()
	// httptest's recorder cannot be hijacked: the forwarded request is
	// what this test checks, not the echo.
	ws("v5.channel.k8s.io, " + bearer("cluster-token"))
	if k.count() != n+1 {
		t.Fatal("the WebSocket request was not forwarded")
	}
	got, _ := k.last(t)
	if got.Header.Get("Impersonate-User") != "carol" || got.Header.Get("Sec-WebSocket-Protocol") != "v5.channel.k8s.io" {
		t.Errorf("forwarded: user %q, protocols %q", got.Header.Get("Impersonate-User"), got.Header.Values("Sec-WebSocket-Protocol"))
	}
	for name, protocols := range map[string]string{
		"unknown token":        "v5.channel.k8s.io, " + bearer("no-such-token"),
		"no other subprotocol": bearer("cluster-token"),
		"two tokens":           "v5.channel.k8s.io, " + bearer("cluster-token") + ", " + bearer("cluster-token"),
		"not base64url":        "v5.channel.k8s.io, base64url.bearer.authorization.k8s.io.%%%",
	} {
		if rec := ws(protocols); rec.Code != http.StatusUnauthorized {
			t.Errorf("%s: %d %s, want 401", name, rec.Code, rec.Body)
		}
	}
	if k.count() != n+1 {
		t.Error("a refused WebSocket request reached the upstream")
	}
}

// TestClusterAuthn: tokens Herald does not know are reviewed by the cluster
// (cached), and reads served here are authorized by the cluster.
func TestClusterAuthn(t *testing.T) {
	k := newFakeKube(t)
	s := clusterServer(t, k.srv.URL, k.caPEM(), nil)
	for _, tc := range []struct {
		token, path string
		code        int
	}{
		{"cluster-token", "/api/v1/namespaces/ns1/pods", 200},
		{"cluster-token", "/api/v1/namespaces/ns1/pods/p", 200},
		{"cluster-token", "/api/v1/namespaces/ns2/pods", 403},
		{"cluster-token", "/api/v1/pods", 403},
		{"cluster-token", "/metrics", 403},
		{"no-such-token", "/api/v1/namespaces/ns1/pods", 401},
		{"", "/api/v1/namespaces/ns1/pods", 401},
		{tokBob, "/api/v1/namespaces/ns1/pods", 403}, // the cluster's RBAC
		{tokAdmin, "/api/v1/pods", 200},
	} {
		if code, b, _ := do(s, tc.token, tc.path); code != tc.code {
			t.Errorf("%s %s: %d, want %d: %s", tc.token, tc.path, code, tc.code, b)
		}
	}
	if n := k.tokenReviews.Load(); n != 4 {
		t.Errorf("%d TokenReviews, want 4 (one per token, then cached)", n)
	}
	// The reviewed user is forwarded with its uid, groups and extra.
	send(s, http.MethodPost, "/api/v1/namespaces/ns1/configmaps", "cluster-token", strings.NewReader("{}"), nil)
	got, _ := k.last(t)
	if got.Header.Get("Impersonate-User") != "carol" || got.Header.Get("Impersonate-Uid") != "c-1" ||
		!slices.Contains(got.Header.Values("Impersonate-Group"), "devs") || got.Header.Get("Impersonate-Extra-Scopes.example.com%2Fx") != "a" {
		t.Errorf("forwarded identity: %v", got.Header)
	}
}

// TestClusterImpersonation: kubectl --as is authorized by the cluster for
// the caller, then the request runs as the impersonated user, here and
// upstream.
func TestClusterImpersonation(t *testing.T) {
	k := newFakeKube(t)
	s := clusterServer(t, k.srv.URL, k.caPEM(), nil)
	as := func(who string) map[string]string { return map[string]string{"Impersonate-User": who} }
	if rec := send(s, http.MethodGet, "/api/v1/pods", "cluster-token", nil, as("dave")); rec.Code != 200 {
		t.Errorf("carol as dave lists pods: %d %s", rec.Code, rec.Body)
	}
	if rec := send(s, http.MethodGet, "/api/v1/namespaces/ns1/pods/p", "cluster-token", nil, as("dave")); rec.Code != 403 {
		t.Errorf("carol as dave gets a pod (dave may not): %d %s", rec.Code, rec.Body)
	}
	n := k.count()
	if rec := send(s, http.MethodPost, "/api/v1/namespaces/ns1/configmaps", "cluster-token", strings.NewReader("{}"), as("root")); rec.Code != 403 {
		t.Errorf("carol as root: %d %s", rec.Code, rec.Body)
	}
	if k.count() != n {
		t.Error("a refused impersonation was forwarded")
	}
	if rec := send(s, http.MethodPost, "/api/v1/namespaces/ns1/configmaps", "cluster-token", strings.NewReader("{}"), as("dave")); rec.Code != 201 {
		t.Fatalf("carol as dave writes: %d %s", rec.Code, rec.Body)
	}
	got, _ := k.last(t)
	if got.Header.Get("Impersonate-User") != "dave" || !slices.Equal(got.Header.Values("Impersonate-Group"), []string{"system:authenticated"}) || got.Header.Get("Impersonate-Uid") != "" {
		t.Errorf("forwarded as %v", got.Header)
	}

	// Constrained impersonation (kube-apiserver v1.36+): bob may be dave
	// only to list pods.
	if rec := send(s, http.MethodGet, "/api/v1/pods", tokBob, nil, as("dave")); rec.Code != 200 {
		t.Errorf("bob as dave lists pods: %d %s", rec.Code, rec.Body)
	}
	rec := send(s, http.MethodGet, "/api/v1/namespaces/ns1/pods/p", tokBob, nil, as("dave"))
	if code, _, msg := statusOf(t, rec.Body.Bytes()); rec.Code != 403 || code != 403 || !strings.Contains(msg, `cannot impersonate-on:user-info:get resource "pods"`) {
		t.Errorf("bob as dave gets a pod (not granted): %d %s", rec.Code, rec.Body)
	}
	n = k.count()
	if rec := send(s, http.MethodPost, "/api/v1/namespaces/ns1/configmaps", tokBob, strings.NewReader("{}"), as("dave")); rec.Code != 403 {
		t.Errorf("bob as dave writes (not granted): %d %s", rec.Code, rec.Body)
	}
	if k.count() != n {
		t.Error("a refused constrained impersonation was forwarded")
	}
}

// TestUpstreamServers: several upstream addresses share the requests; one
// that is down answers 503 once and is then avoided until /readyz says it
// is back.
func TestUpstreamServers(t *testing.T) {
	a, b := newFakeKube(t), newFakeKube(t)
	// Both fakes use httptest's one certificate: one CA file trusts both.
	s := clusterServer(t, a.srv.URL, a.caPEM(), func(c *Config) {
		c.Upstream.Servers = a.srv.URL + "," + b.srv.URL
		c.Upstream.HealthInterval = 20 * time.Millisecond
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Run(ctx)
	for range 10 {
		if rec := send(s, http.MethodPost, "/api/v1/namespaces/ns1/configmaps", tokAdmin, strings.NewReader("{}"), nil); rec.Code != 201 {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
	}
	if a.count() == 0 || b.count() == 0 {
		t.Fatalf("requests not spread: %d and %d", a.count(), b.count())
	}
	b.srv.Close()
	failed := 0
	for range 10 {
		if rec := send(s, http.MethodPost, "/api/v1/namespaces/ns1/configmaps", tokAdmin, strings.NewReader("{}"), nil); rec.Code == 503 {
			failed++
		} else if rec.Code != 201 {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
	}
	if failed > 1 {
		t.Errorf("%d requests failed after one upstream went away; want at most the first", failed)
	}
}

// TestUpstreamResponseTimeout: an upstream that never answers gives the
// client a 504 Status, not a hang.
func TestUpstreamResponseTimeout(t *testing.T) {
	k := newFakeKube(t)
	s := clusterServer(t, k.srv.URL, k.caPEM(), func(c *Config) { c.Upstream.ResponseTimeout = 200 * time.Millisecond })
	rec := send(s, http.MethodGet, "/slow", tokAdmin, nil, nil)
	if code, reason, _ := statusOf(t, rec.Body.Bytes()); rec.Code != http.StatusGatewayTimeout || code != 504 || reason != "Timeout" {
		t.Errorf("%d %s", rec.Code, rec.Body)
	}
}

// TestStandaloneVersion: standalone, /version is that of the Kubernetes API
// frontdoor serves, the k8s.io/api module it is built with (go.mod's: a
// test binary carries no module versions, and reports the fallback, which
// must follow go.mod).
func TestStandaloneVersion(t *testing.T) {
	mod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*k8s\.io/api (v\S+)`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("go.mod requires no k8s.io/api")
	}
	api := string(m[1])
	s, _ := testServer(t, "", nil)
	code, b, _ := do(s, tokAdmin, "/version")
	var v version.Info
	if err := json.Unmarshal(b, &v); code != http.StatusOK || err != nil {
		t.Fatalf("/version: %d %s", code, b)
	}
	want := "v1." + strings.TrimPrefix(api, "v0.") + "-herald"
	if v.GitVersion != want || v.Major != "1" || !strings.HasPrefix(want, "v1."+v.Minor+".") {
		t.Errorf("/version %+v, want %s (k8s.io/api %s)", v, want, api)
	}
}

// TestDeprecationWarning: a deprecated API version's reads carry
// kube-apiserver's Warning, judged at the cluster's version (v1.37 here:
// v1 Endpoints is deprecated since v1.33) or, standalone, at the version
// frontdoor reports (that of the API it serves, v1.37); not at a version
// before the deprecation.
func TestDeprecationWarning(t *testing.T) {
	k := newFakeKube(t)
	cluster := clusterServer(t, k.srv.URL, k.caPEM(), nil)
	standalone, _ := testServer(t, "http://127.0.0.1:1", nil)
	older, _ := testServer(t, "http://127.0.0.1:1", nil)
	older.deprecations = discovery.NewDeprecations(version.Info{Major: "1", Minor: "32"})
	const want = `299 - "v1 Endpoints is deprecated in v1.33+; use discovery.k8s.io/v1 EndpointSlice"`
	for _, tc := range []struct {
		name string
		s    *Server
		path string
		want []string
	}{
		{"cluster endpoints", cluster, "/api/v1/namespaces/ns1/endpoints", []string{want}},
		{"cluster endpoint", cluster, "/api/v1/namespaces/ns1/endpoints/e", []string{want}},
		{"cluster pods", cluster, "/api/v1/namespaces/ns1/pods", nil},
		{"standalone endpoints", standalone, "/api/v1/namespaces/ns1/endpoints", []string{want}},
		{"v1.32 endpoints", older, "/api/v1/namespaces/ns1/endpoints", nil},
	} {
		_, _, h := do(tc.s, tokAdmin, tc.path)
		if got := h.Values("Warning"); !slices.Equal(got, tc.want) {
			t.Errorf("%s: Warning %q, want %q", tc.name, got, tc.want)
		}
	}
}
