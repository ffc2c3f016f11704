package kube

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/registry/customresource/tableconvertor"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/apiserver/pkg/endpoints/discovery"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/client-go/util/jsonpath"
)

// Custom resources: what Herald serves of a CustomResourceDefinition, read
// as kube-apiserver's apiextensions server reads it
// (k8s.io/apiextensions-apiserver/pkg/apiserver, v1.37):
//   - the resource is served once its names are accepted (NamesAccepted or
//     Established), under status.acceptedNames, keyed in etcd under
//     <prefix>/<group>/<plural>/, JSON;
//   - discovery lists it once Established;
//   - its field selectors are metadata.name, metadata.namespace and the
//     version's selectableFields (the JSONPath without its leading dot);
//   - its Tables have the version's additionalPrinterColumns, or Age when
//     it has none.
// Herald serves the storage version only, from objects in the storage
// version or, with the None conversion strategy, in another stored version
// (kube-apiserver only rewrites their apiVersion then). A version that needs
// a conversion webhook (strategy Webhook and objects stored in another
// version) is not served from the cache; nor are the other served versions
// (one version per resource: the cache keys resources by group and plural).

// CRDResourceID is the ID of the resource CustomResourceDefinitions are
// served as: the cache learns custom resources from its objects, and the
// custom resources live on the shard that holds them.
const CRDResourceID = "customresourcedefinitions.apiextensions.k8s.io"

// ErrInvalidCRD marks a CustomResourceDefinition Herald cannot serve
// anything of: undecodable, or invalid where Herald relies on it (names,
// scope, versions, schema, selectable fields, printer columns). Such a CRD is
// skipped, counted and logged once by the cache.
var ErrInvalidCRD = errors.New("invalid CustomResourceDefinition")

// customInfo is what a custom resource carries beyond a Resource's fields.
type customInfo struct {
	crd         string // the CRD's name, <plural>.<group>
	established bool   // listed in discovery
	// storageVersionHash as kube-apiserver's discovery computes it.
	storageVersionHash string
	// columns: the Table columns (additionalPrinterColumns, or Age).
	columns []apiextensionsv1.CustomResourceColumnDefinition
	// table renders columns (k8s.io/apiextensions-apiserver's own table
	// convertor, as kube-apiserver renders custom resources).
	table rest.TableConvertor
	// rewriteVersion: objects stored in another version of the kind are
	// served with their apiVersion rewritten (conversion strategy None).
	rewriteVersion bool
	// warning is the Warning header of every request for the version, if
	// the CRD deprecates it.
	warning string
	// schemas: how stored objects read (crdschema.go).
	schemas *crdSchemas
}

// SameObjects reports whether objects of custom resource a read and serve
// exactly as objects of b: same resource, version, kind, scope, key and
// selectable fields, and the schemas stored objects are read with
// (discovery and Table columns aside).
func SameObjects(a, b *Resource) bool {
	if a.custom == nil || b.custom == nil {
		return a == b
	}
	return a.ID() == b.ID() && a.Version == b.Version && a.Kind == b.Kind && a.Namespaced == b.Namespaced &&
		a.Key == b.Key && slices.Equal(a.Fields, b.Fields) && a.custom.rewriteVersion == b.custom.rewriteVersion &&
		a.custom.schemas.sameAs(b.custom.schemas)
}

// sameResource reports whether a and b (completed resources) serve the
// same: equal in everything but their table convertors, which are made
// from their columns, and their schemas, compared by identity.
func sameResource(a, b *Resource) bool {
	ac, bc := *a, *b
	if a.custom != nil && b.custom != nil {
		if !a.custom.schemas.sameAs(b.custom.schemas) {
			return false
		}
		aci, bci := *a.custom, *b.custom
		aci.table, bci.table = nil, nil
		aci.schemas, bci.schemas = nil, nil
		ac.custom, bc.custom = &aci, &bci
	}
	return reflect.DeepEqual(&ac, &bc)
}

// Custom reports whether r is a custom resource learned from a CRD.
func (r *Resource) Custom() bool { return r.custom != nil }

