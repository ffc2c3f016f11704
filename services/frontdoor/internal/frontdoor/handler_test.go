package frontdoor

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"herald.dev/libs/kube"
	"herald.dev/libs/kube/request"
	"herald.dev/services/frontdoor/internal/apierr"
	"herald.dev/services/frontdoor/internal/audit"
	"herald.dev/services/frontdoor/internal/authn"
	"herald.dev/services/frontdoor/internal/authz"
	"herald.dev/services/frontdoor/internal/limits"
	"herald.dev/services/frontdoor/internal/upstream"
)

// The filters one by one; the package's other tests serve whole requests.

// jsonStatus is a statusWriter that writes every error as JSON.
func jsonStatus(w http.ResponseWriter, _ *http.Request, err error) { kube.WriteStatus(w, err) }

// reached is a next handler that records the request it got, and its
// scope.
type reached struct {
	r  *http.Request
	sc *requestScope
}

func (n *reached) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n.r, n.sc = r, scopeOf(w)
	w.WriteHeader(http.StatusNoContent)
}

// newScope is a request's scope as withAudit opens it.
func newScope() *requestScope { return &requestScope{entry: &audit.Entry{}, end: &requestEnd{}} }

type testScopeKey struct{}

// withTestScope has serve serve the request in sc.
func withTestScope(ctx context.Context, sc *requestScope) context.Context {
	return context.WithValue(ctx, testScopeKey{}, sc)
}

// serve serves r with h, in sc when given or in r's context
// (withTestScope), as the audit filter's recorder would.
func serve(h http.Handler, r *http.Request, sc ...*requestScope) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	var w http.ResponseWriter = rec
	if s, ok := r.Context().Value(testScopeKey{}).(*requestScope); ok {
		sc = append(sc, s)
	}
	if len(sc) > 0 {
		if sc[0].rec == nil {
			sc[0].rec = &statusRecorder{}
		}
		sc[0].rec.ResponseWriter, sc[0].rec.scope = rec, sc[0]
		w = sc[0].rec
	}
	h.ServeHTTP(w, r)
	return rec
}

func TestWithBodyLimit(t *testing.T) {
	next := &reached{}
	h := withBodyLimit(next, 4, jsonStatus)
	if rec := serve(h, httptest.NewRequest(http.MethodPost, "/api", strings.NewReader("12345"))); rec.Code != http.StatusRequestEntityTooLarge || next.r != nil {
		t.Fatalf("declared 5 bytes of 4: %d, next reached: %v", rec.Code, next.r != nil)
	}
	r := httptest.NewRequest(http.MethodPost, "/api", strings.NewReader("12345"))
	r.ContentLength = -1 // unknown: cut while it is read
	if rec := serve(h, r); rec.Code != http.StatusNoContent || next.r == nil {
		t.Fatalf("undeclared body: %d", rec.Code)
	}
	if _, err := io.ReadAll(next.r.Body); err == nil {
		t.Fatal("reading 5 bytes of a body limited to 4 succeeded")
	}
}

func TestWithHealth(t *testing.T) {
	for _, p := range []string{"/livez", "/readyz", "/healthz"} {
		next := &reached{}
		rec := serve(withHealth(next), httptest.NewRequest(http.MethodGet, p, nil))
		if rec.Code != http.StatusOK || rec.Body.String() != "ok" || next.r != nil {
			t.Fatalf("%s: %d %q, next reached: %v", p, rec.Code, rec.Body, next.r != nil)
		}
	}
	next := &reached{}
	if serve(withHealth(next), httptest.NewRequest(http.MethodGet, "/api", nil)); next.r == nil {
		t.Fatal("/api did not reach the next handler")
	}
}

