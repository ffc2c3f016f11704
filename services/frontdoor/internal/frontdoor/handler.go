package frontdoor

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/storage"
	"herald.dev/services/frontdoor/internal/apierr"
	"herald.dev/services/frontdoor/internal/audit"
	"herald.dev/services/frontdoor/internal/authn"
	"herald.dev/services/frontdoor/internal/authz"
	"herald.dev/services/frontdoor/internal/limits"
	"herald.dev/services/frontdoor/internal/reads"
	"herald.dev/services/frontdoor/internal/upstream"
)

// The frontdoor's handler is a chain of filters, as kube-apiserver's is
// (k8s.io/apiserver's WithAudit, WithAuthentication, WithAuthorization,
// ...): each wraps the next handler, answers the request itself when its
// step refuses it, and otherwise hands what it learned (the user, the
// resource the path names, the parsed options) to the next in the
// request's context. handler assembles them, in the order the package
// comment lists the steps.
func (s *Server) handler() http.Handler {
	var h http.Handler = http.HandlerFunc(s.route)
	h = withLimits(h, s.requests, s.watches, s.m.rejected)
	h = s.withOptions(h)
	h = withAuthorization(h, s.allowed, s.writeStatus)
	h = s.withRequestInfo(h)
	h = withReadOnly(h, s.writeStatus)
	if s.cluster != nil {
		h = s.withClusterRouting(h)
	}
	h = withAuthentication(h, s.authenticate, s.m.authnFailures, s.writeStatus)
	h = withHealth(h)
	h = withBodyLimit(h, s.cfg.MaxBodyBytes, s.writeStatus)
	return s.withAudit(h)
}

// statusWriter writes err as the request's answer (Server.writeStatus).
type statusWriter func(w http.ResponseWriter, r *http.Request, err error)

// requestScope is what the audit filter opens for a request, and the other
// filters fill in: the response's recorder, the audit line's entry, the
// audit event and what runs when the request ends.
type requestScope struct {
	rec   *statusRecorder
	entry *audit.Entry
	audit *audit.Record
	end   *requestEnd
}

type scopeKey struct{}

// scopeOf returns the request's scope; a filter that runs without the
// audit filter (its unit tests) gets one of its own, which nobody reads.
func scopeOf(ctx context.Context) *requestScope {
	if sc, ok := ctx.Value(scopeKey{}).(*requestScope); ok {
		return sc
	}
	return &requestScope{entry: &audit.Entry{}, end: &requestEnd{}}
}

func withScope(ctx context.Context, sc *requestScope) context.Context {
	return context.WithValue(ctx, scopeKey{}, sc)
}

type userKey struct{}

// userOf returns the request's user (authentication's, or whom it
// impersonates), nil before authentication.
func userOf(ctx context.Context) *User {
	u, _ := ctx.Value(userKey{}).(*User)
	return u
}

func withUser(ctx context.Context, u *User) context.Context {
	return context.WithValue(ctx, userKey{}, u)
}

// target is what a request's path names, as withRequestInfo resolved it:
// exactly one of an RBAC-guarded non-resource handler, discovery, or a
// resource of the registry.
type target struct {
	nonResource http.Handler
	discovery   bool
	info        kube.RequestInfo // a resource request
	query       url.Values
}

type targetKey struct{}

func targetOf(ctx context.Context) *target {
	t, _ := ctx.Value(targetKey{}).(*target)
	return t
}

func withTarget(ctx context.Context, t *target) context.Context {
	return context.WithValue(ctx, targetKey{}, t)
}

// options are a resource request's options as withOptions validated them:
// the negotiated encoding and the parsed watch or list request.
type options struct {
	negotiated storage.Negotiated
	watch      *kube.WatchRequest
	list       *heraldv1.ListRequest
}

type optionsKey struct{}

func optionsOf(ctx context.Context) *options {
	o, _ := ctx.Value(optionsKey{}).(*options)
	return o
}

type watchInitKey struct{}

// watchInit returns the release of the request slot a watch holds until a
// replica has started its stream (withLimits); a no-op when there is none.
func watchInit(ctx context.Context) func() {
	if f, ok := ctx.Value(watchInitKey{}).(func()); ok {
		return f
	}
	return func() {}
}

