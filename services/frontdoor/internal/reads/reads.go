// Package reads serves LIST and GET from the cache: options validated
// before the cache is asked, the answer encoded as negotiated. Response
// encodings of LIST and GET are negotiated as kube-apiserver
// negotiates them (libs/storage): JSON as the cache hands it out (lists
// assembled from the items' bytes), protobuf for built-in kinds (the
// items decoded into their Go types once per response),
// PartialObjectMetadata(List) for every resource, Tables, YAML and pretty
// JSON. Watches are negotiated here too, so that a refused one costs no
// connection to a replica; fanout negotiates the forwarded Accept header
// again with the same code to choose the stream's encoding.
package reads

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"herald.dev/libs/cacheclient"
	"herald.dev/libs/kube"
	"herald.dev/libs/kube/negotiate"
	"herald.dev/libs/kube/printers"
	"herald.dev/libs/kube/request"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/rv"
	"herald.dev/libs/service"
	"herald.dev/libs/storage"
	"herald.dev/services/frontdoor/internal/apierr"
)

// Reads answers LIST and GET requests from the cache, encoded as
// negotiated, and writes the errors of resource requests in the media type
// asked for.
type Reads struct {
	Codec *storage.Codec        // protobuf and metadata encodings
	Neg   *negotiate.Negotiator // content negotiation
	Log   *slog.Logger
	// GzipMinBytes: bodies this large are gzipped for clients that
	// accept it.
	GzipMinBytes int
	// Upstream: cluster mode; a list older than the cache's window is
	// kube-apiserver's to answer.
	Upstream bool
}

// New returns the reads with their codec and negotiator.
func New(log *slog.Logger, gzipMinBytes int, upstream bool) (*Reads, error) {
	codec, err := storage.NewCodec(nil)
	if err != nil {
		return nil, err
	}
	return &Reads{Codec: codec, Neg: negotiate.NewNegotiator(), Log: log, GzipMinBytes: gzipMinBytes, Upstream: upstream}, nil
}

// custom reports whether r is a custom resource (no Go type: never
// protobuf, except its PartialObjectMetadata).
func (s *Reads) custom(r *kube.Resource) bool { return !s.Codec.Typed(r.GroupVersionKind()) }

// Negotiate is kube-apiserver's first negotiation of a resource request,
// its router's and then its handler's: 406 before anything else about the
// request is looked at.
func (s *Reads) Negotiate(r *http.Request, info request.Info) (negotiate.Negotiated, error) {
	custom := s.custom(info.Resource)
	if err := s.Neg.Route(r, custom, info.Name == ""); err != nil {
		return negotiate.Negotiated{}, err
	}
	return s.Neg.NegotiateOutput(r, custom)
}

// NegotiateWatch is the watch's second negotiation (its stream's media
// type: a watch cannot be YAML), after its options were validated.
func (s *Reads) NegotiateWatch(r *http.Request, info request.Info) error {
	_, err := s.Neg.NegotiateWatch(r, s.custom(info.Resource))
	return err
}

