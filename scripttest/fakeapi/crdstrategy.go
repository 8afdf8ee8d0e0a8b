package fakeapi

import (
	"context"
	"fmt"
	"math"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel/model"
	structurallisttype "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	schemaobjectmeta "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/objectmeta"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/operation"
	genericvalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/sets"
	utilvalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	celcommon "k8s.io/apiserver/pkg/cel/common"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage/names"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
)

// customResourceStrategy is what the API server does to the writes of one version
// of a custom resource: apiextensions-apiserver's customResourceStrategy and
// customResourceValidator (pkg/registry/customresource, strategy.go and
// validator.go), written again here because that package also holds the etcd
// storage of custom resources, whose etcd client and grpc would be linked into the
// luaop binary (and grpc's tracing disables the linker's dead-code elimination).
// The validation itself is the library's: the schema validator, the CEL rules,
// the list-type and embedded-resource checks of apiextensions-apiserver's schema
// packages, and apimachinery's ObjectMeta rules.
//
// Left out of the original: selectable fields (GetAttrs: the fake selects by
// labels only), the ratcheting time metric, and GetResetFields (the server's field
// manager resets status by the kind's status subresource, in fieldManager).
type customResourceStrategy struct {
	unstructuredTyper
	names.NameGenerator

	namespaceScoped bool
	kind            schema.GroupVersionKind
	// schemaValidator validates the whole object, statusSchemaValidator its status
	// (writes to the status subresource); either may be nil (no schema).
	schemaValidator       apiservervalidation.SchemaValidator
	statusSchemaValidator apiservervalidation.SchemaValidator
	structural            *structuralschema.Structural
	// celValidator holds the compiled x-kubernetes-validations rules; nil when the
	// schema has none.
	celValidator *cel.Validator
	status       *apiextensions.CustomResourceSubresourceStatus
	scale        *apiextensions.CustomResourceSubresourceScale
}

func newCustomResourceStrategy(namespaceScoped bool, kind schema.GroupVersionKind, schemaValidator, statusSchemaValidator apiservervalidation.SchemaValidator,
	structural *structuralschema.Structural, status *apiextensions.CustomResourceSubresourceStatus, scale *apiextensions.CustomResourceSubresourceScale) customResourceStrategy {
	return customResourceStrategy{
		NameGenerator:         names.SimpleNameGenerator,
		namespaceScoped:       namespaceScoped,
		kind:                  kind,
		schemaValidator:       schemaValidator,
		statusSchemaValidator: statusSchemaValidator,
		structural:            structural,
		// The CEL programs are compiled once, here, as the server does per CRD.
		celValidator: cel.NewValidator(structural, true, celconfig.PerCallLimit),
		status:       status,
		scale:        scale,
	}
}

func (a customResourceStrategy) NamespaceScoped() bool { return a.namespaceScoped }

// PrepareForCreate drops the status of a kind with a status subresource (a create
// cannot set it) and starts the generation at 1.
func (a customResourceStrategy) PrepareForCreate(_ context.Context, obj runtime.Object) {
	u := obj.(*unstructured.Unstructured)
	if a.status != nil {
		delete(u.Object, "status")
	}
	u.SetGeneration(1)
}

// PrepareForUpdate keeps the old status when the status subresource is installed
// (the main resource cannot set it), and counts in metadata.generation any change
// outside metadata.
func (a customResourceStrategy) PrepareForUpdate(_ context.Context, obj, old runtime.Object) {
	n, o := obj.(*unstructured.Unstructured), old.(*unstructured.Unstructured)
	if a.status != nil {
		_, newHas := n.Object["status"]
		oldStatus, oldHas := o.Object["status"]
		switch {
		case oldHas:
			n.Object["status"] = oldStatus
		case newHas:
			delete(n.Object, "status")
		}
	}
	if !apiequality.Semantic.DeepEqual(withoutMetadata(n.Object), withoutMetadata(o.Object)) {
		n.SetGeneration(o.GetGeneration() + 1)
	}
}

// withoutMetadata is a shallow copy of obj without its metadata.
func withoutMetadata(obj map[string]any) map[string]any {
	out := make(map[string]any, len(obj))
	for k, v := range obj {
		if k != "metadata" {
			out[k] = v
		}
	}
	return out
}