// withAudit opens the request: its audit ID, Cache-Control, the status
// recorder, the audit event, and what runs when the request ends (the
// metrics and the audit line), when the handler returns or, for a watch
// whose stream was detached, when the stream ends.
func (s *Server) withAudit(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		auditID := withAuditID(w, r)
		// kube-apiserver's default for every answer: all are authenticated.
		w.Header().Set("Cache-Control", cacheControl)
		sc := &requestScope{
			rec:   &statusRecorder{ResponseWriter: w, writeTimeout: s.cfg.WriteTimeout},
			entry: &audit.Entry{},
			end:   &requestEnd{},
		}
		sc.audit, r = s.audit.Begin(r, auditID, start, sc.entry)
		sc.rec.onStatus = sc.audit.ResponseStarted
		defer sc.end.handlerReturned()
		// Not r: a detached watch's end must not keep the request.
		sc.end.add(s.auditLine(sc, r.URL.Path, auditID, start))
		next.ServeHTTP(sc.rec, r.WithContext(withScope(r.Context(), sc)))
	})
}

// auditLine is what ends every request: its metrics, its audit line and
// its audit event's last stage.
func (s *Server) auditLine(sc *requestScope, path, auditID string, start time.Time) func() {
	rec, ae := sc.rec, sc.entry
	return func() {
		code := rec.code
		if code == 0 {
			code = http.StatusOK
		}
		if ae.Verb != "" {
			s.m.requests.WithLabelValues(ae.Verb, ae.Resource, strconv.Itoa(code)).Inc()
			if ae.Verb != string(kube.VerbWatch) {
				s.m.duration.WithLabelValues(ae.Verb, ae.Resource).Observe(time.Since(start).Seconds())
			}
		}
		if ae.Forwarded {
			s.m.forwarded.WithLabelValues(ae.Verb, strconv.Itoa(code)).Inc()
		}
		resource := ae.Resource
		if ae.UpstreamResource != "" {
			resource = ae.UpstreamResource
		}
		attrs := []any{"user", ae.User, "verb", ae.Verb, "resource", resource, "namespace", ae.Namespace,
			"path", path, "code", code, "duration", time.Since(start).Round(time.Microsecond), "auditID", auditID}
		if ae.Authn != "" {
			attrs = append(attrs, "authn", ae.Authn)
		}
		if rec.timedOut {
			s.m.writeTimeouts.Inc()
			ae.Reason = "client did not read the response within write-timeout"
		}
		if ae.Reason != "" {
			attrs = append(attrs, "reason", ae.Reason)
		}
		s.log.Info("audit", attrs...)
		sc.audit.Complete(code)
	}
}

// withBodyLimit refuses a body declared larger than max (413) and cuts one
// that turns out larger while it is read.
func withBodyLimit(next http.Handler, max int64, fail statusWriter) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > max {
			fail(w, r, apierr.BodyTooLarge(max))
			return
		}
		if r.Body != nil {
			r.Body = http.MaxBytesReader(w, r.Body, max)
		}
		next.ServeHTTP(w, r)
	})
}

// withHealth answers the health probes, for anyone.
func withHealth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/livez", "/readyz", "/healthz":
			w.Write([]byte("ok"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// withAuthentication resolves the request's user (authenticate): a 401
// unless some credential is valid (counted in failures), a 429 or 503 when
// the cluster could not be asked about a token.
func withAuthentication(next http.Handler, authenticate func(*http.Request) (*User, error), failures *prometheus.CounterVec, fail statusWriter) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ae := scopeOf(r.Context()).entry
		u, err := authenticate(r)
		if err != nil {
			ae.Reason = err.Error()
			creds := "invalid"
			if err == authn.ErrNoCredentials {
				creds = "none"
			}
			if errors.Is(err, upstream.ErrReviewThrottled) {
				kube.WriteStatus(w, apierr.TooMany("Too many requests, please try again later."))
				return
			}
			if errors.Is(err, authn.ErrReviewFailed) {
				kube.WriteStatus(w, apierr.Unavailable("the cluster could not authenticate the request: its TokenReview failed"))
				return
			}
			failures.WithLabelValues(creds).Inc()
			fail(w, r, apierr.Unauthorized())
			return
		}
		ae.User, ae.Authn, ae.Who = u.Name, u.Method, u
		next.ServeHTTP(w, r.WithContext(withUser(r.Context(), u)))
	})
}

