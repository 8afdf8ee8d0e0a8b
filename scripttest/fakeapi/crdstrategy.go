package fakeapi

import (
	"context"
	"fmt"
	"reflect"

	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	structurallisttype "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	schemaobjectmeta "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/objectmeta"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	genericvalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/storage/names"
)

// crStrategy is what the API server's custom resource strategy (apiextensions-
// apiserver's registry/customresource) does to a custom resource's writes, written
// here on the schema packages it is built on: that registry package links the API
// server's storage (etcd's client, gRPC) into the luaop binary, whose gRPC tracing
// turns the linker's dead-code elimination off (the binary doubled). What it does:
//   - create: the status is dropped when the status subresource is on; generation 1;
//   - update: the status is the old one when the status subresource is on; any
//     change but metadata's bumps the generation;
//   - validation: kind and apiVersion, the ObjectMeta rules (a DNS subdomain name),
//     the schema (types, formats, enums, patterns, bounds), embedded resources'
//     metadata, x-kubernetes-list-type set and map uniqueness (on update only when
//     the old object kept it, as the server ratchets it), and the
//     x-kubernetes-validations CEL rules (transition rules with the old object).
//
// Left out: validation ratcheting of unchanged fields (a feature gate of the
// server), the scale subresource's selector checks, selectable fields.
type crStrategy struct {
	unstructuredTyper
	names.NameGenerator
	gvk        schema.GroupVersionKind
	namespaced bool
	// status: the status subresource is on.
	status     bool
	structural *structuralschema.Structural
	validator  apiservervalidation.SchemaValidator
	// statusValidator is the schema of status (nil without the subresource or a
	// status schema).
	statusValidator apiservervalidation.SchemaValidator
	celValidator    *cel.Validator
}

func newCRStrategy(gvk schema.GroupVersionKind, namespaced, status bool, structural *structuralschema.Structural, validator, statusValidator apiservervalidation.SchemaValidator) crStrategy {
	return crStrategy{NameGenerator: names.SimpleNameGenerator, gvk: gvk, namespaced: namespaced, status: status,
		structural: structural, validator: validator, statusValidator: statusValidator,
		celValidator: cel.NewValidator(structural, true, celconfig.PerCallLimit)}
}

func (c crStrategy) NamespaceScoped() bool { return c.namespaced }

func (c crStrategy) PrepareForCreate(_ context.Context, obj runtime.Object) {
	u := obj.(*unstructured.Unstructured)
	if c.status {
		delete(u.Object, "status")
	}
	u.SetGeneration(1)
}

func (c crStrategy) PrepareForUpdate(_ context.Context, obj, old runtime.Object) {
	n, o := obj.(*unstructured.Unstructured), old.(*unstructured.Unstructured)
	if c.status {
		if st, ok := o.Object["status"]; ok {
			n.Object["status"] = st
		} else {
			delete(n.Object, "status")
		}
	}
	if !reflect.DeepEqual(withoutMetadata(n.Object), withoutMetadata(o.Object)) {
		n.SetGeneration(o.GetGeneration() + 1)
	}
}

func withoutMetadata(obj map[string]any) map[string]any {
	out := make(map[string]any, len(obj))
	for k, v := range obj {
		if k != "metadata" {
			out[k] = v
		}
	}
	return out
}

func (c crStrategy) Validate(ctx context.Context, obj runtime.Object) field.ErrorList {
	u := obj.(*unstructured.Unstructured)
	if errs := c.validateTypeMeta(u); len(errs) > 0 {
		return errs
	}
	errs := genericvalidation.ValidateObjectMetaAccessor(u, c.namespaced, genericvalidation.NameIsDNSSubdomain, field.NewPath("metadata"))
	errs = append(errs, apiservervalidation.ValidateCustomResource(nil, u.Object, c.validator)...)
	errs = append(errs, schemaobjectmeta.Validate(ctx, nil, u.Object, c.structural, false)...)
	errs = append(errs, structurallisttype.ValidateListSetsAndMaps(nil, c.structural, u.Object)...)
	return c.validateRules(ctx, errs, u.Object, nil)
}