// Validate validates a new custom resource: its kind and apiVersion, its metadata,
// its schema, the scale subresource's paths, its embedded resources, its list
// sets and maps, then (when none of these is a blocking error) its CEL rules.
func (a customResourceStrategy) Validate(ctx context.Context, obj runtime.Object) field.ErrorList {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return notUnstructured(obj)
	}
	errs := a.validateTypeMeta(u)
	if len(errs) == 0 {
		errs = append(errs, a.validateObjectMeta(ctx, operation.Create, u, nil)...)
		errs = append(errs, apiservervalidation.ValidateCustomResource(nil, u.Object, a.schemaValidator)...)
		errs = append(errs, a.validateScaleSpec(u)...)
		errs = append(errs, a.validateScaleStatus(u)...)
	}
	errs = append(errs, schemaobjectmeta.Validate(ctx, nil, u.Object, a.structural, false)...)
	errs = append(errs, structurallisttype.ValidateListSetsAndMaps(nil, a.structural, u.Object)...)
	return append(errs, a.validateRules(ctx, errs, u.Object, nil)...)
}

// ValidateUpdate validates an update of the main resource. Validation ratchets
// (the CRDValidationRatcheting gate is locked on): a value the schema or a rule
// refuses is let through when it is unchanged from the old object; list sets and
// maps are checked only when the old object's were valid.
func (a customResourceStrategy) ValidateUpdate(ctx context.Context, obj, old runtime.Object) field.ErrorList {
	u, o, errs := bothUnstructured(obj, old)
	if errs != nil {
		return errs
	}
	correlated := celcommon.NewCorrelatedObject(u.Object, o.Object, &model.Structural{Structural: a.structural})
	errs = a.validateTypeMeta(u)
	if len(errs) == 0 {
		errs = append(errs, a.validateObjectMeta(ctx, operation.Update, u, o)...)
		errs = append(errs, apiservervalidation.ValidateCustomResourceUpdate(nil, u.Object, o.Object, a.schemaValidator, apiservervalidation.WithRatcheting(correlated))...)
		errs = append(errs, a.validateScaleSpec(u)...)
		errs = append(errs, a.validateScaleStatus(u)...)
	}
	// Embedded objects are checked alike on create and update.
	errs = append(errs, schemaobjectmeta.Validate(ctx, nil, u.Object, a.structural, false)...)
	if oldErrs := structurallisttype.ValidateListSetsAndMaps(nil, a.structural, o.Object); len(oldErrs) == 0 {
		errs = append(errs, structurallisttype.ValidateListSetsAndMaps(nil, a.structural, u.Object)...)
	}
	return append(errs, a.validateRules(ctx, errs, u.Object, o.Object, cel.WithRatcheting(correlated))...)
}

// validateRules runs the x-kubernetes-validations rules (old is the old object of
// an update, for transition rules), unless errs holds an error that makes them
// meaningless (a wrong type, a missing required field, ...).
func (a customResourceStrategy) validateRules(ctx context.Context, errs field.ErrorList, obj, old any, opts ...cel.Option) field.ErrorList {
	if a.celValidator == nil {
		return nil
	}
	if blocking := blockingError(errs); blocking != nil {
		return field.ErrorList{blocking}
	}
	ruleErrs, _ := a.celValidator.Validate(ctx, nil, a.structural, obj, old, celconfig.RuntimeCELCostBudget, opts...)
	return ruleErrs
}

// blockingError is the error the server adds in place of the CEL rules' when errs
// has a type, maxLength, maxItems, maxProperties, required or enum violation.
func blockingError(errs field.ErrorList) *field.Error {
	for _, err := range errs {
		switch err.Type {
		case field.ErrorTypeNotSupported, field.ErrorTypeRequired, field.ErrorTypeTooLong, field.ErrorTypeTooMany, field.ErrorTypeTypeInvalid:
			return field.Invalid(nil, nil, "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation")
		}
	}
	return nil
}

func (a customResourceStrategy) WarningsOnCreate(_ context.Context, obj runtime.Object) []string {
	return finalizerWarnings(obj, nil)
}

func (a customResourceStrategy) WarningsOnUpdate(_ context.Context, obj, old runtime.Object) []string {
	return finalizerWarnings(obj, old)
}

func (customResourceStrategy) Canonicalize(runtime.Object) {}

// AllowCreateOnUpdate: a custom resource is created by a POST only.
func (customResourceStrategy) AllowCreateOnUpdate(context.Context) bool { return false }