func TestWithAuthentication(t *testing.T) {
	alice := &User{Name: "alice", Method: "token"}
	for _, tc := range []struct {
		name     string
		err      error
		code     int
		failures string // the credentials label counted, if any
	}{
		{"none", authn.ErrNoCredentials, http.StatusUnauthorized, "none"},
		{"invalid", errors.New("token: unknown bearer token"), http.StatusUnauthorized, "invalid"},
		{"throttled", upstream.ErrReviewThrottled, http.StatusTooManyRequests, ""},
		{"review failed", authn.ErrReviewFailed, http.StatusServiceUnavailable, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			failures := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "f"}, []string{"credentials"})
			next := &reached{}
			h := withAuthentication(next, func(*http.Request) (*User, error) { return nil, tc.err }, failures, jsonStatus)
			sc := newScope()
			rec := serve(h, httptest.NewRequest(http.MethodGet, "/api", nil), sc)
			if rec.Code != tc.code || next.r != nil {
				t.Fatalf("code %d, want %d; next reached: %v", rec.Code, tc.code, next.r != nil)
			}
			if sc.entry.Reason != tc.err.Error() || sc.entry.Who != nil {
				t.Fatalf("audit entry %+v", sc.entry)
			}
			counted := 0.0
			if tc.failures != "" {
				counted = testutil.ToFloat64(failures.WithLabelValues(tc.failures))
				if counted != 1 {
					t.Fatalf("failures{credentials=%s} = %v", tc.failures, counted)
				}
			}
			if n := testutil.CollectAndCount(failures); (n == 1) != (tc.failures != "") {
				t.Fatalf("%d failure series", n)
			}
		})
	}
	next := &reached{}
	sc := newScope()
	h := withAuthentication(next, func(*http.Request) (*User, error) { return alice, nil }, nil, jsonStatus)
	serve(h, httptest.NewRequest(http.MethodGet, "/api", nil), sc)
	if next.r == nil || next.sc.user != alice {
		t.Fatal("the next handler did not get the user")
	}
	if sc.entry.User != "alice" || sc.entry.Authn != "token" || sc.entry.Who != alice {
		t.Fatalf("audit entry %+v", sc.entry)
	}
}

func TestWithReadOnly(t *testing.T) {
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
		next := &reached{}
		rec := serve(withReadOnly(next, jsonStatus), httptest.NewRequest(m, "/api/v1/pods", nil))
		read := m == http.MethodGet || m == http.MethodHead
		if (next.r != nil) != read || (!read && rec.Code != http.StatusMethodNotAllowed) {
			t.Fatalf("%s: %d, next reached: %v", m, rec.Code, next.r != nil)
		}
	}
}

func TestWithAuthorization(t *testing.T) {
	u := &User{Name: "alice", Groups: []string{"system:authenticated"}}
	request := func(tg *target) (*http.Request, *requestScope) {
		sc := newScope()
		sc.user, sc.target = u, tg
		ctx := withTestScope(context.Background(), sc)
		return httptest.NewRequest(http.MethodGet, "/metrics", nil).WithContext(ctx), sc
	}
	metrics := &target{nonResource: http.NotFoundHandler()}

	asked := 0
	deny := func(_ *http.Request, a authz.Attributes) (bool, string, error) {
		asked++
		if a.Path != "/metrics" || a.Verb != "get" || a.User.GetName() != u.Name {
			t.Errorf("authz.Attributes %+v", a)
		}
		return false, "no rule", nil
	}
	next := &reached{}
	r, sc := request(metrics)
	rec := serve(withAuthorization(next, deny, jsonStatus), r)
	if rec.Code != http.StatusForbidden || next.r != nil || asked != 1 || !strings.Contains(rec.Body.String(), ": no rule") {
		t.Fatalf("denied: %d %s", rec.Code, rec.Body)
	}
	if sc.entry.Reason == "" {
		t.Fatal("no reason in the audit entry")
	}

	unavailable := func(*http.Request, authz.Attributes) (bool, string, error) {
		return false, "", apierr.Unavailable("down")
	}
	r, sc = request(metrics)
	if rec := serve(withAuthorization(next, unavailable, jsonStatus), r); rec.Code != http.StatusServiceUnavailable || sc.entry.Reason != "down" {
		t.Fatalf("unavailable: %d, reason %q", rec.Code, sc.entry.Reason)
	}

	allow := func(*http.Request, authz.Attributes) (bool, string, error) { asked++; return true, "", nil }
	r, _ = request(metrics)
	if serve(withAuthorization(next, allow, jsonStatus), r); next.r == nil {
		t.Fatal("allowed: next not reached")
	}

	// Discovery is every authenticated user's: no authorizer is asked.
	asked, next = 0, &reached{}
	r, _ = request(&target{discovery: true})
	if serve(withAuthorization(next, deny, jsonStatus), r); next.r == nil || asked != 0 {
		t.Fatalf("discovery: next reached %v, authorizer asked %d times", next.r != nil, asked)
	}
}