// body encodes a LIST or GET response from the cache in n: its
// Content-Type and bytes. Errors are API errors (406 for a transformation
// the response cannot take) or, for values the cache should never have
// handed out, internal ones.
func (s *Reads) body(info request.Info, resp *heraldv1.ListResponse, n negotiate.Negotiated, include printers.IncludeObject, now time.Time) (string, []byte, error) {
	res := info.Resource
	gvk := res.GroupVersionKind()
	custom := s.custom(res)
	get := info.Name != ""
	if err := n.CheckTarget(gvk.GroupKind(), custom, !get); err != nil {
		return "", nil, err
	}
	lm := metav1.ListMeta{ResourceVersion: itoa(resp.Revision), Continue: resp.Continue, RemainingItemCount: resp.RemainingItemCount}
	var (
		obj  runtime.Object // encoded with n's serializer
		body []byte         // JSON, converted to n's media type
		err  error
	)
	ct := n.MediaType
	switch {
	case n.As() == storage.KindTable:
		if get {
			// kube-apiserver's table of one object carries that
			// object's resourceVersion, not the list's (its table
			// convertors read it from the object): a client compares
			// it with the same object's in a watch's Table events.
			lm = metav1.ListMeta{ResourceVersion: objectResourceVersion(resp.Items[0])}
		}
		body = printers.TableWith(res, resp.Items, lm, true, include, now)
	case n.As() == storage.KindPartialObjectMetadata:
		obj, err = storage.Metadata(resp.Items[0], custom, n.Target.GroupVersion())
	case n.As() == storage.KindPartialObjectMetadataList:
		obj, err = storage.MetadataList(resp.Items, custom, n.Target.GroupVersion(), lm)
	case n.Protobuf() && get:
		obj, err = s.Codec.DecodeServed(gvk, resp.Items[0])
	case n.Protobuf():
		obj, err = s.Codec.TypedList(gvk, resp.Items, lm)
	case get:
		body = resp.Items[0]
	case custom:
		body = encodeUnstructuredList(res, resp)
	default:
		body = encodeList(res, resp)
	}
	switch {
	case err != nil:
	case obj != nil:
		body, err = s.Codec.Encode(n.MediaType, n.Pretty, obj)
	case n.MediaType == storage.MediaJSON && !n.Pretty && !bytes.HasSuffix(body, []byte("\n")):
		// kube's JSON serializer ends a document with a newline. (A copy:
		// body may be the cache's bytes.)
		body = append(body[:len(body):len(body)], '\n')
	default:
		body, err = storage.FromJSON(n.MediaType, n.Pretty, body)
	}
	if err != nil {
		return "", nil, fmt.Errorf("encoding %s as %s: %w", res.ID(), n.MediaType, err)
	}
	return ct, body, nil
}

// WriteStatus writes an error of a resource request in the media type
// kube-apiserver writes it in (a protobuf client gets a protobuf Status, a
// YAML one YAML, one whose Accept allows no plain media type indented JSON);
// JSON, and anything that cannot be encoded otherwise, as kube.WriteStatus
// writes it.
func (s *Reads) WriteStatus(w http.ResponseWriter, r *http.Request, err error) {
	mt, pretty := s.Neg.ErrorMediaType(r)
	switch {
	case mt == storage.MediaJSON && !pretty:
		kube.WriteStatus(w, err)
		return
	case mt == "":
		kube.WriteRawStatus(w, err)
		return
	}
	st := kube.StatusOf(err)
	b, encErr := s.Codec.Encode(mt, pretty, &st)
	if encErr != nil {
		kube.WriteStatus(w, err)
		return
	}
	if st.Details != nil && st.Details.RetryAfterSeconds > 0 {
		w.Header().Set("Retry-After", itoa(int64(st.Details.RetryAfterSeconds)))
	}
	w.Header().Set("Content-Type", mt)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(int(st.Code))
	w.Write(b)
}

