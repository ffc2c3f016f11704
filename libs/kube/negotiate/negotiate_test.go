package negotiate

import (
	"net/http"
	"net/http/httptest"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"herald.dev/libs/storage"
)

const (
	nonStream406 = "only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf"
	stream406    = "only the following media types are accepted: application/json;stream=watch, application/vnd.kubernetes.protobuf;stream=watch"
	pom          = "as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
	poml         = "as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
)

func request(accept, query, ua string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/api/v1/pods"+query, nil)
	if accept != "" {
		r.Header.Set("Accept", accept)
	}
	r.Header.Set("User-Agent", ua)
	return r
}

// The cases follow kube-apiserver's negotiation (its negotiation package
// and RequestScope restrictions): q-values and wildcards pick the clause,
// parameters restrict it, custom resources have no protobuf of their own.
func TestNegotiateOutput(t *testing.T) {
	n := NewNegotiator()
	metaV1 := func(kind string) *schema.GroupVersionKind {
		return &schema.GroupVersionKind{Group: "meta.k8s.io", Version: "v1", Kind: kind}
	}
	cases := []struct {
		name, accept, query, ua string
		custom                  bool
		mt                      string
		pretty                  bool
		target                  *schema.GroupVersionKind
		err                     string // the 406 message
	}{
		{name: "no accept", mt: storage.MediaJSON},
		{name: "any", accept: "*/*", mt: storage.MediaJSON},
		{name: "application wildcard", accept: "application/*", mt: storage.MediaJSON},
		{name: "protobuf", accept: storage.MediaProtobuf, mt: storage.MediaProtobuf},
		{name: "protobuf then json", accept: "application/vnd.kubernetes.protobuf, application/json", mt: storage.MediaProtobuf},
		{name: "q-values", accept: "application/json;q=0.5, application/vnd.kubernetes.protobuf", mt: storage.MediaProtobuf},
		{name: "q-values json", accept: "application/vnd.kubernetes.protobuf;q=0.5, application/json", mt: storage.MediaJSON},
		{name: "yaml", accept: "application/yaml", mt: storage.MediaYAML},
		{name: "unknown parameter", accept: "application/json;foo=bar", mt: storage.MediaJSON},
		{name: "stream parameter", accept: "application/json;stream=watch", mt: storage.MediaJSON},
		{name: "stream parameter on yaml", accept: "application/yaml;stream=watch", err: nonStream406},
		{name: "other stream", accept: "application/json;stream=other", err: nonStream406},
		{name: "server version", accept: "application/json;sv=v1", mt: storage.MediaJSON},
		{name: "other server version", accept: "application/json;sv=v2", err: nonStream406},
		{name: "html", accept: "text/html", err: nonStream406},
		{name: "pretty parameter", accept: "application/json;pretty=1", mt: storage.MediaJSON, pretty: true},
		{name: "pretty query", query: "?pretty=true", mt: storage.MediaJSON, pretty: true},
		{name: "pretty false", query: "?pretty=false", ua: "curl/8", mt: storage.MediaJSON},
		{name: "curl", ua: "curl/8.0", mt: storage.MediaJSON, pretty: true},
		{name: "curl protobuf", accept: storage.MediaProtobuf, ua: "curl/8.0", mt: storage.MediaProtobuf},
		{name: "kubectl", ua: "kubectl/v1.32", mt: storage.MediaJSON},
		{name: "metadata", accept: "application/json;" + pom, mt: storage.MediaJSON, target: metaV1(storage.KindPartialObjectMetadata)},
		{name: "metadata v1beta1", accept: "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1beta1", mt: storage.MediaJSON,
			target: &schema.GroupVersionKind{Group: "meta.k8s.io", Version: "v1beta1", Kind: storage.KindPartialObjectMetadataList}},
		{name: "metadata protobuf", accept: "application/vnd.kubernetes.protobuf;" + poml + ",application/json;" + poml + ",application/json",
			mt: storage.MediaProtobuf, target: metaV1(storage.KindPartialObjectMetadataList)},
		{name: "metadata without group", accept: "application/json;as=PartialObjectMetadata;v=v1", err: nonStream406},
		{name: "metadata in another version", accept: "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v2", err: nonStream406},
		{name: "unknown kind", accept: "application/json;as=Foo;g=meta.k8s.io;v=v1", err: nonStream406},
		{name: "table", accept: "application/json;as=Table;v=v1;g=meta.k8s.io,application/json", mt: storage.MediaJSON, target: metaV1(storage.KindTable)},
		{name: "table yaml", accept: "application/yaml;as=Table;v=v1;g=meta.k8s.io", mt: storage.MediaYAML, target: metaV1(storage.KindTable)},
		{name: "table protobuf", accept: "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io", err: nonStream406},
		{name: "table protobuf falls back", accept: "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io,application/json", mt: storage.MediaJSON},
		{name: "custom protobuf", accept: storage.MediaProtobuf, custom: true, err: nonStream406},
		{name: "custom protobuf then json", accept: "application/vnd.kubernetes.protobuf,application/json", custom: true, mt: storage.MediaJSON},
		{name: "custom any", accept: "*/*", custom: true, mt: storage.MediaJSON},
		{name: "custom metadata protobuf", accept: "application/vnd.kubernetes.protobuf;" + pom, custom: true, mt: storage.MediaProtobuf,
			target: metaV1(storage.KindPartialObjectMetadata)},
		{name: "custom yaml", accept: "application/yaml", custom: true, mt: storage.MediaYAML},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := n.NegotiateOutput(request(tc.accept, tc.query, tc.ua), tc.custom)
			if tc.err != "" {
				if !apierrors.IsNotAcceptable(err) || err.Error() != tc.err {
					t.Fatalf("got %+v, %v; want 406 %q", got, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.MediaType != tc.mt || got.Pretty != tc.pretty || (got.Target == nil) != (tc.target == nil) ||
				(got.Target != nil && *got.Target != *tc.target) {
				t.Fatalf("got %+v (target %v), want %s pretty=%v target %v", got, got.Target, tc.mt, tc.pretty, tc.target)
			}
		})
	}
}

// A watch is negotiated twice: its first acceptable clause must have a
// streaming form.
func TestNegotiateWatch(t *testing.T) {
	n := NewNegotiator()
	cases := []struct {
		accept string
		custom bool
		mt     string
		as     string
		err    string
	}{
		{accept: "", mt: storage.MediaJSON},
		{accept: storage.MediaProtobuf, mt: storage.MediaProtobuf},
		{accept: "application/vnd.kubernetes.protobuf, application/json", mt: storage.MediaProtobuf},
		{accept: "application/yaml", err: stream406},
		{accept: "application/yaml, application/json", err: stream406},
		{accept: "application/json;" + pom, mt: storage.MediaJSON, as: storage.KindPartialObjectMetadata},
		{accept: "application/vnd.kubernetes.protobuf;" + pom, custom: true, mt: storage.MediaProtobuf, as: storage.KindPartialObjectMetadata},
		{accept: storage.MediaProtobuf, custom: true, err: stream406},
		{accept: "text/plain", err: stream406},
	}
	for _, tc := range cases {
		got, err := n.NegotiateWatch(request(tc.accept, "", "curl/8"), tc.custom)
		if tc.err != "" {
			if !apierrors.IsNotAcceptable(err) || err.Error() != tc.err {
				t.Errorf("%q: got %+v, %v; want 406 %q", tc.accept, got, err, tc.err)
			}
			continue
		}
		if err != nil || got.MediaType != tc.mt || got.As() != tc.as || got.Pretty {
			t.Errorf("%q: got %+v, %v; want %s as %q", tc.accept, got, err, tc.mt, tc.as)
		}
	}
}

func TestCheckTarget(t *testing.T) {
	as := func(kind string) Negotiated {
		return Negotiated{MediaType: storage.MediaJSON, Target: &schema.GroupVersionKind{Group: "meta.k8s.io", Version: "v1", Kind: kind}}
	}
	pods := schema.GroupKind{Kind: "Pod"}
	deploy := schema.GroupKind{Group: "apps", Kind: "Deployment"}
	events := schema.GroupKind{Group: "events.k8s.io", Kind: "Event"}
	widgets := schema.GroupKind{Group: "example.com", Kind: "Widget"}
	cases := []struct {
		n      Negotiated
		kind   schema.GroupKind
		custom bool
		list   bool
		err    string
	}{
		{n: as(storage.KindPartialObjectMetadata), kind: pods, list: false},
		{n: as(storage.KindPartialObjectMetadataList), kind: pods, list: true},
		{n: as(storage.KindTable), kind: pods, list: true},
		{n: Negotiated{MediaType: storage.MediaJSON}, kind: pods, list: true},
		{n: as(storage.KindPartialObjectMetadata), kind: pods, list: true,
			err: "you requested PartialObjectMetadata, but the requested object is a list (*core.PodList)"},
		{n: as(storage.KindPartialObjectMetadataList), kind: deploy,
			err: "you requested PartialObjectMetadataList, but the requested object is not a list (*apps.Deployment)"},
		{n: as(storage.KindPartialObjectMetadata), kind: events, list: true,
			err: "you requested PartialObjectMetadata, but the requested object is a list (*core.EventList)"},
		{n: as(storage.KindPartialObjectMetadata), kind: widgets, custom: true, list: true,
			err: "you requested PartialObjectMetadata, but the requested object is a list (*unstructured.UnstructuredList)"},
		{n: as(storage.KindPartialObjectMetadataList), kind: widgets, custom: true,
			err: "you requested PartialObjectMetadataList, but the requested object is not a list (*unstructured.Unstructured)"},
	}
	for _, tc := range cases {
		err := tc.n.CheckTarget(tc.kind, tc.custom, tc.list)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%v %s list=%v: %v", tc.kind, tc.n.As(), tc.list, err)
		case tc.err != "" && (!apierrors.IsNotAcceptable(err) || err.Error() != tc.err):
			t.Errorf("%v %s list=%v: got %v, want 406 %q", tc.kind, tc.n.As(), tc.list, err, tc.err)
		}
	}
}