// TableConvertor renders a custom resource's Table from its CRD's printer
// columns (k8s.io/apiextensions-apiserver's own table convertor, as
// kube-apiserver renders custom resources); nil for the others.
func (r *Resource) TableConvertor() rest.TableConvertor {
	if r.custom == nil {
		return nil
	}
	return r.custom.table
}

// Discoverable reports whether discovery lists r: a custom resource once
// its CRD is Established, every other resource always.
func (r *Resource) Discoverable() bool { return r.custom == nil || r.custom.established }

// CRDName is the name of the CRD that defines r ("" for other resources).
func (r *Resource) CRDName() string {
	if r.custom == nil {
		return ""
	}
	return r.custom.crd
}

// CustomResources reads a CustomResourceDefinition as served
// (apiextensions.k8s.io/v1 JSON) and returns the CRD's name and the
// resource Herald serves of it: none while its names are not accepted, or
// when its storage version is not served or needs a conversion webhook. An
// error wraps ErrInvalidCRD.
func CustomResources(crdJSON []byte) (string, []Resource, error) {
	var crd apiextensionsv1.CustomResourceDefinition
	if err := json.Unmarshal(crdJSON, &crd); err != nil {
		return "", nil, fmt.Errorf("%w: %v", ErrInvalidCRD, err)
	}
	invalid := func(format string, args ...any) (string, []Resource, error) {
		return crd.Name, nil, fmt.Errorf("%w %s: %s", ErrInvalidCRD, crd.Name, fmt.Sprintf(format, args...))
	}
	spec := &crd.Spec
	if crd.Name == "" {
		return invalid("no name")
	}
	if msgs := validation.IsDNS1123Subdomain(spec.Group); len(msgs) > 0 || !strings.Contains(spec.Group, ".") {
		return invalid("group %q must be a DNS subdomain with at least one dot", spec.Group)
	}
	if crd.Name != spec.Names.Plural+"."+spec.Group {
		return invalid("name must be spec.names.plural.spec.group")
	}
	if spec.Scope != apiextensionsv1.NamespaceScoped && spec.Scope != apiextensionsv1.ClusterScoped {
		return invalid("scope %q", spec.Scope)
	}
	var storage *apiextensionsv1.CustomResourceDefinitionVersion
	for i := range spec.Versions {
		v := &spec.Versions[i]
		if msgs := validation.IsDNS1035Label(v.Name); len(msgs) > 0 {
			return invalid("version %q: %s", v.Name, strings.Join(msgs, "; "))
		}
		if v.Storage {
			if storage != nil {
				return invalid("more than one storage version")
			}
			storage = v
		}
	}
	if storage == nil {
		return invalid("no storage version")
	}
	fields, err := selectableFields(storage.SelectableFields)
	if err != nil {
		return invalid("version %s: %v", storage.Name, err)
	}
	columns := storage.AdditionalPrinterColumns
	if len(columns) == 0 {
		// kube-apiserver's default: the age, from the creation timestamp.
		columns = []apiextensionsv1.CustomResourceColumnDefinition{{Name: "Age", Type: "date", JSONPath: ".metadata.creationTimestamp",
			Description: metav1.ObjectMeta{}.SwaggerDoc()["creationTimestamp"]}}
	}
	table, err := tableconvertor.New(columns)
	if err != nil {
		return invalid("version %s: printer columns: %v", storage.Name, err)
	}
	// A CRD made through v1beta1 before 1.22 may have no schema, or a
	// non-structural one without a root type: kube-apiserver still serves
	// it. A root of another type never validates an object.
	if s := storage.Schema; s != nil && s.OpenAPIV3Schema != nil && s.OpenAPIV3Schema.Type != "object" && s.OpenAPIV3Schema.Type != "" {
		return invalid("version %s: its schema's root is a %s, not an object", storage.Name, s.OpenAPIV3Schema.Type)
	}
	names := crd.Status.AcceptedNames
	if names.Plural == "" || !condition(&crd, apiextensionsv1.NamesAccepted) && !condition(&crd, apiextensionsv1.Established) {
		return crd.Name, nil, nil // not served by kube-apiserver yet
	}
	if msgs := validation.IsDNS1123Label(names.Plural); len(msgs) > 0 || names.Kind == "" {
		return invalid("accepted names: plural %q, kind %q", names.Plural, names.Kind)
	}
	if !storage.Served {
		return crd.Name, nil, nil
	}
	schemas, err := newCRDSchemas(&crd)
	if err != nil {
		return invalid("%v", err)
	}
	webhook := spec.Conversion != nil && spec.Conversion.Strategy == apiextensionsv1.WebhookConverter
	if webhook {
		for _, v := range crd.Status.StoredVersions {
			if v != storage.Name {
				// Objects may be stored in another version: only the
				// webhook can convert them.
				return crd.Name, nil, nil
			}
		}
	}
	r := Resource{
		Group: spec.Group, Version: storage.Name, Kind: names.Kind, Plural: names.Plural, Singular: names.Singular,
		ShortNames: names.ShortNames, Categories: names.Categories, Namespaced: spec.Scope == apiextensionsv1.NamespaceScoped,
		Key: spec.Group + "/" + names.Plural, Fields: fields,
		custom: &customInfo{
			crd: crd.Name, established: condition(&crd, apiextensionsv1.Established),
			storageVersionHash: discovery.StorageVersionHash(spec.Group, storage.Name, names.Kind),
			columns:            columns, table: table, rewriteVersion: !webhook,
			warning: deprecationWarning(storage, spec),
			schemas: schemas,
		},
	}
	return crd.Name, []Resource{r}, nil
}