// withClusterRouting is cluster mode's routing decision for an
// authenticated request: impersonation first (the request then runs as the
// impersonated user), then everything frontdoor does not serve from its
// cache goes upstream (clusterRoute).
func (s *Server) withClusterRouting(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u := userOf(r.Context())
		if s.clusterRoute(w, r, &u, scopeOf(r.Context()).entry) {
			return // forwarded upstream, or impersonation refused
		}
		next.ServeHTTP(w, r.WithContext(withUser(r.Context(), u)))
	})
}

// withReadOnly refuses every method but GET and HEAD (405): frontdoor
// serves reads only.
func withReadOnly(next http.Handler, fail statusWriter) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			fail(w, r, apierrors.NewMethodNotSupported(schema.GroupResource{}, r.Method))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// withRequestInfo resolves what the path names (target): a guarded
// non-resource path, discovery, or a resource of the registry (404/400),
// whose list's or watch's selectors are checked (parsed, bounded: 400)
// before any authorizer's review carries them.
func (s *Server) withRequestInfo(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t := &target{}
		switch h := s.nonResource(r.URL.Path); {
		case h != nil:
			t.nonResource = h
		case s.disc.Has(r.URL.Path):
			t.discovery = true
		default:
			t.query = r.URL.Query()
			info, err := s.reg.ParseRequest(r.URL.Path, t.query)
			if err != nil {
				s.writeStatus(w, r, err)
				return
			}
			ae := scopeOf(r.Context()).entry
			ae.Verb, ae.Resource, ae.Namespace = string(info.Verb), info.Resource.ID(), info.Namespace
			if err := authz.CheckSelectors(info, t.query, s.cfg.MaxSelectorBytes); err != nil {
				s.writeStatus(w, r, err)
				return
			}
			t.info = info
		}
		next.ServeHTTP(w, r.WithContext(withTarget(r.Context(), t)))
	})
}

// withAuthorization authorizes the request's attributes, as kube-apiserver's
// request info gives them (allowed: local RBAC, or the cluster's
// SubjectAccessReview): 403, or 429/503 when the cluster could not be
// asked. Discovery is every authenticated user's (kube-apiserver's
// system:discovery binding).
func withAuthorization(next http.Handler, allowed func(*http.Request, authz.Attributes) (bool, string, error), fail statusWriter) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t, u := targetOf(r.Context()), userOf(r.Context())
		var a authz.Attributes
		var err error
		switch {
		case t.discovery:
			next.ServeHTTP(w, r)
			return
		case t.nonResource != nil:
			if a, err = authz.RequestAttributes(r, u.Info()); err != nil {
				err = apierrors.NewInternalError(err)
			}
		default:
			a, err = authz.ServedAttributes(r, u.Info(), t.info)
		}
		if err != nil {
			fail(w, r, err)
			return
		}
		if ok, why, refused := allowed(r, a); !ok {
			ae := scopeOf(r.Context()).entry
			ae.Reason = authz.ForbiddenReason(a)
			if refused != nil {
				ae.Reason = refused.Error()
			}
			fail(w, r, cmp.Or(refused, authz.Forbidden(a, why)))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// withOptions, for a resource request: the deprecated API version's
// Warning, content negotiation (406), as in kube-apiserver's handlers
// first, then the options (resourceVersion, selectors, continue, limit;
// 400 or 422) before any backend is asked. A watch is long-running from
// here: no write-timeout applies to it.
func (s *Server) withOptions(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t := targetOf(r.Context())
		if t.nonResource != nil || t.discovery {
			next.ServeHTTP(w, r)
			return
		}
		info := t.info
		if h := s.deprecations.Header(info.Resource); h != "" {
			w.Header().Add("Warning", h)
		}
		n, err := s.reads.Negotiate(r, info)
		if err != nil {
			s.writeStatus(w, r, err)
			return
		}
		o := &options{negotiated: n}
		if info.Verb == kube.VerbWatch {
			if rec := scopeOf(r.Context()).rec; rec != nil {
				rec.writeTimeout = 0 // nothing written yet; a watch is long-running
			}
			// Validated here, once, so that a bad request costs no
			// connection to a replica; fanout gets the request as parsed.
			if o.watch, err = kube.ParseWatch(info, t.query); err == nil {
				err = s.reads.NegotiateWatch(r, info)
			}
		} else {
			o.list, err = reads.ListRequest(info, t.query)
		}
		if err != nil {
			s.writeStatus(w, r, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), optionsKey{}, o)))
	})
}

