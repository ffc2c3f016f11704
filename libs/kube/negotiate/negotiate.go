package negotiate

import (
	"fmt"
	"net/http"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1beta1 "k8s.io/apimachinery/pkg/apis/meta/v1beta1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apiserver/pkg/endpoints/handlers/negotiation"

	"herald.dev/libs/storage"
)

// Content negotiation as kube-apiserver does it for GET, LIST and WATCH of a
// resource (k8s.io/apiserver/pkg/endpoints/handlers: get.go, watch.go,
// response.go, rest.go). The matching of Accept clauses (q-values,
// wildcards, parameters) and the 406 errors are kube-apiserver's own
// negotiation package; what is written here is only the part kube-apiserver
// keeps in its RequestScope: which transformations an endpoint allows.

// Negotiated is the encoding kube-apiserver chooses for a response.
type Negotiated struct {
	// MediaType is the serializer's: storage.MediaJSON, storage.MediaYAML
	// or storage.MediaProtobuf.
	MediaType string
	// Pretty: indented JSON (the pretty parameter of the media type,
	// ?pretty=true, or a curl, Wget or browser User-Agent). Never for
	// watches, YAML or protobuf.
	Pretty bool
	// Target is the meta.k8s.io kind (Table, PartialObjectMetadata or
	// PartialObjectMetadataList, in v1 or v1beta1) the response is
	// transformed into; nil for the resource's own objects.
	Target *schema.GroupVersionKind
}

// Protobuf reports whether the response is protobuf.
func (n Negotiated) Protobuf() bool { return n.MediaType == storage.MediaProtobuf }

// As is the target kind ("" for none).
func (n Negotiated) As() string {
	if n.Target == nil {
		return ""
	}
	return n.Target.Kind
}

// restrictions is kube-apiserver's RequestScope.AllowsMediaTypeTransform,
// AllowsServerVersion and AllowsStreamSchema for one resource: custom
// resources are served as JSON and YAML only (their handler's
// StandardSerializers leave protobuf out), but any of them may be
// transformed into PartialObjectMetadata(List) in any media type, and into
// Tables in JSON and YAML (every resource has a table convertor).
type restrictions struct{ custom bool }

func (r restrictions) AllowsMediaTypeTransform(mimeType, mimeSubType string, gvk *schema.GroupVersionKind) bool {
	if gvk == nil {
		return !r.custom || mimeSubType != "vnd.kubernetes.protobuf"
	}
	if gv := gvk.GroupVersion(); gv != metav1.SchemeGroupVersion && gv != metav1beta1.SchemeGroupVersion {
		return false
	}
	switch gvk.Kind {
	case storage.KindTable:
		return mimeType == "application" && (mimeSubType == "json" || mimeSubType == "yaml")
	case storage.KindPartialObjectMetadata, storage.KindPartialObjectMetadataList:
		return true
	}
	return false
}

func (restrictions) AllowsServerVersion(v string) bool { return v == metav1.SchemeGroupVersion.Version }
func (restrictions) AllowsStreamSchema(s string) bool  { return s == "watch" }

// Negotiator negotiates response encodings. Safe for concurrent use.
type Negotiator struct {
	// codecs has the media types kube-apiserver serves resources in (its
	// codec factory's JSON, YAML and protobuf, with their pretty and
	// streaming forms); only their shape matters here, not the scheme.
	codecs runtime.NegotiatedSerializer
}

// NewNegotiator returns a negotiator.
func NewNegotiator() *Negotiator {
	return &Negotiator{codecs: serializer.NewCodecFactory(runtime.NewScheme())}
}

// NegotiateOutput chooses the encoding of a GET or LIST response of a
// resource (custom: a custom resource), or of any request's first step: a
// watch is negotiated with this first and then with NegotiateWatch. Its
// error is kube-apiserver's 406 NotAcceptable (an APIStatus).
func (n *Negotiator) NegotiateOutput(r *http.Request, custom bool) (Negotiated, error) {
	mt, info, err := negotiation.NegotiateOutputMediaType(r, n.codecs, restrictions{custom})
	if err != nil {
		return Negotiated{}, err
	}
	// The negotiation package swaps in the pretty serializer when the
	// request asks for one in any of its ways.
	pretty := info.PrettySerializer != nil && info.Serializer == info.PrettySerializer
	return Negotiated{MediaType: info.MediaType, Pretty: pretty, Target: mt.Convert}, nil
}

