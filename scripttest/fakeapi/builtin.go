package fakeapi

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	genericvalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/managedfields"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/storage/names"
	"k8s.io/client-go/applyconfigurations"
	"k8s.io/client-go/kubernetes/scheme"
)

// decodeBuiltin reads a built-in kind's object as the API server's decoder does:
// into its Go type (a field of the wrong type is refused with the decoder's words,
// an unknown field dropped), then back to JSON, as the server would store and
// answer it.
func decodeBuiltin(gvk schema.GroupVersionKind, u *unstructured.Unstructured) error {
	data, err := json.Marshal(u.Object)
	if err != nil {
		return apierrors.NewBadRequest(err.Error())
	}
	typed, err := scheme.Scheme.New(gvk)
	if err != nil {
		return apierrors.NewInternalError(err)
	}
	if _, _, err := builtinSerializer.Decode(data, &gvk, typed); err != nil {
		return apierrors.NewBadRequest(fmt.Sprintf("%s in version %q cannot be handled as a %s: %v", gvk.Kind, gvk.Version, gvk.Kind, err))
	}
	out, err := json.Marshal(typed)
	if err != nil {
		return apierrors.NewInternalError(err)
	}
	obj := map[string]any{}
	if err := json.Unmarshal(out, &obj); err != nil {
		return apierrors.NewInternalError(err)
	}
	u.Object = obj
	u.SetGroupVersionKind(gvk)
	return nil
}

var builtinSerializer = kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme.Scheme, scheme.Scheme, kjson.SerializerOptions{})

// builtinTyped is a built-in object as its Go type, for a strategic merge patch.
func builtinTyped(gvk schema.GroupVersionKind) (runtime.Object, error) { return scheme.Scheme.New(gvk) }

var (
	builtinConverterOnce sync.Once
	builtinConverter     managedfields.TypeConverter
)

// builtinTypeConverter is server-side apply's type converter of the built-in kinds
// (client-go's models of them: list types, map keys, atomic structs).
func builtinTypeConverter() managedfields.TypeConverter {
	builtinConverterOnce.Do(func() { builtinConverter = applyconfigurations.NewTypeConverter(scheme.Scheme) })
	return builtinConverter
}

// builtinStrategy is what the API server does to every built-in kind's writes that
// is not the kind's own code: a kind with a status subresource ignores the status of
// the main resource's writes (and starts with none) and counts the changes of the
// rest in metadata.generation; the metadata rules are rest.BeforeCreate's and
// BeforeUpdate's. A kind's own validation and defaulting (a Deployment's) are not
// a library, and are not done.
type builtinStrategy struct {
	unstructuredTyper
	names.NameGenerator
	k *kind
}

func newBuiltinStrategy(k *kind) builtinStrategy {
	return builtinStrategy{NameGenerator: names.SimpleNameGenerator, k: k}
}

func (b builtinStrategy) NamespaceScoped() bool { return b.k.namespaced }

func (b builtinStrategy) PrepareForCreate(_ context.Context, obj runtime.Object) {
	if !b.k.status {
		return
	}
	u := obj.(*unstructured.Unstructured)
	delete(u.Object, "status")
	u.SetGeneration(1)
}

func (b builtinStrategy) PrepareForUpdate(_ context.Context, obj, old runtime.Object) {
	if !b.k.status {
		return
	}
	n, o := obj.(*unstructured.Unstructured), old.(*unstructured.Unstructured)
	if st, ok := o.Object["status"]; ok {
		n.Object["status"] = st
	} else {
		delete(n.Object, "status")
	}
	if !reflect.DeepEqual(n.Object["spec"], o.Object["spec"]) {
		n.SetGeneration(o.GetGeneration() + 1)
	}
}

// Validate holds the name to a kind's rule (a DNS subdomain; a DNS label for the
// kinds whose names are host names), as each kind's own validation does before the
// generic rules of rest.BeforeCreate.
func (b builtinStrategy) Validate(_ context.Context, obj runtime.Object) field.ErrorList {
	m, err := meta.Accessor(obj)
	if err != nil {
		return field.ErrorList{field.InternalError(field.NewPath("metadata"), err)}
	}
	name := genericvalidation.NameIsDNSSubdomain
	if dnsLabelNames[b.k.gvk.GroupKind().String()] {
		name = genericvalidation.NameIsDNSLabel
	}
	return genericvalidation.ValidateObjectMetaAccessor(m, b.k.namespaced, name, field.NewPath("metadata"))
}

// dnsLabelNames are the built-in kinds whose names are DNS labels.
var dnsLabelNames = map[string]bool{"Namespace": true, "Service": true}

func (builtinStrategy) WarningsOnCreate(context.Context, runtime.Object) []string {
	return nil
}
func (builtinStrategy) Canonicalize(runtime.Object)              {}
func (builtinStrategy) AllowCreateOnUpdate(context.Context) bool { return false }
func (builtinStrategy) ValidateUpdate(context.Context, runtime.Object, runtime.Object) field.ErrorList {
	return nil
}
func (builtinStrategy) WarningsOnUpdate(context.Context, runtime.Object, runtime.Object) []string {
	return nil
}
func (builtinStrategy) AllowUnconditionalUpdate(context.Context) bool { return true }

// statusStrategy is a built-in kind's status subresource: only status changes.
type builtinStatusStrategy struct{ builtinStrategy }

func (builtinStatusStrategy) PrepareForUpdate(_ context.Context, obj, old runtime.Object) {
	n, o := obj.(*unstructured.Unstructured), old.(*unstructured.Unstructured)
	status, has := n.Object["status"]
	n.Object = runtime.DeepCopyJSON(o.Object)
	if has {
		n.Object["status"] = status
	} else {
		delete(n.Object, "status")
	}
}

// schemalessStrategy serves a kind the server knows nothing of: stored as given,
// with the generic metadata rules.
type schemalessStrategy struct{ builtinStrategy }

// nopConverter is the object convertor of the field manager: the fake serves each
// kind in the version it is written in.
type nopConverter struct{}

func (nopConverter) Convert(in, out, _ any) error {
	u, ok := out.(*unstructured.Unstructured)
	if !ok {
		return fmt.Errorf("converting into %T", out)
	}
	u.Object = runtime.DeepCopyJSON(in.(*unstructured.Unstructured).Object)
	return nil
}

func (nopConverter) ConvertToVersion(in runtime.Object, gv runtime.GroupVersioner) (runtime.Object, error) {
	if gvk, ok := gv.KindForGroupVersionKinds([]schema.GroupVersionKind{in.GetObjectKind().GroupVersionKind()}); ok {
		in.GetObjectKind().SetGroupVersionKind(gvk)
	}
	return in, nil
}

func (nopConverter) ConvertFieldLabel(_ schema.GroupVersionKind, label, value string) (string, string, error) {
	return label, value, nil
}

// nopDefaulter: the server's defaults are applied where the fake knows them (CRDs'
// schemas), before the field manager.
type nopDefaulter struct{}

func (nopDefaulter) Default(runtime.Object) {}

// unstructuredCreater makes the empty object of a kind.
type unstructuredCreater struct{}

func (unstructuredCreater) New(gvk schema.GroupVersionKind) (runtime.Object, error) {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetGroupVersionKind(gvk)
	return u, nil
}
