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
	"herald.dev/libs/kube/negotiate"
	"herald.dev/libs/kube/request"
	heraldv1 "herald.dev/libs/proto/herald/v1"
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
// request's scope (requestScope). handler assembles them, in the order the
// package comment lists the steps.
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

// gate is a filter whose step either answers the request itself (and
// returns false) or lets it go on to next.
func gate(next http.Handler, step func(http.ResponseWriter, *http.Request) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if step(w, r) {
			next.ServeHTTP(w, r)
		}
	})
}

// statusWriter writes err as the request's answer (Server.writeStatus).
type statusWriter func(w http.ResponseWriter, r *http.Request, err error)

// writeStatus writes err as the answer to r, in the media type the client
// asked for (reads.Reads.WriteStatus).
func (s *Server) writeStatus(w http.ResponseWriter, r *http.Request, err error) {
	s.reads.WriteStatus(w, r, err)
}

// requestScope is what the audit filter opens for a request, and what
// the other filters learn about it: the response's recorder, the audit
// line's entry, the audit event, what runs when the request ends, and then
// the user, the target and the options. The filters reach it through the
// response's recorder (statusRecorder.scope), where kube-apiserver's put a
// value, and a copy of the request, in the request's context per filter:
// a watch served over HTTP/2 keeps its handler, and with it every
// filter's request, for its whole life (BenchmarkIdleWatchHeap: 1.1 KB
// more per idle watch with a context value per filter, 430 bytes with one).
// For the same reason each filter's work is a function of its own (open,
// authenticated, resolve, ...): the filters' frames stay on that handler's
// stack, which grew from 8 to 16 KB per watch with the work in them.
type requestScope struct {
	rec   *statusRecorder
	entry *audit.Entry
	audit *audit.Record
	end   *requestEnd
	// user is the authenticated user (or whom it impersonates), nil
	// before withAuthentication.
	user *User
	// target is what the path names (withRequestInfo), options the
	// validated options of a resource request (withOptions).
	target  *target
	options *options
	// watchInit releases the request slot a watch holds until a replica
	// has started its stream (withLimits).
	watchInit func()
}

// scopeOf returns the scope of the request w answers; one that nobody
// reads when w is not a request's recorder.
func scopeOf(w http.ResponseWriter) *requestScope {
	if rec, ok := w.(*statusRecorder); ok && rec.scope != nil {
		return rec.scope
	}
	return &requestScope{entry: &audit.Entry{}, end: &requestEnd{}}
}

// userOf returns the request's user (authentication's, or whom it
// impersonates), nil before authentication.
func userOf(w http.ResponseWriter) *User { return scopeOf(w).user }

// target is what a request's path names, as withRequestInfo resolved it:
// exactly one of an RBAC-guarded non-resource handler, discovery, or a
// resource of the registry.
type target struct {
	nonResource http.Handler
	discovery   bool
	info        request.Info // a resource request
	// query is the request's, parsed once; withOptions drops it once the
	// options are parsed (a watch's handler outlives it).
	query url.Values
}

func targetOf(w http.ResponseWriter) *target { return scopeOf(w).target }

// options are a resource request's options as withOptions validated them:
// the negotiated encoding and the parsed watch or list request.
type options struct {
	negotiated negotiate.Negotiated
	watch      *request.WatchRequest
	list       *heraldv1.ListRequest
}

// watchInit returns the release of the request slot a watch holds until a
// replica has started its stream (withLimits); a no-op when there is none.
func watchInit(w http.ResponseWriter) func() {
	if f := scopeOf(w).watchInit; f != nil {
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
		sc, r := s.open(w, r)
		defer sc.end.handlerReturned()
		next.ServeHTTP(sc.rec, r)
	})
}

// open opens r's scope, answered through w. (The filters' frames stay
// small: a watch's handler keeps them on its stack for its whole life.)
func (s *Server) open(w http.ResponseWriter, r *http.Request) (*requestScope, *http.Request) {
	start := time.Now()
	auditID := withAuditID(w, r)
	// kube-apiserver's default for every answer: all are authenticated.
	w.Header().Set("Cache-Control", cacheControl)
	sc := &requestScope{
		rec:   &statusRecorder{ResponseWriter: w, writeTimeout: s.cfg.WriteTimeout},
		entry: &audit.Entry{},
		end:   &requestEnd{},
	}
	sc.rec.scope = sc
	var ctx context.Context
	sc.audit, ctx = s.audit.Begin(r, auditID, start, sc.entry)
	if ctx != r.Context() {
		r = r.WithContext(ctx) // where the authorization's decision is recorded
	}
	sc.rec.onStatus = sc.audit.ResponseStarted
	// Not r: a detached watch's end must not keep the request.
	sc.end.add(s.auditLine(sc, r.URL.Path, auditID, start))
	return sc, r
}

