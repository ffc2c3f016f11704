package request

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metainternalversionvalidation "k8s.io/apimachinery/pkg/apis/meta/internalversion/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"herald.dev/libs/storage"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"herald.dev/libs/kube"
	"herald.dev/libs/rv"
)

// Verb is one of the read verbs Herald serves.
type Verb string

const (
	VerbGet   Verb = "get"
	VerbList  Verb = "list"
	VerbWatch Verb = "watch"
)

// Info is what a resource request path and its watch parameter say.
type Info struct {
	Resource  *kube.Resource
	Namespace string // "" for all namespaces or cluster-scoped
	Name      string // "" for collections
	Verb      Verb
}

// Parse resolves a resource path (/api/v1/..., /apis/g/v/...) against
// the registry. Errors are Kubernetes API errors (404 for unknown paths and
// resources, 400 for malformed names, 405 for sub-resources).
func Parse(g *kube.Registry, path string, query url.Values) (Info, error) {
	var group, version string
	var rest []string
	parts := splitPath(path)
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		version, rest = parts[1], parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		group, version, rest = parts[1], parts[2], parts[3:]
	default:
		return Info{}, notFoundPath()
	}
	watchPath := false
	if len(rest) > 0 && rest[0] == "watch" { // deprecated /watch/ paths
		watchPath, rest = true, rest[1:]
	}
	var ns string
	if len(rest) >= 3 && rest[0] == "namespaces" {
		ns, rest = rest[1], rest[2:]
	}
	if len(rest) == 0 {
		return Info{}, notFoundPath()
	}
	res, ok := g.Lookup(group, version, rest[0])
	if !ok {
		if version != "" && !builtinGroup(group) {
			return Info{}, kube.ErrNoRoute
		}
		return Info{}, notFoundPath()
	}
	info := Info{Resource: res, Namespace: ns, Verb: VerbList}
	if len(rest) > 2 { // a subresource: none is served from the cache
		if res.Custom() {
			// kube-apiserver's CRD handler answers a subresource the
			// CRD does not define as a missing object.
			return Info{}, apierrors.NewNotFound(groupResource(group, rest[0]), rest[1])
		}
		return Info{}, notFoundPath()
	}
	if len(rest) == 2 {
		info.Name, info.Verb = rest[1], VerbGet
		if !validPathSegment(info.Name) {
			return Info{}, apierrors.NewBadRequest(fmt.Sprintf("invalid name %q", info.Name))
		}
	}
	if ns != "" && !res.Namespaced {
		return Info{}, apierrors.NewNotFound(groupResource(group, rest[0]), info.Name)
	}
	if ns != "" {
		if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
			return Info{}, apierrors.NewBadRequest(fmt.Sprintf("invalid namespace %q: %s", ns, strings.Join(msgs, "; ")))
		}
	}
	// ?watch=true turns a collection's GET into a watch; on a named object
	// it is ignored, the request stays a GET (kube-apiserver's request
	// info: only /watch/ paths watch one object).
	if watchPath || (info.Name == "" && WatchParam(query)) {
		info.Verb = VerbWatch
	}
	return info, nil
}

// WatchParam reports whether query asks for a watch as kube-apiserver reads
// ?watch (apimachinery's conversion of a query value to a bool): present,
// and neither "0" nor "false" in any case ("?watch" and "?watch=yes" are
// watches).
func WatchParam(query url.Values) bool {
	v := query["watch"]
	return len(v) > 0 && v[0] != "0" && !strings.EqualFold(v[0], "false")
}

