package fakeapi

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	schemaobjectmeta "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/objectmeta"
	structuralpruning "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	generatedopenapi "k8s.io/apiextensions-apiserver/pkg/generated/openapi"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/managedfields"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/kube-openapi/pkg/common"
	"k8s.io/kube-openapi/pkg/util"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// crdKind is how the API server serves one version of a custom resource: its
// structural schema (pruning, defaulting, metadata coercion), its strategies
// (apiextensions-apiserver's: preparation, validation with the schema and the
// x-kubernetes-validations rules) and the type converter of server-side apply.
type crdKind struct {
	structural      *structuralschema.Structural
	preserveUnknown bool
	strategy        crdStrategy
	statusStrategy  rest.RESTUpdateStrategy
	typeConverter   managedfields.TypeConverter
}

// crdStrategy is what the fake uses of a kind's strategy: create and update.
type crdStrategy interface {
	rest.RESTCreateStrategy
	rest.RESTUpdateStrategy
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
	status := v.Subresources != nil && v.Subresources.Status != nil
	var statusValidator apiservervalidation.SchemaValidator
	if status && props != nil && props.Properties != nil {
		if st, ok := props.Properties["status"]; ok {
			if statusValidator, _, err = apiservervalidation.NewSchemaValidator(&st); err != nil {
				return nil, err
			}
		}
	}
	strategy := newCRStrategy(gvk, crd.Spec.Scope == apiextensionsv1.NamespaceScoped, status, ck.structural, validator, statusValidator)
	ck.strategy = strategy
	ck.statusStrategy = crStatusStrategy{strategy}
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

// crdTypeConverter is the server-side apply type converter of a CRD, built as the
// crdHandler builds it (buildOpenAPIModelsForApply, through apiextensions-apiserver's
// openapi builder, whose package links the API server's storage: see crStrategy):
// each version's structural schema as an OpenAPI model named after its group,
// version and kind, with apiVersion, kind and metadata (ObjectMeta's model) added, as
// to embedded resources, beside the static models of ObjectMeta and its parts.
func crdTypeConverter(crd *apiextensionsv1.CustomResourceDefinition) (managedfields.TypeConverter, error) {
	models := staticSchemas()
	for _, v := range crd.Spec.Versions {
		model, err := versionModel(crd, v)
		if err != nil {
			return nil, err
		}
		models[modelName(crd.Spec.Group, v.Name, crd.Spec.Names.Kind)] = model
	}
	return managedfields.NewTypeConverter(models, crd.Spec.PreserveUnknownFields)
}

// versionModel is the OpenAPI model of one version of a CRD (the builder's
// buildKubeNative): an object without properties when it has no structural schema.
func versionModel(crd *apiextensionsv1.CustomResourceDefinition, v apiextensionsv1.CustomResourceDefinitionVersion) (*spec.Schema, error) {
	model := &spec.Schema{SchemaProps: spec.SchemaProps{Type: []string{"object"}}}
	if v.Schema != nil && v.Schema.OpenAPIV3Schema != nil {
		internal := &apiextensions.CustomResourceValidation{}
		if err := apiextensionsv1.Convert_v1_CustomResourceValidation_To_apiextensions_CustomResourceValidation(v.Schema, internal, nil); err != nil {
			return nil, err
		}
		if s, err := structuralschema.NewStructural(internal.OpenAPIV3Schema); err == nil && len(structuralschema.ValidateStructural(nil, s)) == 0 {
			model = s.Unfold().ToKubeOpenAPI()
			addKubeProperties(model)
			addEmbeddedProperties(model)
		}
	}
	model.AddExtension("x-kubernetes-group-version-kind", []any{map[string]any{"group": crd.Spec.Group, "version": v.Name, "kind": crd.Spec.Names.Kind}})
	return model, nil
}

// addKubeProperties adds apiVersion, kind and metadata to an object's model.
func addKubeProperties(s *spec.Schema) {
	s.SetProperty("apiVersion", *spec.StringProperty())
	s.SetProperty("kind", *spec.StringProperty())
	s.SetProperty("metadata", *spec.RefSchema(modelRef("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta")))
}

// addEmbeddedProperties gives every x-kubernetes-embedded-resource of a model its
// apiVersion, kind and metadata.
func addEmbeddedProperties(s *spec.Schema) {
	if s == nil {
		return
	}
	for k, p := range s.Properties {
		addEmbeddedProperties(&p)
		s.Properties[k] = p
	}
	if s.Items != nil {
		addEmbeddedProperties(s.Items.Schema)
	}
	if s.AdditionalProperties != nil {
		addEmbeddedProperties(s.AdditionalProperties.Schema)
	}
	if embedded, ok := s.Extensions.GetBool("x-kubernetes-embedded-resource"); ok && embedded {
		addKubeProperties(s)
	}
}

// modelName is the name of a kind's model: the group reversed, the version, the kind
// (io.k8s.api.core.v1.Pod's scheme; dev.luaop.examples.v1.Widget).
func modelName(group, version, kind string) string {
	parts := strings.Split(group, ".")
	slices.Reverse(parts)
	return strings.Join(parts, ".") + "." + version + "." + kind
}

var (
	staticOnce sync.Once
	static     map[string]*spec.Schema
)

// staticSchemas are the OpenAPI models of the meta/v1 types a custom resource's
// schema refers to (ObjectMeta and what it holds), named as the API server names
// them (io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta).
func staticSchemas() map[string]*spec.Schema {
	staticOnce.Do(func() {
		ref := func(path string) spec.Ref { return spec.MustCreateRef(modelRef(path)) }
		static = map[string]*spec.Schema{}
		for name, def := range generatedopenapi.GetOpenAPIDefinitions(ref) {
			s := def.Schema
			static[restFriendly(name)] = &s
		}
	})
	out := make(map[string]*spec.Schema, len(static))
	for k, v := range static {
		out[k] = v
	}
	return out
}

// restFriendly is a model's name as components/schemas keys it: a Go package path
// (k8s.io/apimachinery/pkg/apis/meta/v1.Time) turned around, a name already
// friendly (io.k8s....) as it is.
func restFriendly(name string) string {
	if !strings.Contains(name, "/") {
		return name
	}
	return util.ToRESTFriendlyName(name)
}

// modelRef is the reference to a model.
func modelRef(name string) string {
	return "#/components/schemas/" + common.EscapeJsonPointer(restFriendly(name))
}

// unstructuredTyper tells an unstructured object's kind from itself.
type unstructuredTyper struct{}

func (unstructuredTyper) ObjectKinds(obj runtime.Object) ([]schema.GroupVersionKind, bool, error) {
	return []schema.GroupVersionKind{obj.GetObjectKind().GroupVersionKind()}, false, nil
}

func (unstructuredTyper) Recognizes(schema.GroupVersionKind) bool { return true }