func (customResourceStrategy) AllowUnconditionalUpdate(context.Context) bool { return false }

// validateTypeMeta holds kind and apiVersion to the version served.
func (a customResourceStrategy) validateTypeMeta(u *unstructured.Unstructured) field.ErrorList {
	var errs field.ErrorList
	if u.GetKind() != a.kind.Kind {
		errs = append(errs, field.Invalid(field.NewPath("kind"), u.GetKind(), fmt.Sprintf("must be %v", a.kind.Kind)))
	}
	if want := a.kind.Group + "/" + a.kind.Version; u.GetAPIVersion() != want {
		errs = append(errs, field.Invalid(field.NewPath("apiVersion"), u.GetAPIVersion(), fmt.Sprintf("must be %v", want)))
	}
	return errs
}

// validateObjectMeta is apimachinery's ObjectMeta validation (a name is a DNS
// subdomain; on update, what cannot change), declarative rules included.
func (a customResourceStrategy) validateObjectMeta(ctx context.Context, op operation.Type, u, old *unstructured.Unstructured) field.ErrorList {
	m, errs := objectMetaOf(u)
	if len(errs) > 0 {
		return errs
	}
	var oldMeta *metav1.ObjectMeta
	nameFn := genericvalidation.NameIsDNSSubdomain
	if op == operation.Update {
		nameFn = nil
		if oldMeta, errs = objectMetaOf(old); len(errs) > 0 {
			return errs
		}
	}
	return genericvalidation.ValidateObjectMetaDeclaratively(ctx, op, m, oldMeta, a.namespaceScoped, nameFn, field.NewPath("metadata"),
		utilfeature.DefaultFeatureGate.Enabled(features.DeclarativeValidationBeta))
}