// withLimits takes the request's slots (429 with Retry-After when refused,
// counted in rejected). Every request holds a slot of requests while its
// handler runs; a watch's is released as soon as a replica has started its
// stream (watchInit), and the established watch holds a slot of watches
// until it ends, with the request (requestEnd), after its handler returns
// if its stream is detached.
func withLimits(next http.Handler, requests, watches *limits.Limiter, rejected *prometheus.CounterVec) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u := userOf(r.Context())
		release, ok := admit(w, requests, "readOnly", u, rejected)
		if !ok {
			return
		}
		defer release()
		if t := targetOf(r.Context()); t == nil || t.nonResource != nil || t.discovery || t.info.Verb != kube.VerbWatch {
			next.ServeHTTP(w, r)
			return
		}
		end, ok := admit(w, watches, "watch", u, rejected)
		if !ok {
			return
		}
		scopeOf(r.Context()).end.add(end)
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), watchInitKey{}, release)))
	})
}

// admit takes a slot of l for u, or answers 429. The returned release may
// be called more than once.
func admit(w http.ResponseWriter, l *limits.Limiter, kind string, u *User, rejected *prometheus.CounterVec) (func(), bool) {
	release, refused := l.Acquire(u.Name) // counted in currentInflight by l
	if refused != "" {
		rejected.WithLabelValues(kind, refused).Inc()
		msg := "Too many requests, please try again later."
		if kind == "watch" {
			msg = "Too many watches, please try again later."
		}
		kube.WriteStatus(w, apierr.TooMany(msg))
		return nil, false
	}
	return release, true
}

// route answers an authorized, admitted request: a guarded non-resource
// path by its handler, discovery, a watch by a fanout replica (proxy.go),
// a LIST or GET from the cache, or, in cluster mode, from kube-apiserver
// when it is older than the cache's window.
func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	t := targetOf(r.Context())
	switch {
	case t.nonResource != nil:
		t.nonResource.ServeHTTP(w, r)
	case t.discovery:
		s.disc.Serve(w, r.URL.Path)
	case t.info.Verb == kube.VerbWatch:
		s.serveWatch(w, r, t.info, optionsOf(r.Context()).watch)
	default:
		s.serveList(w, r, t.info, optionsOf(r.Context()))
	}
}

// serveWatch hands an admitted watch to the fanout pool; the request's end
// (its slots, its audit line) runs when the watch ends.
func (s *Server) serveWatch(w http.ResponseWriter, r *http.Request, info kube.RequestInfo, wr *kube.WatchRequest) {
	sc := scopeOf(r.Context())
	rec, end := sc.rec, sc.end
	open := s.m.longrunning.WithLabelValues("WATCH", info.Resource.ID())
	open.Inc()
	end.add(open.Dec)
	end.detached = func(code int) {
		rec.code = code
		sc.audit.ResponseStarted(code)
		// The recorder outlives the handler (the audit line reads it): it
		// must not keep net/http's response, and through it the
		// connection's buffers, alive.
		rec.ResponseWriter = nil
	}
	s.fanout.serve(w, r, userOf(r.Context()), wr, watchInit(r.Context()), end)
}

// serveList answers a LIST or GET from the cache, or, older than the
// cache's window (an exact resourceVersion, a paged list at one, a continue
// token), from kube-apiserver as the caller is allowed.
func (s *Server) serveList(w http.ResponseWriter, r *http.Request, info kube.RequestInfo, o *options) {
	u := userOf(r.Context())
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	ctx = identityMetadata(ctx, u)
	if s.reads.List(ctx, s.cache, w, r, info, o.list, o.negotiated) {
		return
	}
	// Its reply carries its own warnings.
	w.Header().Del("Warning")
	ae := scopeOf(r.Context()).entry
	ae.Reason, ae.Forwarded = "upstream: older than the cache's window", true
	s.m.olderThanWindow.WithLabelValues(info.Resource.ID()).Inc()
	s.cluster.up.Serve(w, r, u.Info())
}