// auditLine is what ends every request: its metrics, its audit line and
// its audit event's last stage.
func (s *Server) auditLine(sc *requestScope, path, auditID string, start time.Time) func() {
	// Not sc: a detached watch's end keeps only what it reads.
	rec, ae, au := sc.rec, sc.entry, sc.audit
	return func() {
		code := rec.code
		if code == 0 {
			code = http.StatusOK
		}
		if ae.Verb != "" {
			s.m.requests.WithLabelValues(ae.Verb, ae.Resource, strconv.Itoa(code)).Inc()
			if ae.Verb != string(request.VerbWatch) {
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
		au.Complete(code)
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
	return gate(next, func(w http.ResponseWriter, r *http.Request) bool {
		return authenticated(w, r, authenticate, failures, fail)
	})
}

// authenticated is withAuthentication's step: whether r goes on.
func authenticated(w http.ResponseWriter, r *http.Request, authenticate func(*http.Request) (*User, error), failures *prometheus.CounterVec, fail statusWriter) bool {
	sc := scopeOf(w)
	ae := sc.entry
	u, err := authenticate(r)
	if err != nil {
		ae.Reason = err.Error()
		creds := "invalid"
		if err == authn.ErrNoCredentials {
			creds = "none"
		}
		switch {
		case errors.Is(err, upstream.ErrReviewThrottled):
			kube.WriteStatus(w, apierr.TooMany("Too many requests, please try again later."))
		case errors.Is(err, authn.ErrReviewFailed):
			kube.WriteStatus(w, apierr.Unavailable("the cluster could not authenticate the request: its TokenReview failed"))
		default:
			failures.WithLabelValues(creds).Inc()
			fail(w, r, apierr.Unauthorized())
		}
		return false
	}
	ae.User, ae.Authn, ae.Who = u.Name, u.Method, u
	sc.user = u
	return true
}

// withClusterRouting is cluster mode's routing decision for an
// authenticated request: impersonation first (the request then runs as the
// impersonated user), then everything frontdoor does not serve from its
// cache goes upstream (clusterRoute).
func (s *Server) withClusterRouting(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sc := scopeOf(w)
		if s.clusterRoute(w, r, &sc.user, sc.entry) {
			return // forwarded upstream, or impersonation refused
		}
		next.ServeHTTP(w, r)
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
func (s *Server) withRequestInfo(next http.Handler) http.Handler { return gate(next, s.resolve) }

// resolve is withRequestInfo's step: whether r goes on.
func (s *Server) resolve(w http.ResponseWriter, r *http.Request) bool {
	sc := scopeOf(w)
	t := &target{}
	switch h := s.nonResource(r.URL.Path); {
	case h != nil:
		t.nonResource = h
	case s.disc.Has(r.URL.Path):
		t.discovery = true
	default:
		t.query = r.URL.Query()
		info, err := request.Parse(s.reg, r.URL.Path, t.query)
		if err != nil {
			s.writeStatus(w, r, err)
			return false
		}
		ae := sc.entry
		ae.Verb, ae.Resource, ae.Namespace = string(info.Verb), info.Resource.ID(), info.Namespace
		if err := authz.CheckSelectors(info, t.query, s.cfg.MaxSelectorBytes); err != nil {
			s.writeStatus(w, r, err)
			return false
		}
		t.info = info
	}
	sc.target = t
	return true
}

// withAuthorization authorizes the request's attributes, as kube-apiserver's
// request info gives them (allowed: local RBAC, or the cluster's
// SubjectAccessReview): 403, or 429/503 when the cluster could not be
// asked. Discovery is every authenticated user's (kube-apiserver's
// system:discovery binding).
func withAuthorization(next http.Handler, allowed func(*http.Request, authz.Attributes) (bool, string, error), fail statusWriter) http.Handler {
	return gate(next, func(w http.ResponseWriter, r *http.Request) bool {
		return authorized(w, r, allowed, fail)
	})
}

// authorized is withAuthorization's step: whether r goes on.
func authorized(w http.ResponseWriter, r *http.Request, allowed func(*http.Request, authz.Attributes) (bool, string, error), fail statusWriter) bool {
	t, u := targetOf(w), userOf(w)
	var a authz.Attributes
	var err error
	switch {
	case t.discovery:
		return true
	case t.nonResource != nil:
		if a, err = authz.RequestAttributes(r, u.Info()); err != nil {
			err = apierrors.NewInternalError(err)
		}
	default:
		a, err = authz.ServedAttributes(r, u.Info(), t.info)
	}
	if err != nil {
		fail(w, r, err)
		return false
	}
	if ok, why, refused := allowed(r, a); !ok {
		ae := scopeOf(w).entry
		ae.Reason = authz.ForbiddenReason(a)
		if refused != nil {
			ae.Reason = refused.Error()
		}
		fail(w, r, cmp.Or(refused, authz.Forbidden(a, why)))
		return false
	}
	return true
}

// withOptions, for a resource request: the deprecated API version's
// Warning, content negotiation (406), as in kube-apiserver's handlers
// first, then the options (resourceVersion, selectors, continue, limit;
// 400 or 422) before any backend is asked. A watch is long-running from
// here: no write-timeout applies to it.
func (s *Server) withOptions(next http.Handler) http.Handler { return gate(next, s.validOptions) }

// validOptions is withOptions' step: whether r goes on.
func (s *Server) validOptions(w http.ResponseWriter, r *http.Request) bool {
	sc := scopeOf(w)
	t := sc.target
	if t.nonResource != nil || t.discovery {
		return true
	}
	info := t.info
	if h := s.deprecations.Header(info.Resource); h != "" {
		w.Header().Add("Warning", h)
	}
	n, err := s.reads.Negotiate(r, info)
	if err != nil {
		s.writeStatus(w, r, err)
		return false
	}
	o := &options{negotiated: n}
	if info.Verb == request.VerbWatch {
		if rec := sc.rec; rec != nil {
			rec.writeTimeout = 0 // nothing written yet; a watch is long-running
		}
		// Validated here, once, so that a bad request costs no
		// connection to a replica; fanout gets the request as parsed.
		if o.watch, err = request.ParseWatch(info, t.query); err == nil {
			err = s.reads.NegotiateWatch(r, info)
		}
	} else {
		o.list, err = reads.ListRequest(info, t.query)
	}
	if err != nil {
		s.writeStatus(w, r, err)
		return false
	}
	t.query = nil // parsed: a watch's handler need not keep it
	sc.options = o
	return true
}

// withLimits takes the request's slots (429 with Retry-After when refused,
// counted in rejected). Every request holds a slot of requests while its
// handler runs; a watch's is released as soon as a replica has started its
// stream (watchInit), and the established watch holds a slot of watches
// until it ends, with the request (requestEnd), after its handler returns
// if its stream is detached.
func withLimits(next http.Handler, requests, watches *limits.Limiter, rejected *prometheus.CounterVec) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		release, ok := admitted(w, requests, watches, rejected)
		if !ok {
			return
		}
		defer release()
		next.ServeHTTP(w, r)
	})
}

// admitted is withLimits' step: the request slot's release when r goes on.
func admitted(w http.ResponseWriter, requests, watches *limits.Limiter, rejected *prometheus.CounterVec) (func(), bool) {
	sc := scopeOf(w)
	u := sc.user
	release, ok := admit(w, requests, "readOnly", u, rejected)
	if !ok {
		return nil, false
	}
	if t := sc.target; t == nil || t.nonResource != nil || t.discovery || t.info.Verb != request.VerbWatch {
		return release, true
	}
	end, ok := admit(w, watches, "watch", u, rejected)
	if !ok {
		release()
		return nil, false
	}
	sc.end.add(end)
	sc.watchInit = release
	return release, true
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
	t := targetOf(w)
	switch {
	case t.nonResource != nil:
		t.nonResource.ServeHTTP(w, r)
	case t.discovery:
		s.disc.Serve(w, r.URL.Path)
	case t.info.Verb == request.VerbWatch:
		s.serveWatch(w, r)
	default:
		s.serveList(w, r)
	}
}

// serveWatch hands an admitted watch to the fanout pool; the request's end
// (its slots, its audit line) runs when the watch ends.
func (s *Server) serveWatch(w http.ResponseWriter, r *http.Request) {
	sc := scopeOf(w)
	rec, end, au, started := sc.rec, sc.end, sc.audit, watchInit(w)
	info, wr := sc.target.info, sc.options.watch
	resource := info.Resource.ID()
	// The watch's handler (an HTTP/2 stream's) lasts as long as the watch:
	// what the filters learned is not kept that long.
	sc.target, sc.options, sc.watchInit = nil, nil, nil
	open := s.m.longrunning.WithLabelValues("WATCH", resource)
	open.Inc()
	end.add(open.Dec)
	end.detached = func(code int) {
		rec.code = code
		au.ResponseStarted(code)
		// The recorder outlives the handler (the audit line reads it): it
		// must not keep net/http's response, and through it the
		// connection's buffers, alive; nor the filters' scope.
		rec.ResponseWriter, rec.scope = nil, nil
	}
	s.fanout.serve(w, r, info, wr, started, end)
}

// serveList answers a LIST or GET from the cache, or, older than the
// cache's window (an exact resourceVersion, a paged list at one, a continue
// token), from kube-apiserver as the caller is allowed.
func (s *Server) serveList(w http.ResponseWriter, r *http.Request) {
	sc := scopeOf(w)
	u, info, o := sc.user, sc.target.info, sc.options
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	ctx = identityMetadata(ctx, u)
	if s.reads.List(ctx, s.cache, w, r, info, o.list, o.negotiated) {
		return
	}
	// Its reply carries its own warnings.
	w.Header().Del("Warning")
	ae := sc.entry
	ae.Reason, ae.Forwarded = "upstream: older than the cache's window", true
	s.m.olderThanWindow.WithLabelValues(info.Resource.ID()).Inc()
	s.cluster.up.Serve(w, r, u.Info())
}