// The router's check before a built-in resource's handler: the messages
// kube-apiserver v1.37 answers with.
func TestRoute(t *testing.T) {
	n := NewNegotiator()
	const named = "406: Not Acceptable\n\nAvailable representations: application/json, application/yaml, application/vnd.kubernetes.protobuf"
	const collection = named + ", application/json;stream=watch, application/vnd.kubernetes.protobuf;stream=watch"
	for _, tc := range []struct {
		accept             string
		custom, collection bool
		err                string
	}{
		{accept: ""},
		{accept: "*/*;q=0.1"},
		{accept: "text/html, application/json;as=Foo"},
		{accept: " application/vnd.kubernetes.protobuf ;stream=watch"},
		{accept: "text/html", err: named},
		{accept: "application/*", collection: true, err: collection},
		{accept: "text/html", custom: true},
	} {
		err := n.Route(request(tc.accept, "", ""), tc.custom, tc.collection)
		if (tc.err == "") != (err == nil) || (err != nil && (!apierrors.IsNotAcceptable(err) || err.Error() != tc.err)) {
			t.Errorf("%q custom=%v collection=%v: %v, want %q", tc.accept, tc.custom, tc.collection, err, tc.err)
		}
	}
	for accept, want := range map[string]string{
		"":                                    storage.MediaJSON,
		"application/yaml":                    storage.MediaYAML,
		"application/vnd.kubernetes.protobuf": storage.MediaProtobuf,
		"text/html":                           "",
		"application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1":                                         "",
		"application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json": storage.MediaJSON,
	} {
		if got, pretty := n.ErrorMediaType(request(accept, "", "")); got != want || pretty {
			t.Errorf("error media type for %q: %s (pretty %v), want %s", accept, got, pretty, want)
		}
	}
	// Pretty as kube-apiserver's errors are: asked for, or curl's.
	for _, tc := range []struct {
		r      *http.Request
		mt     string
		pretty bool
	}{
		{request("", "", "curl/8.5.0"), storage.MediaJSON, true},
		{request("", "?pretty=true", ""), storage.MediaJSON, true},
		{request("", "?pretty=false", "curl/8.5.0"), storage.MediaJSON, false},
		{request("application/vnd.kubernetes.protobuf", "?pretty=true", ""), storage.MediaProtobuf, false},
	} {
		if mt, pretty := n.ErrorMediaType(tc.r); mt != tc.mt || pretty != tc.pretty {
			t.Errorf("error media type for %v: %s (pretty %v), want %s (%v)", tc.r.URL, mt, pretty, tc.mt, tc.pretty)
		}
	}
}