// NegotiateWatch chooses the encoding of a watch stream, once
// NegotiateOutput has accepted the request (kube-apiserver's
// serveWatchHandler): the first acceptable clause must have a streaming
// form (JSON or protobuf, not YAML), else 406 naming the stream media types.
func (n *Negotiator) NegotiateWatch(r *http.Request, custom bool) (Negotiated, error) {
	mt, ok := negotiation.NegotiateMediaTypeOptions(r.Header.Get("Accept"), n.codecs.SupportedMediaTypes(), restrictions{custom})
	if !ok || mt.Accepted.StreamSerializer == nil {
		_, supported := negotiation.MediaTypesForSerializer(n.codecs)
		return Negotiated{}, negotiation.NewNotAcceptableError(supported)
	}
	return Negotiated{MediaType: mt.Accepted.MediaType, Target: mt.Convert}, nil
}

// notAcceptable is kube-apiserver's handlers.errNotAcceptable: a 406 for a
// transformation the response cannot take.
type notAcceptable struct{ message string }

func (e notAcceptable) Error() string { return e.message }

func (e notAcceptable) Status() metav1.Status {
	return metav1.Status{Status: metav1.StatusFailure, Code: http.StatusNotAcceptable,
		Reason: metav1.StatusReasonNotAcceptable, Message: e.message}
}

// CheckTarget is kube-apiserver's refusal to transform a single object into
// PartialObjectMetadataList or a list into PartialObjectMetadata (a 406,
// after the object or list was read). kind is the served kind, custom
// whether it is a custom resource, list whether the response is a list
// (LIST) or an object (GET).
func (n Negotiated) CheckTarget(kind schema.GroupKind, custom, list bool) error {
	switch {
	case n.As() == storage.KindPartialObjectMetadata && list:
		return notAcceptable{fmt.Sprintf("you requested PartialObjectMetadata, but the requested object is a list (%s)", internalType(kind, custom, true))}
	case n.As() == storage.KindPartialObjectMetadataList && !list:
		return notAcceptable{fmt.Sprintf("you requested PartialObjectMetadataList, but the requested object is not a list (%s)", internalType(kind, custom, false))}
	}
	return nil
}

// internalType is the Go type (%T) kube-apiserver's storage returns for the
// resource, as its 406 messages name it: the internal version of a built-in
// kind lives in the package named after the group's first label ("core"
// for the legacy group; events.k8s.io events are stored and read as core
// Events), custom resources are unstructured.
func internalType(kind schema.GroupKind, custom, list bool) string {
	if custom {
		if list {
			return "*unstructured.UnstructuredList"
		}
		return "*unstructured.Unstructured"
	}
	pkg := kind.Group
	for i := 0; i < len(pkg); i++ {
		if pkg[i] == '.' {
			pkg = pkg[:i]
			break
		}
	}
	if pkg == "" || pkg == "events" {
		pkg = "core"
	}
	t := "*" + pkg + "." + kind.Kind
	if list {
		t += "List"
	}
	return t
}

// Route is the check kube-apiserver's HTTP router (go-restful) makes before
// a built-in resource's handler runs: some comma-separated entry of Accept,
// its parameters and quality cut off, must be "*/*" or one of the route's
// media types exactly ("application/*" is not enough). A refusal is a 406
// listing the route's media types: a collection's (LIST and WATCH) include
// the stream media types, a named object's do not. Custom resources are
// served by their own handler, which has no such check.
func (n *Negotiator) Route(r *http.Request, custom, collection bool) error {
	if custom {
		return nil
	}
	accept := r.Header.Get("Accept")
	if accept == "" {
		return nil
	}
	mediaTypes, streams := negotiation.MediaTypesForSerializer(n.codecs)
	for _, entry := range strings.Split(accept, ",") {
		mt, _, _ := strings.Cut(entry, ";")
		mt = strings.TrimSpace(mt)
		if mt == "*/*" || slices.Contains(mediaTypes, mt) {
			return nil
		}
	}
	available := mediaTypes
	if collection {
		available = append(slices.Clip(mediaTypes), streams...)
	}
	return apierrors.NewGenericServerResponse(http.StatusNotAcceptable, "", schema.GroupResource{}, "",
		"406: Not Acceptable\n\nAvailable representations: "+strings.Join(available, ", "), 0, false)
}

// ErrorMediaType is the media type kube-apiserver writes an error Status in
// (responsewriters.ErrorNegotiated): the request's negotiated media type
// without any transformation, and whether it is pretty (curl's, ?pretty);
// "" when none is acceptable (an Accept that only asks for a
// transformation, as=PartialObjectMetadata or Table), for which
// kube-apiserver writes the Status as indented JSON
// (responsewriters.WriteRawJSON).
func (n *Negotiator) ErrorMediaType(r *http.Request) (mt string, pretty bool) {
	if _, info, err := negotiation.NegotiateOutputMediaType(r, n.codecs, negotiation.DefaultEndpointRestrictions); err == nil {
		return info.MediaType, info.PrettySerializer != nil && info.Serializer == info.PrettySerializer
	}
	return "", false
}
