package fakeapi

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	generatedopenapi "k8s.io/apiextensions-apiserver/pkg/generated/openapi"
	metav1beta1 "k8s.io/apimachinery/pkg/apis/meta/v1beta1"
	"k8s.io/apimachinery/pkg/util/managedfields"
	builderutil "k8s.io/kube-openapi/pkg/builder3/util"
	"k8s.io/kube-openapi/pkg/common"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// crdTypeConverter is the server-side apply type converter of a CRD, built from
// the OpenAPI models the crdHandler builds it from (buildOpenAPIModelsForApply,
// with apiextensions-apiserver's controller/openapi/builder: BuildOpenAPIV3 of
// every version, merged): each version's model, and the models of ObjectMeta and
// what it holds. That builder goes through the API server's route installer (and
// so links its storage, etcd's client and grpc), so the models are built here as
// it builds them; the routes' other models (lists, Status, DeleteOptions, Scale)
// are left out: they do not take part in applying a custom resource.
func crdTypeConverter(crd *apiextensionsv1.CustomResourceDefinition) (managedfields.TypeConverter, error) {
	models := metaModels()
	for _, v := range crd.Spec.Versions {
		s, err := crdVersionModel(crd, v)
		if err != nil {
			return nil, err
		}
		models[common.EscapeJsonPointer(gvkToModelName(crd.Spec.Group, v.Name, crd.Spec.Names.Kind))] = s
	}
	return managedfields.NewTypeConverter(models, crd.Spec.PreserveUnknownFields)
}

const (
	objectMetaModel = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
	typeMetaModel   = "io.k8s.apimachinery.pkg.apis.meta.v1.TypeMeta"
	// gvkExtension names the kinds a model is the schema of.
	gvkExtension = "x-kubernetes-group-version-kind"
)

// crdVersionModel is the OpenAPI model of one version of crd, as the builder's
// buildKubeNative makes it: the structural schema, unfolded, as OpenAPI, with
// apiVersion, kind and metadata (a reference to ObjectMeta) at the root and in
// every embedded resource, and the version's group, version and kind. A version
// without a schema, or whose schema is not structural, is a bare object.
func crdVersionModel(crd *apiextensionsv1.CustomResourceDefinition, v apiextensionsv1.CustomResourceDefinitionVersion) (*spec.Schema, error) {
	structural, err := applySchema(v.Schema)
	if err != nil {
		return nil, fmt.Errorf("version %s: %w", v.Name, err)
	}
	ret := &spec.Schema{SchemaProps: spec.SchemaProps{Type: []string{"object"}}}
	if structural != nil {
		ret = structural.ToKubeOpenAPI()
		ret.SetProperty("metadata", metadataProperty())
		setTypeMetaProperties(ret)
		addEmbeddedProperties(ret)
	}
	ret.AddExtension(gvkExtension, []any{map[string]any{"group": crd.Spec.Group, "version": v.Name, "kind": crd.Spec.Names.Kind}})
	// As builder3 stores every model: a reference with siblings is wrapped in allOf.
	return builderutil.WrapRefs(ret), nil
}

// applySchema is the structural schema the builder starts from (generateBuilder):
// nil when there is none, when it has a type OpenAPI v3 does not know, or when it
// is not structural.
func applySchema(v *apiextensionsv1.CustomResourceValidation) (*structuralschema.Structural, error) {
	if v == nil || v.OpenAPIV3Schema == nil {
		return nil, nil
	}
	internal := &apiextensions.CustomResourceValidation{}
	if err := apiextensionsv1.Convert_v1_CustomResourceValidation_To_apiextensions_CustomResourceValidation(v, internal, nil); err != nil {
		return nil, fmt.Errorf("failed converting CRD validation to internal version: %w", err)
	}
	if schemaHasInvalidTypes(internal.OpenAPIV3Schema) {
		return nil, nil
	}
	s, err := structuralschema.NewStructural(internal.OpenAPIV3Schema)
	if err != nil || len(structuralschema.ValidateStructural(nil, s)) > 0 {
		return nil, nil
	}
	return s.Unfold(), nil
}

// openAPIV3Types are the types a schema may name (apiextensions validation's).
var openAPIV3Types = []string{"string", "number", "integer", "boolean", "array", "object"}

// schemaHasInvalidTypes tells whether s or a schema in it names a type OpenAPI v3
// does not know (apiextensions validation's SchemaHasInvalidTypes).
func schemaHasInvalidTypes(s *apiextensions.JSONSchemaProps) bool {
	if s == nil {
		return false
	}
	if s.Type != "" && !slices.Contains(openAPIV3Types, s.Type) {
		return true
	}
	var nested []*apiextensions.JSONSchemaProps
	if s.Items != nil {
		nested = append(nested, s.Items.Schema)
		for i := range s.Items.JSONSchemas {
			nested = append(nested, &s.Items.JSONSchemas[i])
		}
	}
	for _, list := range [][]apiextensions.JSONSchemaProps{s.AllOf, s.AnyOf, s.OneOf} {
		for i := range list {
			nested = append(nested, &list[i])
		}
	}
	nested = append(nested, s.Not)
	for _, m := range []map[string]apiextensions.JSONSchemaProps{s.Properties, s.PatternProperties, s.Definitions} {
		for _, p := range m {
			nested = append(nested, &p)
		}
	}
	if s.AdditionalProperties != nil {
		nested = append(nested, s.AdditionalProperties.Schema)
	}
	if s.AdditionalItems != nil {
		nested = append(nested, s.AdditionalItems.Schema)
	}
	for _, d := range s.Dependencies {
		nested = append(nested, d.Schema)
	}
	return slices.ContainsFunc(nested, schemaHasInvalidTypes)
}