func (c crStrategy) ValidateUpdate(ctx context.Context, obj, old runtime.Object) field.ErrorList {
	n, o := obj.(*unstructured.Unstructured), old.(*unstructured.Unstructured)
	if errs := c.validateTypeMeta(n); len(errs) > 0 {
		return errs
	}
	errs := genericvalidation.ValidateObjectMetaAccessorUpdate(n, o, field.NewPath("metadata"))
	errs = append(errs, apiservervalidation.ValidateCustomResourceUpdate(nil, n.Object, o.Object, c.validator)...)
	errs = append(errs, schemaobjectmeta.Validate(ctx, nil, n.Object, c.structural, false)...)
	if len(structurallisttype.ValidateListSetsAndMaps(nil, c.structural, o.Object)) == 0 {
		errs = append(errs, structurallisttype.ValidateListSetsAndMaps(nil, c.structural, n.Object)...)
	}
	return c.validateRules(ctx, errs, n.Object, o.Object)
}

// validateRules adds the x-kubernetes-validations rules' errors, unless an error
// already found would make them run on a value they cannot take (the server's
// blocking errors: a wrong type, a required field missing, a value out of its enum,
// too long, too many).
func (c crStrategy) validateRules(ctx context.Context, errs field.ErrorList, obj, old map[string]any) field.ErrorList {
	if c.celValidator == nil {
		return errs
	}
	for _, e := range errs {
		switch e.Type {
		case field.ErrorTypeTypeInvalid, field.ErrorTypeRequired, field.ErrorTypeNotSupported, field.ErrorTypeTooLong, field.ErrorTypeTooMany:
			return append(errs, field.Invalid(nil, nil, "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation"))
		}
	}
	ruleErrs, _ := c.celValidator.Validate(ctx, nil, c.structural, obj, old, celconfig.RuntimeCELCostBudget)
	return append(errs, ruleErrs...)
}

func (c crStrategy) validateTypeMeta(u *unstructured.Unstructured) field.ErrorList {
	var errs field.ErrorList
	if u.GetKind() != c.gvk.Kind {
		errs = append(errs, field.Invalid(field.NewPath("kind"), u.GetKind(), fmt.Sprintf("must be %v", c.gvk.Kind)))
	}
	if want := c.gvk.GroupVersion().String(); u.GetAPIVersion() != want {
		errs = append(errs, field.Invalid(field.NewPath("apiVersion"), u.GetAPIVersion(), fmt.Sprintf("must be %v", want)))
	}
	return errs
}

func (crStrategy) WarningsOnCreate(context.Context, runtime.Object) []string { return nil }
func (crStrategy) WarningsOnUpdate(context.Context, runtime.Object, runtime.Object) []string {
	return nil
}
func (crStrategy) Canonicalize(runtime.Object)                   {}
func (crStrategy) AllowCreateOnUpdate(context.Context) bool      { return false }
func (crStrategy) AllowUnconditionalUpdate(context.Context) bool { return false }

// crStatusStrategy is the status subresource of a custom resource: only status
// changes, validated against the status schema.
type crStatusStrategy struct{ crStrategy }

func (crStatusStrategy) PrepareForUpdate(_ context.Context, obj, old runtime.Object) {
	n, o := obj.(*unstructured.Unstructured), old.(*unstructured.Unstructured)
	status, has := n.Object["status"]
	managed := n.GetManagedFields() // the status write's, kept
	n.Object = runtime.DeepCopyJSON(o.Object)
	n.SetManagedFields(managed)
	if has {
		n.Object["status"] = status
	} else {
		delete(n.Object, "status")
	}
}

func (c crStatusStrategy) ValidateUpdate(ctx context.Context, obj, old runtime.Object) field.ErrorList {
	n, o := obj.(*unstructured.Unstructured), old.(*unstructured.Unstructured)
	if errs := c.validateTypeMeta(n); len(errs) > 0 {
		return errs
	}
	errs := genericvalidation.ValidateObjectMetaAccessorUpdate(n, o, field.NewPath("metadata"))
	if status, has := n.Object["status"]; has && c.statusValidator != nil {
		errs = append(errs, apiservervalidation.ValidateCustomResourceUpdate(field.NewPath("status"), status, o.Object["status"], c.statusValidator)...)
	}
	if len(structurallisttype.ValidateListSetsAndMaps(nil, c.structural, n.Object)) > 0 && len(structurallisttype.ValidateListSetsAndMaps(nil, c.structural, o.Object)) == 0 {
		errs = append(errs, structurallisttype.ValidateListSetsAndMaps(nil, c.structural, n.Object)...)
	}
	return c.validateRules(ctx, errs, n.Object, o.Object)
}