func TestWithLimits(t *testing.T) {
	rejected := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "r"}, []string{"request_kind", "limit"})
	requests, watches := limits.New(1, 1), limits.New(1, 1)
	alice := &User{Name: "alice"}
	newRequest := func(verb request.Verb) (*http.Request, *requestScope) {
		sc := newScope()
		sc.user, sc.target = alice, &target{info: request.Info{Verb: verb}}
		ctx := withTestScope(context.Background(), sc)
		return httptest.NewRequest(http.MethodGet, "/api/v1/pods", nil).WithContext(ctx), sc
	}

	// A list holds a request slot while its handler runs.
	inside := -1
	list := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { inside = requests.InUse() })
	r, _ := newRequest(request.VerbList)
	serve(withLimits(list, requests, watches, rejected), r)
	if inside != 1 || requests.InUse() != 0 {
		t.Fatalf("request slots: %d while served, %d after", inside, requests.InUse())
	}

	// A watch's request slot goes when its stream starts (watchInit), its
	// watch slot when the request ends.
	watch := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		watchInit(w)()
		inside = requests.InUse()
	})
	r, sc := newRequest(request.VerbWatch)
	serve(withLimits(watch, requests, watches, rejected), r)
	if inside != 0 || watches.InUse() != 1 {
		t.Fatalf("started watch: %d request slots, %d watch slots", inside, watches.InUse())
	}

	// The watch pool is full: 429, and the request slot is given back.
	r, _ = newRequest(request.VerbWatch)
	rec := serve(withLimits(watch, requests, watches, rejected), r)
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "1" || !strings.Contains(rec.Body.String(), "Too many watches") {
		t.Fatalf("second watch: %d %v %s", rec.Code, rec.Header(), rec.Body)
	}
	if requests.InUse() != 0 || testutil.ToFloat64(rejected.WithLabelValues("watch", limits.Total)) != 1 {
		t.Fatalf("after a refused watch: %d request slots, rejected %v", requests.InUse(), testutil.ToFloat64(rejected.WithLabelValues("watch", limits.Total)))
	}
	sc.end.run()
	if watches.InUse() != 0 {
		t.Fatalf("ended watch: %d watch slots", watches.InUse())
	}

	// The request pool is full: 429 before the next handler.
	hold, _ := requests.Acquire("bob")
	defer hold()
	next := &reached{}
	r, _ = newRequest(request.VerbGet)
	if rec := serve(withLimits(next, requests, watches, rejected), r); rec.Code != http.StatusTooManyRequests || next.r != nil ||
		!strings.Contains(rec.Body.String(), "Too many requests") || testutil.ToFloat64(rejected.WithLabelValues("readOnly", limits.Total)) != 1 {
		t.Fatalf("full request pool: %d %s", rec.Code, rec.Body)
	}
}

func TestWithRequestInfo(t *testing.T) {
	s, _ := testServer(t, "", func(c *Config) { c.MaxSelectorBytes = 32 })
	for _, tc := range []struct {
		path string
		code int // 0: reaches the next handler
		want func(*target) bool
	}{
		{"/metrics", 0, func(t *target) bool { return t.nonResource != nil }},
		{"/debug/pprof/heap", 0, func(t *target) bool { return t.nonResource != nil }},
		{"/api/v1", 0, func(t *target) bool { return t.discovery }},
		{"/version", 0, func(t *target) bool { return t.discovery }},
		{"/api/v1/namespaces/ns/pods?watch=1&labelSelector=a%3Db", 0, func(t *target) bool {
			return t.info.Verb == request.VerbWatch && t.info.Namespace == "ns" && t.query.Get("labelSelector") == "a=b"
		}},
		{"/api/v1/widgets", http.StatusNotFound, nil},
		{"/api/v1/pods?labelSelector=a%3D%3D%3Db", http.StatusBadRequest, nil},
		{"/api/v1/pods?labelSelector=" + strings.Repeat("a", 33), http.StatusBadRequest, nil},
	} {
		next := &reached{}
		sc := newScope()
		r := httptest.NewRequest(http.MethodGet, tc.path, nil).WithContext(withTestScope(context.Background(), sc))
		rec := serve(s.withRequestInfo(next), r)
		if tc.code != 0 {
			if rec.Code != tc.code || next.r != nil {
				t.Errorf("%s: %d, want %d", tc.path, rec.Code, tc.code)
			}
			continue
		}
		if next.r == nil || !tc.want(next.sc.target) {
			t.Errorf("%s: %d, target %+v", tc.path, rec.Code, sc.target)
		}
	}
}