// Await is Parse for a hop serving a request another hop has
// resolved (fanout, after frontdoor): each learns custom resources from the
// CRDs on its own, so a path under a group with no built-in handler
// (kube.ErrNoRoute) may name a custom resource this registry is about to learn.
// It waits for the registry to change, at most d, and parses again.
func Await(ctx context.Context, g *kube.Registry, d time.Duration, path string, query url.Values) (Info, error) {
	changed := g.Changed()
	info, err := Parse(g, path, query)
	if !errors.Is(err, kube.ErrNoRoute) {
		return info, err
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	for errors.Is(err, kube.ErrNoRoute) {
		select {
		case <-changed:
		case <-timer.C:
			return info, err
		case <-ctx.Done():
			return info, err
		}
		changed = g.Changed()
		info, err = Parse(g, path, query)
	}
	return info, err
}

func splitPath(path string) []string {
	path = strings.Trim(path, "/")
	if path == "" {
		return nil
	}
	return strings.Split(path, "/")
}

func validPathSegment(s string) bool {
	return s != "" && s != "." && s != ".." && !strings.ContainsAny(s, "/%")
}

// notFoundPath is kube-apiserver's 404 for a path no route serves (an
// unknown version, resource or subresource): "the server could not find the
// requested resource", with empty details.
func notFoundPath() error {
	return apierrors.NewGenericServerResponse(http.StatusNotFound, "", schema.GroupResource{}, "", "", 0, false)
}

func groupResource(group, resource string) schema.GroupResource {
	return schema.GroupResource{Group: group, Resource: resource}
}

// WatchRequest is a watch's options, parsed and validated once: frontdoor
// parses the client's query with ParseWatch (answering a bad one before any
// replica is asked) and forwards Query's canonical encoding; fanout decodes
// that with ParseWatch again. One parser means the two hops can never
// disagree about what a watch asked for.
//
// Only the options a watch uses survive Query; anything else a client sent
// (limit, continue, pretty...) is dropped on the internal hop.
type WatchRequest struct {
	// As the client sent them: Query forwards these.
	LabelSelector        string
	FieldSelector        string
	ResourceVersion      string
	ResourceVersionMatch string
	SendInitialEvents    *bool // nil: not sent
	AllowWatchBookmarks  bool
	// TimeoutSeconds: 0 when not sent (or 0): the server picks the timeout.
	TimeoutSeconds int64

	// Selector is the request's namespace and selectors, with the path's
	// name (a watch on /{resource}/{name}) folded into the field selector.
	Selector *Selector
	// Plan is where the watch starts (libs/rv).
	Plan rv.WatchPlan
}

// ParseWatch validates a watch's options for the request info describes.
// Errors are the Kubernetes Status errors kube-apiserver returns: 400 for a
// malformed value or selector, 422 for an invalid combination of
// resourceVersion, resourceVersionMatch and sendInitialEvents.
func ParseWatch(info Info, q url.Values) (*WatchRequest, error) {
	w := &WatchRequest{
		LabelSelector: q.Get("labelSelector"), FieldSelector: q.Get("fieldSelector"),
		ResourceVersion: q.Get("resourceVersion"), ResourceVersionMatch: q.Get("resourceVersionMatch"),
	}
	fieldSel := w.FieldSelector
	if info.Name != "" {
		// A watch on /{resource}/{name} watches one object.
		fs, err := fields.ParseSelector(fieldSel)
		if err != nil {
			return nil, apierrors.NewBadRequest(err.Error())
		}
		fieldSel = fields.AndSelectors(fs, fields.OneTermEqualSelector("metadata.name", info.Name)).String()
	}
	sel, err := ParseSelector(info.Resource, info.Namespace, w.LabelSelector, fieldSel)
	if err != nil {
		return nil, OptionError(err)
	}
	w.Selector = sel
	if v := q.Get("sendInitialEvents"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, apierrors.NewBadRequest("sendInitialEvents must be true or false")
		}
		w.SendInitialEvents = &b
	}
	if v := q.Get("allowWatchBookmarks"); v != "" {
		if w.AllowWatchBookmarks, err = strconv.ParseBool(v); err != nil {
			return nil, apierrors.NewBadRequest("allowWatchBookmarks must be true or false")
		}
	}
	if w.Plan, err = rv.PlanWatch(w.ResourceVersion, w.ResourceVersionMatch, w.SendInitialEvents, w.AllowWatchBookmarks); err != nil {
		if invalid := resourceVersionError(w.ResourceVersion); invalid != nil {
			// kube-apiserver's watch cache returns the storage's
			// InvalidError unwrapped: a 500 without a reason.
			return nil, &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure,
				Code: http.StatusInternalServerError, Message: invalid.Error()}}
		}
		return nil, OptionError(err)
	}
	if v := q.Get("timeoutSeconds"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return nil, apierrors.NewBadRequest("timeoutSeconds must be a non-negative integer")
		}
		w.TimeoutSeconds = n
	}
	return w, nil
}