// Warning is the Warning header kube-apiserver adds to every request for a
// custom resource whose version its CRD deprecates (the CRD's
// deprecationWarning, or kube-apiserver's default text); "" for the others.
func (r *Resource) Warning() string {
	if r.custom == nil {
		return ""
	}
	return r.custom.warning
}

// deprecationWarning is the Warning header of requests for version v of
// spec's kind, as apiextensions-apiserver words it: the CRD's
// deprecationWarning, or "<group>/<version> <Kind> is deprecated" and the
// newest served version that is not, if one is newer; "" if v is not
// deprecated (or its warning is empty).
func deprecationWarning(v *apiextensionsv1.CustomResourceDefinitionVersion, spec *apiextensionsv1.CustomResourceDefinitionSpec) string {
	if !v.Deprecated {
		return ""
	}
	var msg string
	if v.DeprecationWarning != nil {
		msg = *v.DeprecationWarning
	} else {
		msg = fmt.Sprintf("%s/%s %s is deprecated", spec.Group, v.Name, spec.Names.Kind)
		var newest string
		for _, o := range spec.Versions {
			if o.Served && !o.Deprecated && version.CompareKubeAwareVersionStrings(v.Name, o.Name) < 0 &&
				(newest == "" || version.CompareKubeAwareVersionStrings(o.Name, newest) > 0) {
				newest = o.Name
			}
		}
		if newest != "" {
			msg += fmt.Sprintf("; use %s/%s %s", spec.Group, newest, spec.Names.Kind)
		}
	}
	if msg == "" {
		return ""
	}
	h, err := utilnet.NewWarningHeader(299, "-", msg)
	if err != nil {
		return ""
	}
	return h
}

func condition(crd *apiextensionsv1.CustomResourceDefinition, t apiextensionsv1.CustomResourceDefinitionConditionType) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == t {
			return c.Status == apiextensionsv1.ConditionTrue
		}
	}
	return false
}

// selectableFields are a version's selectableFields as field labels: the
// JSONPath without its leading dot, which must be a simple path
// (kube-apiserver's validation allows nothing else).
func selectableFields(sfs []apiextensionsv1.SelectableField) ([]Field, error) {
	out := make([]Field, 0, len(sfs))
	for _, sf := range sfs {
		name, ok := strings.CutPrefix(sf.JSONPath, ".")
		if !ok || name == "" {
			return nil, fmt.Errorf("selectable field %q: not a path", sf.JSONPath)
		}
		for _, seg := range strings.Split(name, ".") {
			if seg == "" || strings.ContainsAny(seg, "[]*'\"\\ ") {
				return nil, fmt.Errorf("selectable field %q: not a simple path", sf.JSONPath)
			}
		}
		if err := jsonpath.New("selectableField").Parse("{" + sf.JSONPath + "}"); err != nil {
			return nil, fmt.Errorf("selectable field %q: %v", sf.JSONPath, err)
		}
		out = append(out, Field{Name: name})
	}
	return out, nil
}