func TestWithOptions(t *testing.T) {
	s, _ := testServer(t, "", nil)
	for _, tc := range []struct {
		path   string
		accept string
		code   int
		want   func(*options) bool
	}{
		{"/api/v1/pods?watch=1&resourceVersion=5", "", 0, func(o *options) bool { return o.watch != nil && o.list == nil }},
		{"/api/v1/pods?limit=10", "", 0, func(o *options) bool { return o.list != nil && o.list.Limit == 10 && o.watch == nil }},
		{"/api/v1/pods?limit=x", "", http.StatusBadRequest, nil},
		{"/api/v1/pods?watch=1&sendInitialEvents=maybe", "", http.StatusBadRequest, nil},
		{"/api/v1/pods", "text/html", http.StatusNotAcceptable, nil},
	} {
		q := httptest.NewRequest(http.MethodGet, tc.path, nil)
		info, err := request.Parse(s.reg, q.URL.Path, q.URL.Query())
		if err != nil {
			t.Fatal(err)
		}
		sc := newScope()
		sc.rec = &statusRecorder{writeTimeout: 1}
		sc.target = &target{info: info, query: q.URL.Query()}
		q = q.WithContext(withTestScope(context.Background(), sc))
		if tc.accept != "" {
			q.Header.Set("Accept", tc.accept)
		}
		next := &reached{}
		rec := serve(s.withOptions(next), q)
		if tc.code != 0 {
			if rec.Code != tc.code || next.r != nil {
				t.Errorf("%s: %d, want %d", tc.path, rec.Code, tc.code)
			}
			continue
		}
		if next.r == nil || !tc.want(next.sc.options) {
			t.Errorf("%s: %d %s", tc.path, rec.Code, rec.Body)
		}
		if watch := info.Verb == request.VerbWatch; (sc.rec.writeTimeout == 0) != watch {
			t.Errorf("%s: write timeout %v", tc.path, sc.rec.writeTimeout)
		}
	}
}

func TestWithAudit(t *testing.T) {
	s, _ := testServer(t, "", nil)
	var seen *requestScope
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = scopeOf(w)
		seen.entry.Verb, seen.entry.Resource = "list", "pods"
		if _, ok := w.(*statusRecorder); !ok {
			t.Errorf("the next handler writes to a %T", w)
		}
		w.WriteHeader(http.StatusTeapot)
	})
	r := httptest.NewRequest(http.MethodGet, "/api/v1/pods", nil)
	r.Header.Set("Audit-ID", "a-1")
	rec := serve(s.withAudit(inner), r)
	if rec.Header().Get("Audit-ID") != "a-1" || rec.Header().Get("Cache-Control") != cacheControl || rec.Code != http.StatusTeapot {
		t.Fatalf("%d %v", rec.Code, rec.Header())
	}
	if seen == nil || seen.rec.code != http.StatusTeapot {
		t.Fatal("the scope did not record the status")
	}
	if n := testutil.ToFloat64(s.m.requests.WithLabelValues("list", "pods", "418")); n != 1 {
		t.Fatalf("apiserver_request_total{list,pods,418} = %v", n)
	}

	// A new audit ID when the client sends none.
	rec = serve(s.withAudit(inner), httptest.NewRequest(http.MethodGet, "/api/v1/pods", nil))
	if id := rec.Header().Get("Audit-ID"); len(id) != 36 {
		t.Fatalf("audit ID %q", id)
	}
}