// Query is w's canonical encoding (with watch=true): ParseWatch of it, for
// the same path, gives back w.
func (w *WatchRequest) Query() url.Values {
	q := url.Values{"watch": {"true"}}
	set := func(k, v string) {
		if v != "" {
			q.Set(k, v)
		}
	}
	set("labelSelector", w.LabelSelector)
	set("fieldSelector", w.FieldSelector)
	set("resourceVersion", w.ResourceVersion)
	set("resourceVersionMatch", w.ResourceVersionMatch)
	if w.SendInitialEvents != nil {
		q.Set("sendInitialEvents", strconv.FormatBool(*w.SendInitialEvents))
	}
	if w.AllowWatchBookmarks {
		q.Set("allowWatchBookmarks", "true")
	}
	if w.TimeoutSeconds > 0 {
		q.Set("timeoutSeconds", strconv.FormatInt(w.TimeoutSeconds, 10))
	}
	return q
}

// OptionError maps an error of libs/rv (resourceVersion, continue tokens)
// or of selector parsing to its Kubernetes Status: malformed values are 400,
// invalid combinations 422 (as the cache's gRPC errors map in kube.FromGRPC, so a
// client sees the same Status whichever hop rejected its request).
func OptionError(err error) error {
	switch {
	case errors.Is(err, rv.ErrMalformed):
		return kube.FromGRPC(status.Error(codes.InvalidArgument, err.Error()))
	case errors.Is(err, rv.ErrInvalidCombination):
		return kube.FromGRPC(status.Error(codes.FailedPrecondition, err.Error()))
	}
	var api apierrors.APIStatus
	if errors.As(err, &api) {
		return err
	}
	return apierrors.NewBadRequest(err.Error())
}

// resourceVersionError is the error kube-apiserver's storage gives a
// resourceVersion it cannot parse (storage.APIObjectVersioner), nil for one
// it can.
func resourceVersionError(resourceVersion string) *field.Error {
	if resourceVersion == "" || resourceVersion == "0" {
		return nil
	}
	if _, err := strconv.ParseUint(resourceVersion, 10, 64); err != nil {
		return field.Invalid(field.NewPath("resourceVersion"), resourceVersion, err.Error())
	}
	return nil
}

// ValidateListOptions is kube-apiserver's validation of a LIST's
// resourceVersionMatch, continue and sendInitialEvents (apimachinery's
// ValidateListOptions): a 422 naming ListOptions.
func ValidateListOptions(q url.Values) error {
	opts := &metainternalversion.ListOptions{ResourceVersion: q.Get("resourceVersion"),
		ResourceVersionMatch: metav1.ResourceVersionMatch(q.Get("resourceVersionMatch")), Continue: q.Get("continue")}
	if v := q.Get("sendInitialEvents"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return apierrors.NewBadRequest(fmt.Sprintf("sendInitialEvents: %v", err))
		}
		opts.SendInitialEvents = &b
	}
	if errs := metainternalversionvalidation.ValidateListOptions(opts, true); len(errs) > 0 {
		return apierrors.NewInvalid(schema.GroupKind{Group: metav1.GroupName, Kind: "ListOptions"}, "", errs)
	}
	return nil
}

// ListPlanError is an error of rv.PlanList as the client sees it: a
// resourceVersion or continue token kube-apiserver's storage cannot read in
// its words ("invalid resource version: ...", "invalid continue token:
// ..."), anything else as OptionError makes it.
func ListPlanError(err error, resourceVersion string) error {
	if !errors.Is(err, rv.ErrMalformed) {
		return OptionError(err)
	}
	// In kube-apiserver's storage's order: the token, then the
	// resourceVersion.
	var te *rv.TokenError
	if errors.As(err, &te) {
		return apierrors.NewBadRequest("invalid continue token: " + te.Error())
	}
	if errors.Is(err, rv.ErrContinueWithResourceVersion) {
		return apierrors.NewBadRequest(err.Error())
	}
	if invalid := resourceVersionError(resourceVersion); invalid != nil {
		return apierrors.NewBadRequest("invalid resource version: " + invalid.Error())
	}
	return OptionError(err)
}

// builtinGroups are the API groups of kube-apiserver's built-in resources
// ("" is the core group).
var builtinGroups = func() map[string]struct{} {
	m := map[string]struct{}{}
	for _, r := range storage.Builtins() {
		m[r.Group] = struct{}{}
	}
	return m
}()

func builtinGroup(group string) bool {
	_, ok := builtinGroups[group]
	return ok
}