// ListRequest validates a LIST or GET's options before the cache sees them.
func ListRequest(info request.Info, q url.Values) (*heraldv1.ListRequest, error) {
	prefix := info.Resource.NamespacePrefix(info.Namespace)
	if info.Name != "" {
		// A GET reads GetOptions, whose only option is resourceVersion:
		// kube-apiserver ignores a list's (limit, continue, selectors,
		// resourceVersionMatch) on it.
		req := &heraldv1.ListRequest{Resource: info.Resource.ID(), Namespace: info.Namespace, Name: info.Name, ResourceVersion: q.Get("resourceVersion")}
		if _, err := rv.PlanList(req.ResourceVersion, "", "", 0, prefix); err != nil {
			return nil, request.ListPlanError(err, req.ResourceVersion)
		}
		return req, nil
	}
	var limit int64
	if v := q.Get("limit"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return nil, apierr.BadRequest("limit must be an integer")
		}
		// kube-apiserver lists everything for a negative limit, as for none.
		limit = max(n, 0)
	}
	req := &heraldv1.ListRequest{
		Resource: info.Resource.ID(), Namespace: info.Namespace, Name: info.Name,
		ResourceVersion: q.Get("resourceVersion"), ResourceVersionMatch: q.Get("resourceVersionMatch"),
		LabelSelector: q.Get("labelSelector"), FieldSelector: q.Get("fieldSelector"),
		Limit: limit, Continue: q.Get("continue"),
	}
	// kube-apiserver's order: the parameters' syntax, their combination
	// (422), the field labels, then what its storage reads (the
	// resourceVersion, the continue token).
	sel, err := request.ParseSelector(info.Resource, info.Namespace, req.LabelSelector, req.FieldSelector)
	if err != nil {
		return nil, request.OptionError(err)
	}
	// The cache takes the selectors as parsed here (and the strings, for
	// a cache older than that).
	req.Selector = cacheclient.Selector(sel)
	if err := request.ValidateListOptions(q); err != nil {
		return nil, err
	}
	if _, err := rv.PlanList(req.ResourceVersion, req.ResourceVersionMatch, req.Continue, req.Limit, prefix); err != nil {
		return nil, request.ListPlanError(err, req.ResourceVersion)
	}
	return req, nil
}

// List serves LIST and GET from cache. In cluster mode it leaves a list
// older than the cache's window unanswered (false), for kube-apiserver; one
// at a revision etcd has compacted it answers (kube.CompactedError).
func (s *Reads) List(ctx context.Context, cache heraldv1.CacheClient, w http.ResponseWriter, r *http.Request, info request.Info, req *heraldv1.ListRequest, n negotiate.Negotiated) bool {
	resp, err := cache.List(ctx, req)
	if err != nil {
		apiErr := kube.FromGRPC(err)
		if s.Upstream && info.Name == "" && apierrors.IsResourceExpired(apiErr) && !kube.Compacted(err) {
			return false
		}
		if info.Name != "" && apierrors.IsNotFound(apiErr) {
			apiErr = apierrors.NewNotFound(schema.GroupResource{Group: info.Resource.Group, Resource: info.Resource.Plural}, info.Name)
		}
		if kube.StatusOf(apiErr).Code == http.StatusInternalServerError {
			s.Log.Error("cache LIST failed", "resource", info.Resource.ID(), "err", err)
		}
		s.WriteStatus(w, r, apiErr)
		return true
	}
	if info.Name != "" && len(resp.Items) == 0 {
		s.WriteStatus(w, r, apierrors.NewNotFound(schema.GroupResource{Group: info.Resource.Group, Resource: info.Resource.Plural}, info.Name))
		return true
	}
	ct, body, err := s.body(info, resp, n, printers.IncludeObject(r.URL.Query().Get("includeObject")), time.Now())
	if err != nil {
		if kube.StatusOf(err).Code == http.StatusInternalServerError {
			s.Log.Error("encoding a response failed", "resource", info.Resource.ID(), "err", err)
		}
		s.WriteStatus(w, r, err)
		return true
	}
	s.write(w, r, ct, body)
	return true
}

// encodeList assembles a list from the items' bytes without re-encoding
// them.
func encodeList(res *kube.Resource, resp *heraldv1.ListResponse) []byte {
	b := listBuffer(resp)
	b.WriteString(`{"kind":"`)
	b.WriteString(res.Kind)
	b.WriteString(`List","apiVersion":"`)
	b.WriteString(res.GroupVersion())
	b.WriteString(`","metadata":{"resourceVersion":"`)
	b.WriteString(strconv.FormatInt(resp.Revision, 10))
	b.WriteByte('"')
	if resp.Continue != "" {
		b.WriteString(`,"continue":"`)
		b.WriteString(resp.Continue)
		b.WriteByte('"')
	}
	if resp.RemainingItemCount != nil {
		b.WriteString(`,"remainingItemCount":`)
		b.WriteString(strconv.FormatInt(*resp.RemainingItemCount, 10))
	}
	b.WriteString(`},"items":[`)
	for i, it := range resp.Items {
		if i > 0 {
			b.WriteByte(',')
		}
		// An item as kube's JSON serializer ends it, with a newline, is
		// embedded without it, and without its TypeMeta: kube-apiserver
		// encodes the list, whose items carry no kind/apiVersion.
		it = bytes.TrimSuffix(it, []byte("\n"))
		if rest, ok := withoutTypeMeta(it); ok {
			b.WriteByte('{')
			b.Write(rest)
		} else {
			b.Write(it)
		}
	}
	b.WriteString("]}")
	return b.Bytes()
}

