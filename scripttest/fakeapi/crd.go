package fakeapi

import (
	"errors"
	"fmt"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	schemaobjectmeta "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/objectmeta"
	structuralpruning "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/managedfields"
)

// crdKind is how the API server serves one version of a custom resource: its
// structural schema (pruning, defaulting, metadata coercion), its strategy
// (preparation, validation with the schema and the x-kubernetes-validations rules:
// crdstrategy.go) and the type converter of server-side apply (crdopenapi.go).
type crdKind struct {
	structural      *structuralschema.Structural
	preserveUnknown bool
	strategy        customResourceStrategy
	typeConverter   managedfields.TypeConverter
}

// addCRD makes the server serve every served version of crd, as the API server's
// crdHandler builds its serving info (getOrCreateServingInfoFor).
func (s *Server) addCRD(crd *apiextensionsv1.CustomResourceDefinition) error {
	s.crdGroupKinds[schema.GroupKind{Group: crd.Spec.Group, Kind: crd.Spec.Names.Kind}] = true
	typeConverter, err := crdTypeConverter(crd)
	if err != nil {
		return fmt.Errorf("CRD %s: %w", crd.Name, err)
	}
	for _, v := range crd.Spec.Versions {
		if !v.Served {
			continue
		}
		gvk := schema.GroupVersionKind{Group: crd.Spec.Group, Version: v.Name, Kind: crd.Spec.Names.Kind}
		ck, err := newCRDKind(crd, v, gvk, typeConverter)
		if err != nil {
			return fmt.Errorf("CRD %s, version %s: %w", crd.Name, v.Name, err)
		}
		s.kinds[gvk] = &kind{gvk: gvk, plural: crd.Spec.Names.Plural, namespaced: crd.Spec.Scope == apiextensionsv1.NamespaceScoped,
			status: v.Subresources != nil && v.Subresources.Status != nil, crd: ck}
	}
	return nil
}

func newCRDKind(crd *apiextensionsv1.CustomResourceDefinition, v apiextensionsv1.CustomResourceDefinitionVersion, gvk schema.GroupVersionKind, tc managedfields.TypeConverter) (*crdKind, error) {
	ck := &crdKind{preserveUnknown: crd.Spec.PreserveUnknownFields, typeConverter: tc}
	var internal *apiextensions.CustomResourceValidation
	if v.Schema != nil {
		internal = &apiextensions.CustomResourceValidation{}
		if err := apiextensionsv1.Convert_v1_CustomResourceValidation_To_apiextensions_CustomResourceValidation(v.Schema, internal, nil); err != nil {
			return nil, err
		}
	}
	var props *apiextensions.JSONSchemaProps
	if internal != nil {
		props = internal.OpenAPIV3Schema
		s, err := structuralschema.NewStructural(props)
		if err != nil && !ck.preserveUnknown {
			return nil, fmt.Errorf("its schema is not structural: %w", err)
		}
		if s != nil {
			s = s.DeepCopy()
			if err := structuraldefaulting.PruneDefaults(s); err != nil {
				return nil, err
			}
		}
		ck.structural = s
	}
	validator, _, err := apiservervalidation.NewSchemaValidator(props)
	if err != nil {
		return nil, err
	}
	var statusSpec *apiextensions.CustomResourceSubresourceStatus
	var statusValidator apiservervalidation.SchemaValidator
	if v.Subresources != nil && v.Subresources.Status != nil {
		statusSpec = &apiextensions.CustomResourceSubresourceStatus{}
		if props != nil && props.Properties != nil {
			if st, ok := props.Properties["status"]; ok {
				if statusValidator, _, err = apiservervalidation.NewSchemaValidator(&st); err != nil {
					return nil, err
				}
			}
		}
	}
	var scaleSpec *apiextensions.CustomResourceSubresourceScale
	if v.Subresources != nil && v.Subresources.Scale != nil {
		scaleSpec = &apiextensions.CustomResourceSubresourceScale{}
		if err := apiextensionsv1.Convert_v1_CustomResourceSubresourceScale_To_apiextensions_CustomResourceSubresourceScale(v.Subresources.Scale, scaleSpec, nil); err != nil {
			return nil, err
		}
	}
	ck.strategy = newCustomResourceStrategy(crd.Spec.Scope == apiextensionsv1.NamespaceScoped, gvk,
		validator, statusValidator, ck.structural, statusSpec, scaleSpec)
	return ck, nil
}

// coerce is what the API server's decoder does to a custom resource it reads from a
// request (the crdHandler's unstructuredSchemaCoercer, then its defaulter): unknown
// fields pruned, non-nullable nulls dropped, metadata coerced, defaults filled in.
// It returns the paths of the fields it pruned.
func (ck *crdKind) coerce(u *unstructured.Unstructured) ([]string, error) {
	if ck.structural == nil {
		return nil, nil
	}
	var pruned []string
	if !ck.preserveUnknown {
		pruned = structuralpruning.PruneWithOptions(u.Object, ck.structural, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true})
		structuraldefaulting.PruneNonNullableNullsWithoutDefaults(u.Object, ck.structural)
	}
	if err, _ := schemaobjectmeta.CoerceWithOptions(nil, u.Object, ck.structural, false, schemaobjectmeta.CoerceOptions{}); err != nil {
		return pruned, errors.New(err.Error())
	}
	structuraldefaulting.Default(u.Object, ck.structural)
	return pruned, nil
}

// unstructuredTyper tells an unstructured object's kind from itself.
type unstructuredTyper struct{}

func (unstructuredTyper) ObjectKinds(obj runtime.Object) ([]schema.GroupVersionKind, bool, error) {
	return []schema.GroupVersionKind{obj.GetObjectKind().GroupVersionKind()}, false, nil
}

func (unstructuredTyper) Recognizes(schema.GroupVersionKind) bool { return true }
