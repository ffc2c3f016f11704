package kube

import (
	"encoding/json"
	"fmt"

	"k8s.io/apiextensions-apiserver/pkg/apihelpers"
	apiextensionsinternal "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	schemaobjectmeta "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/objectmeta"
	structuralpruning "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Reading a custom resource from storage as kube-apiserver does. Its
// apiextensions server reads a stored custom resource through a codec
// (k8s.io/apiextensions-apiserver/pkg/apiserver/customresource_handler.go,
// v1.37: crdConversionRESTOptionsGetter) that
//  1. coerces the object to the structural schema of the version it is
//     stored in: prunes the fields the schema does not know (unless the CRD
//     preserves unknown fields), drops nulls the schema does not allow and
//     has no default for, checks the embedded TypeMeta and ObjectMeta
//     (dropping malformed metadata fields) and sets a missing generation
//     to 1;
//  2. applies that schema's defaults (structural defaulting);
//  3. converts it to the version served (the None strategy only rewrites
//     apiVersion) and coerces it to that version's schema again.
// The result depends on the object and on the CRD's schemas, so it changes
// when the CRD's schemas do, for objects stored long before: a default
// added to the schema appears on every object read afterwards, and a field
// the schema drops disappears.
//
// Herald does the same, with the same functions of apiextensions-apiserver,
// where it reads a stored value (Decoder.Decode): once per object version
// and, because a CRD whose schemas changed is a resource that reads
// differently (SameObjects), once more for every stored object of the CRD
// when they change; never per read.

// crdSchemas are a CRD's structural schemas, by version, as
// kube-apiserver serves its custom resources from them.
type crdSchemas struct {
	gk              schema.GroupKind
	byVersion       map[string]*structuralschema.Structural
	preserveUnknown bool
	// key is the schemas' identity: two CRDs with the same key read every
	// stored object the same.
	key string
}

// newCRDSchemas builds crd's structural schemas as kube-apiserver's
// apiextensions server does (a version without a schema has none). An
// error says kube-apiserver does not serve the CRD's custom resources: a
// schema that is not structural (and does not preserve unknown fields), or
// whose defaults cannot be pruned.
func newCRDSchemas(crd *apiextensionsv1.CustomResourceDefinition) (*crdSchemas, error) {
	s := &crdSchemas{
		gk:              schema.GroupKind{Group: crd.Spec.Group, Kind: crd.Status.AcceptedNames.Kind},
		byVersion:       map[string]*structuralschema.Structural{},
		preserveUnknown: crd.Spec.PreserveUnknownFields,
	}
	type versionSchema struct {
		Name   string                                    `json:"name"`
		Schema *apiextensionsv1.CustomResourceValidation `json:"schema"`
	}
	identity := struct {
		Kind            string          `json:"kind"`
		PreserveUnknown bool            `json:"preserveUnknownFields"`
		Versions        []versionSchema `json:"versions"`
	}{Kind: s.gk.Kind, PreserveUnknown: s.preserveUnknown}
	for _, v := range crd.Spec.Versions {
		val, err := apihelpers.GetSchemaForVersion(crd, v.Name)
		if err != nil {
			return nil, fmt.Errorf("version %s: %v", v.Name, err)
		}
		identity.Versions = append(identity.Versions, versionSchema{Name: v.Name, Schema: val})
		if val == nil {
			continue
		}
		internal := &apiextensionsinternal.CustomResourceValidation{}
		if err := apiextensionsv1.Convert_v1_CustomResourceValidation_To_apiextensions_CustomResourceValidation(val, internal, nil); err != nil {
			return nil, fmt.Errorf("version %s: schema: %v", v.Name, err)
		}
		st, err := structuralschema.NewStructural(internal.OpenAPIV3Schema)
		if !s.preserveUnknown {
			if err != nil {
				return nil, fmt.Errorf("version %s: the schema is not structural: %v", v.Name, err)
			}
			st = st.DeepCopy()
			if err := structuraldefaulting.PruneDefaults(st); err != nil {
				return nil, fmt.Errorf("version %s: the schema's defaults: %v", v.Name, err)
			}
		}
		s.byVersion[v.Name] = st
	}
	b, err := json.Marshal(identity)
	if err != nil {
		return nil, fmt.Errorf("schemas: %v", err)
	}
	s.key = string(b)
	return s, nil
}

// fromStorage reads u, decoded from storage in its stored version, as
// kube-apiserver's storage codec does: coerced to and defaulted from the
// stored version's schema, and, when served as another version (rewrite:
// the None conversion strategy; the caller sets the apiVersion), coerced to
// the served version's schema. It changes u in place. Without schemas (a
// resource not made from a CRD) it changes nothing.
func (s *crdSchemas) fromStorage(u *unstructured.Unstructured, served string, rewrite bool) error {
	if s == nil {
		return nil
	}
	stored := u.GroupVersionKind()
	if err := s.coerce(u, stored.Version, true); err != nil {
		return err
	}
	if stored.GroupKind() == s.gk {
		structuraldefaulting.Default(u.Object, s.byVersion[stored.Version])
	}
	if rewrite && stored.Version != served {
		return s.coerce(u, served, false)
	}
	return nil
}

// coerce is kube-apiserver's unstructuredSchemaCoercer.apply for version's
// schema: decoding (fromDecoder: drop malformed metadata fields, repair the
// generation) or after a conversion.
func (s *crdSchemas) coerce(u *unstructured.Unstructured, version string, fromDecoder bool) error {
	kind, foundKind, err := unstructured.NestedString(u.Object, "kind")
	if err != nil {
		return err
	}
	apiVersion, foundAPIVersion, err := unstructured.NestedString(u.Object, "apiVersion")
	if err != nil {
		return err
	}
	meta, foundMeta, _, err := schemaobjectmeta.GetObjectMetaWithOptions(u.Object, schemaobjectmeta.ObjectMetaOptions{DropMalformedFields: fromDecoder})
	if err != nil {
		return err
	}
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return err
	}
	if gv.Group == s.gk.Group && kind == s.gk.Kind {
		st := s.byVersion[version]
		if !s.preserveUnknown {
			structuralpruning.Prune(u.Object, st, true)
			structuraldefaulting.PruneNonNullableNullsWithoutDefaults(u.Object, st)
		}
		if ferr := schemaobjectmeta.Coerce(nil, u.Object, st, false, fromDecoder); ferr != nil {
			return ferr
		}
		if fromDecoder && meta != nil && meta.Generation == 0 {
			meta.Generation = 1
		}
	}
	if foundKind {
		u.SetKind(kind)
	}
	if foundAPIVersion {
		u.SetAPIVersion(apiVersion)
	}
	if foundMeta {
		if err := schemaobjectmeta.SetObjectMeta(u.Object, meta); err != nil {
			return err
		}
	}
	return nil
}

// sameAs reports whether s and o read every stored object the same.
func (s *crdSchemas) sameAs(o *crdSchemas) bool {
	if s == nil || o == nil {
		return s == o
	}
	return s.key == o.key
}