// listBuffer is a buffer with room for a list of resp's items.
func listBuffer(resp *heraldv1.ListResponse) *bytes.Buffer {
	size := 160
	for _, it := range resp.Items {
		size += len(it) + 1
	}
	return bytes.NewBuffer(make([]byte, 0, size))
}

// encodeUnstructuredList assembles a list of custom resources as
// kube-apiserver writes one (an unstructured.UnstructuredList, encoded as a
// map: keys sorted, "continue" always in the metadata, the items whole),
// from the items' bytes without re-encoding them.
func encodeUnstructuredList(res *kube.Resource, resp *heraldv1.ListResponse) []byte {
	b := listBuffer(resp)
	b.WriteString(`{"apiVersion":"`)
	b.WriteString(res.GroupVersion())
	b.WriteString(`","items":[`)
	for i, it := range resp.Items {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(bytes.TrimSuffix(it, []byte("\n")))
	}
	b.WriteString(`],"kind":"`)
	b.WriteString(res.Kind)
	b.WriteString(`List","metadata":{"continue":"`)
	b.WriteString(resp.Continue)
	b.WriteByte('"')
	if resp.RemainingItemCount != nil {
		b.WriteString(`,"remainingItemCount":`)
		b.WriteString(strconv.FormatInt(*resp.RemainingItemCount, 10))
	}
	b.WriteString(`,"resourceVersion":"`)
	b.WriteString(strconv.FormatInt(resp.Revision, 10))
	b.WriteString(`"}}`)
	return b.Bytes()
}

// withoutTypeMeta returns what follows the leading
// `{"kind":"…","apiVersion":"…",` that kube's JSON serializer writes first in
// an object (the object's other fields and its closing brace), so the cache's
// bytes are shared (encoded once) between GET/watch, which keep TypeMeta, and
// LIST items, which must not carry it. ok is false for anything else
// (hand-written values in another order), which is embedded unchanged.
func withoutTypeMeta(it []byte) (rest []byte, ok bool) {
	rest, ok = bytes.CutPrefix(it, []byte(`{"kind":"`))
	if !ok {
		return nil, false
	}
	i := bytes.IndexByte(rest, '"')
	if i < 0 {
		return nil, false
	}
	rest, ok = bytes.CutPrefix(rest[i+1:], []byte(`,"apiVersion":"`))
	if !ok {
		return nil, false
	}
	i = bytes.IndexByte(rest, '"')
	if i < 0 {
		return nil, false
	}
	rest = rest[i+1:]
	switch {
	case len(rest) > 1 && rest[0] == ',':
		return rest[1:], true
	case len(rest) > 0 && rest[0] == '}':
		return rest, true
	}
	return nil, false
}

func (s *Reads) write(w http.ResponseWriter, r *http.Request, contentType string, body []byte) {
	w.Header().Set("Content-Type", contentType)
	if len(body) >= s.GzipMinBytes && service.AcceptsGzip(r) {
		gz := service.GzipResponse(w)
		w.WriteHeader(http.StatusOK)
		gz.Write(body)
		gz.Close()
		return
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		w.Write(body)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// objectResourceVersion is the metadata.resourceVersion of a JSON object.
func objectResourceVersion(obj []byte) string {
	var o struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	_ = json.Unmarshal(obj, &o)
	return o.Metadata.ResourceVersion
}
