package frontdoor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/storage"
)

// Response encodings of LIST and GET, negotiated as kube-apiserver
// negotiates them (libs/storage): JSON as the cache hands it out (lists
// assembled from the items' bytes), protobuf for built-in kinds (the
// items decoded into their Go types once per response),
// PartialObjectMetadata(List) for every resource, Tables, YAML and pretty
// JSON. Watches are negotiated here too, so that a refused one costs no
// connection to a replica; fanout negotiates the forwarded Accept header
// again with the same code to choose the stream's encoding.

// custom reports whether r is a custom resource (no Go type: never
// protobuf, except its PartialObjectMetadata).
func (s *Server) custom(r *kube.Resource) bool { return !s.codec.Typed(r.GroupVersionKind()) }

// negotiate is kube-apiserver's first negotiation of a resource request,
// its router's and then its handler's: 406 before anything else about the
// request is looked at.
func (s *Server) negotiate(r *http.Request, info kube.RequestInfo) (storage.Negotiated, error) {
	custom := s.custom(info.Resource)
	if err := s.neg.Route(r, custom, info.Name == ""); err != nil {
		return storage.Negotiated{}, err
	}
	return s.neg.NegotiateOutput(r, custom)
}

// negotiateWatch is the watch's second negotiation (its stream's media
// type: a watch cannot be YAML), after its options were validated.
func (s *Server) negotiateWatch(r *http.Request, info kube.RequestInfo) error {
	_, err := s.neg.NegotiateStream(r, s.custom(info.Resource))
	return err
}

// body encodes a LIST or GET response from the cache in n: its
// Content-Type and bytes. Errors are API errors (406 for a transformation
// the response cannot take) or, for values the cache should never have
// handed out, internal ones.
func (s *Server) body(info kube.RequestInfo, resp *heraldv1.ListResponse, n storage.Negotiated, include kube.IncludeObject, now time.Time) (string, []byte, error) {
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
		body = kube.TableWith(res, resp.Items, lm, true, include, now)
	case n.As() == storage.KindPartialObjectMetadata:
		obj, err = storage.Metadata(resp.Items[0], custom, n.Target.GroupVersion())
	case n.As() == storage.KindPartialObjectMetadataList:
		obj, err = storage.MetadataList(resp.Items, custom, n.Target.GroupVersion(), lm)
	case n.Protobuf() && get:
		obj, err = s.codec.DecodeServed(gvk, resp.Items[0])
	case n.Protobuf():
		obj, err = s.codec.TypedList(gvk, resp.Items, lm)
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
		body, err = s.codec.Encode(n.MediaType, n.Pretty, obj)
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

// writeStatus writes an error of a resource request in the media type
// kube-apiserver writes it in (a protobuf client gets a protobuf Status, a
// YAML one YAML, one whose Accept allows no plain media type indented JSON);
// JSON, and anything that cannot be encoded otherwise, as kube.WriteStatus
// writes it.
func (s *Server) writeStatus(w http.ResponseWriter, r *http.Request, err error) {
	mt, pretty := s.neg.ErrorMediaType(r)
	switch {
	case mt == storage.MediaJSON && !pretty:
		kube.WriteStatus(w, err)
		return
	case mt == "":
		kube.WriteRawStatus(w, err)
		return
	}
	st := kube.StatusOf(err)
	b, encErr := s.codec.Encode(mt, pretty, &st)
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