// FuzzNegotiate: any Accept header and query negotiate without a panic,
// to a served media type or a 406.
func FuzzNegotiate(f *testing.F) {
	for _, s := range []string{"", "*/*", "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json",
		"application/vnd.kubernetes.protobuf;q=0.5;stream=watch", ";;,,;=", "a/b;q=x;as", "application/yaml;q=1e999"} {
		f.Add(s, "pretty=1", true)
	}
	n := NewNegotiator()
	f.Fuzz(func(t *testing.T, accept, query string, custom bool) {
		r := httptest.NewRequest(http.MethodGet, "/api/v1/pods", nil)
		r.URL.RawQuery = query
		r.Header.Set("Accept", accept)
		for _, neg := range []func(*http.Request, bool) (Negotiated, error){n.NegotiateOutput, n.NegotiateWatch} {
			got, err := neg(r, custom)
			if err == nil && got.MediaType != storage.MediaJSON && got.MediaType != storage.MediaYAML && got.MediaType != storage.MediaProtobuf {
				t.Fatalf("%q: media type %q", accept, got.MediaType)
			}
			if err != nil && !apierrors.IsNotAcceptable(err) {
				t.Fatalf("%q: %v", accept, err)
			}
		}
		if err := n.Route(r, custom, true); err != nil && !apierrors.IsNotAcceptable(err) {
			t.Fatalf("%q: %v", accept, err)
		}
		_, _ = n.ErrorMediaType(r)
	})
}