// metadataProperty is the metadata of an object: a reference to ObjectMeta, with
// PartialObjectMetadata's description.
func metadataProperty() spec.Schema {
	return *spec.RefSchema(modelRef(objectMetaModel)).WithDescription(metav1beta1.PartialObjectMetadata{}.SwaggerDoc()["metadata"])
}

// setTypeMetaProperties sets apiVersion and kind as TypeMeta has them.
func setTypeMetaProperties(s *spec.Schema) {
	tm := typeMeta()
	s.SetProperty("apiVersion", tm.Properties["apiVersion"])
	s.SetProperty("kind", tm.Properties["kind"])
}

// addEmbeddedProperties gives every x-kubernetes-embedded-resource in s apiVersion,
// kind and metadata, the first two required.
func addEmbeddedProperties(s *spec.Schema) {
	if s == nil {
		return
	}
	for k := range s.Properties {
		v := s.Properties[k]
		addEmbeddedProperties(&v)
		s.Properties[k] = v
	}
	if s.Items != nil {
		addEmbeddedProperties(s.Items.Schema)
	}
	if s.AdditionalProperties != nil {
		addEmbeddedProperties(s.AdditionalProperties.Schema)
	}
	if embedded, ok := s.Extensions.GetBool("x-kubernetes-embedded-resource"); !ok || !embedded {
		return
	}
	tm := typeMeta()
	s.SetProperty("apiVersion", *withDescription(tm.Properties["apiVersion"],
		"apiVersion defines the versioned schema of this representation of an object. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources"))
	s.SetProperty("kind", *withDescription(tm.Properties["kind"],
		"kind is a string value representing the type of this object. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds"))
	s.SetProperty("metadata", metadataProperty())
	if !slices.Contains(s.Required, "kind") {
		s.Required = append(s.Required, "kind")
	}
	if !slices.Contains(s.Required, "apiVersion") {
		s.Required = append(s.Required, "apiVersion")
	}
}

func withDescription(s spec.Schema, description string) *spec.Schema {
	return s.WithDescription(description)
}

// gvkToModelName is the name of a custom resource's model: the group's parts
// reversed, the version, the kind (io.luaop.parity.v1.Gadget).
func gvkToModelName(group, version, kind string) string {
	parts := strings.Split(group, ".")
	slices.Reverse(parts)
	return fmt.Sprintf("%s.%s.%s", strings.Join(parts, "."), version, kind)
}

func modelRef(name string) string { return "#/components/schemas/" + common.EscapeJsonPointer(name) }

var (
	metaOnce        sync.Once
	metaDefinitions map[string]common.OpenAPIDefinition
	metaModelCache  map[string]*spec.Schema
)

// loadMeta makes the generated OpenAPI definitions of the types a custom
// resource's model refers to (named by their models' names, referring to each
// other as #/components/schemas/<name>), and the models of ObjectMeta and the
// types it holds (its definitions' dependencies), as builder3 stores them.
func loadMeta() {
	metaOnce.Do(func() {
		metaDefinitions = generatedopenapi.GetOpenAPIDefinitions(func(name string) spec.Ref { return spec.MustCreateRef(modelRef(name)) })
		metaModelCache = map[string]*spec.Schema{}
		var add func(name string)
		add = func(name string) {
			key := common.EscapeJsonPointer(name)
			if _, done := metaModelCache[key]; done {
				return
			}
			def, ok := metaDefinitions[name]
			if !ok {
				return
			}
			s := def.Schema
			if _, ok := s.Extensions[common.ExtensionV2Schema]; ok {
				s.Extensions = maps.Clone(s.Extensions)
				delete(s.Extensions, common.ExtensionV2Schema)
			}
			metaModelCache[key] = builderutil.WrapRefs(&s)
			for _, dep := range def.Dependencies {
				add(dep)
			}
		}
		add(objectMetaModel)
	})
}

// typeMeta is TypeMeta's generated schema.
func typeMeta() spec.Schema {
	loadMeta()
	return metaDefinitions[typeMetaModel].Schema
}

// metaModels are the models of ObjectMeta and the types it holds: a new map each
// call, the (never modified) schemas shared.
func metaModels() map[string]*spec.Schema {
	loadMeta()
	return maps.Clone(metaModelCache)
}