func objectMetaOf(u *unstructured.Unstructured) (*metav1.ObjectMeta, field.ErrorList) {
	m := &metav1.ObjectMeta{}
	raw := u.Object["metadata"]
	if raw == nil {
		return m, nil
	}
	rawMap, ok := raw.(map[string]any)
	if !ok {
		return nil, field.ErrorList{field.Invalid(field.NewPath("metadata"), raw, fmt.Sprintf("expected map[string]interface{}, got %T", raw))}
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(rawMap, m); err != nil {
		return nil, field.ErrorList{field.Invalid(field.NewPath("metadata"), raw, err.Error())}
	}
	return m, nil
}

// validateScaleSpec holds the scale subresource's spec replicas to a non-negative
// int32.
func (a customResourceStrategy) validateScaleSpec(u *unstructured.Unstructured) field.ErrorList {
	if a.scale == nil {
		return nil
	}
	return validateReplicas(u, a.scale.SpecReplicasPath)
}

// validateScaleStatus holds the scale subresource's status replicas to a
// non-negative int32 and its label selector to a string.
func (a customResourceStrategy) validateScaleStatus(u *unstructured.Unstructured) field.ErrorList {
	if a.scale == nil {
		return nil
	}
	errs := validateReplicas(u, a.scale.StatusReplicasPath)
	if a.scale.LabelSelectorPath != nil {
		path := *a.scale.LabelSelectorPath
		selector, _, err := unstructured.NestedString(u.Object, strings.Split(strings.TrimPrefix(path, "."), ".")...)
		if err != nil {
			errs = append(errs, field.Invalid(field.NewPath(path), selector, err.Error()))
		}
	}
	return errs
}

func validateReplicas(u *unstructured.Unstructured, path string) field.ErrorList {
	replicas, _, err := unstructured.NestedInt64(u.Object, strings.Split(strings.TrimPrefix(path, "."), ".")...)
	switch {
	case err != nil:
		return field.ErrorList{field.Invalid(field.NewPath(path), replicas, err.Error())}
	case replicas < 0:
		return field.ErrorList{field.Invalid(field.NewPath(path), replicas, "should be a non-negative integer")}
	case replicas > math.MaxInt32:
		return field.ErrorList{field.Invalid(field.NewPath(path), replicas, fmt.Sprintf("should be less than or equal to %v", math.MaxInt32))}
	}
	return nil
}

// standardFinalizers are the finalizers Kubernetes names without a domain.
var standardFinalizers = sets.New(metav1.FinalizerOrphanDependents, metav1.FinalizerDeleteDependents, string(corev1.FinalizerKubernetes))

// finalizerWarnings are the server's warnings for the finalizers obj adds (to
// old's): a name that is not qualified or, not being a standard one, has no domain.
func finalizerWarnings(obj, old runtime.Object) []string {
	added := sets.New(obj.(*unstructured.Unstructured).GetFinalizers()...)
	if old != nil {
		added = added.Difference(sets.New(old.(*unstructured.Unstructured).GetFinalizers()...))
	}
	path := field.NewPath("metadata", "finalizers").String()
	var warnings []string
	for _, f := range sets.List(added) {
		for _, msg := range utilvalidation.IsQualifiedName(f) {
			warnings = append(warnings, fmt.Sprintf("%s: %q: %s", path, f, msg))
		}
		if strings.Contains(f, "/") || standardFinalizers.Has(f) {
			continue
		}
		if strings.Contains(f, ".") {
			warnings = append(warnings, fmt.Sprintf("%s: %q: prefer a domain-qualified finalizer name including a path (/) to avoid accidental conflicts with other finalizer writers", path, f))
		} else {
			warnings = append(warnings, fmt.Sprintf("%s: %q: prefer a domain-qualified finalizer name to avoid accidental conflicts with other finalizer writers", path, f))
		}
	}
	return warnings
}

// customResourceStatusStrategy is the status subresource's strategy
// (customresource's statusStrategy): a write keeps the old object but for status
// (and the managedFields the field manager computed), and validates status.
type customResourceStatusStrategy struct{ customResourceStrategy }

// PrepareForUpdate keeps only the status of obj, on a copy of old.
func (customResourceStatusStrategy) PrepareForUpdate(_ context.Context, obj, old runtime.Object) {
	n, o := obj.(*unstructured.Unstructured), old.(*unstructured.Unstructured)
	status, has := n.Object["status"]
	managedFields := n.GetManagedFields()
	n.Object = runtime.DeepCopyJSON(o.Object)
	n.SetManagedFields(managedFields)
	if has {
		n.Object["status"] = status
	} else {
		delete(n.Object, "status")
	}
}

// ValidateUpdate validates a status write: kind and apiVersion, what of metadata
// cannot change, status against its schema (ratcheting), the scale status, list
// sets and maps (when the old object's were valid), the CEL rules.
func (a customResourceStatusStrategy) ValidateUpdate(ctx context.Context, obj, old runtime.Object) field.ErrorList {
	u, o, errs := bothUnstructured(obj, old)
	if errs != nil {
		return errs
	}
	correlated := celcommon.NewCorrelatedObject(u.Object, o.Object, &model.Structural{Structural: a.structural})
	errs = a.validateTypeMeta(u)
	if len(errs) == 0 {
		errs = append(errs, a.validateObjectMeta(ctx, operation.Update, u, o)...)
		if status, has := u.Object["status"]; has {
			var opts []apiservervalidation.ValidationOption
			if a.structural != nil {
				opts = append(opts, apiservervalidation.WithRatcheting(correlated.Key("status")))
			}
			errs = append(errs, apiservervalidation.ValidateCustomResourceUpdate(field.NewPath("status"), status, o.Object["status"], a.statusSchemaValidator, opts...)...)
		}
		errs = append(errs, a.validateScaleStatus(u)...)
	}
	if newErrs := structurallisttype.ValidateListSetsAndMaps(nil, a.structural, u.Object); len(newErrs) > 0 {
		if oldErrs := structurallisttype.ValidateListSetsAndMaps(nil, a.structural, o.Object); len(oldErrs) == 0 {
			errs = append(errs, newErrs...)
		}
	}
	return append(errs, a.validateRules(ctx, errs, u.Object, o.Object, cel.WithRatcheting(correlated))...)
}

func (customResourceStatusStrategy) WarningsOnUpdate(context.Context, runtime.Object, runtime.Object) []string {
	return nil
}

func notUnstructured(obj runtime.Object) field.ErrorList {
	return field.ErrorList{field.Invalid(field.NewPath(""), obj, fmt.Sprintf("has type %T. Must be a pointer to an Unstructured type", obj))}
}

func bothUnstructured(obj, old runtime.Object) (*unstructured.Unstructured, *unstructured.Unstructured, field.ErrorList) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, nil, notUnstructured(obj)
	}
	o, ok := old.(*unstructured.Unstructured)
	if !ok {
		return nil, nil, notUnstructured(old)
	}
	return u, o, nil
}
