package fakeapi

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/registry/customresource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/rest"
)

// The fake's custom resource strategies prepare and validate writes as
// apiextensions-apiserver's (which the fake cannot link: its package holds the
// etcd storage): the same objects out, the same errors and warnings, for creates,
// updates of the main resource and of status.
func TestCustomResourceStrategyIsTheAPIServers(t *testing.T) {
	crds, err := ReadCRDs(filepath.Join("testdata", "machines.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	crd := crds[0]
	gvk := schema.GroupVersionKind{Group: "fake.luaop.dev", Version: "v1", Kind: "Machine"}
	ck, err := newCRDKind(crd, crd.Spec.Versions[0], gvk, nil)
	if err != nil {
		t.Fatal(err)
	}
	ours := ck.strategy
	server := customresource.NewStrategy(unstructuredTyper{}, true, gvk, ours.schemaValidator, ours.statusSchemaValidator,
		ours.structural, ours.status, ours.scale, crd.Spec.Versions[0].SelectableFields)
	type M = map[string]any
	machine := func(spec M, mutate ...func(M)) M {
		o := M{"apiVersion": "fake.luaop.dev/v1", "kind": "Machine", "metadata": M{"name": "m", "namespace": "ns", "generation": int64(3), "resourceVersion": "1"},
			"spec": spec, "status": M{"replicas": int64(1), "phase": "Ready"}}
		for _, f := range mutate {
			f(o)
		}
		return o
	}
	ok := M{"replicas": int64(1), "zone": "a", "tags": []any{"x", "y"}, "disks": []any{M{"name": "d", "bus": "virtio"}}}
	with := func(k string, v any) M {
		s := runtime.DeepCopyJSONValue(ok).(M)
		s[k] = v
		return s
	}
	meta := func(k string, v any) func(M) { return func(o M) { o["metadata"].(M)[k] = v } }
	creates := map[string]M{
		"valid, with a status":              machine(ok),
		"a duplicate in a set list":         machine(with("tags", []any{"x", "x"})),
		"a duplicate map-list key":          machine(with("disks", []any{M{"name": "d", "bus": "v"}, M{"name": "d", "bus": "v"}})),
		"negative replicas":                 machine(with("replicas", int64(-1))),
		"an embedded resource without kind": machine(with("template", M{"apiVersion": "v1", "metadata": M{"name": "Bad_Name"}})),
		"a wrong kind":                      machine(ok, func(o M) { o["kind"] = "Other" }),
		"an invalid name":                   machine(ok, meta("name", "Bad_Name")),
		"finalizers":                        machine(ok, meta("finalizers", []any{"plain", "dotted.name", "example.com/fine", "kubernetes"})),
		"a string too long":                 machine(with("note", "this note is longer than twenty")),
		"a type error":                      machine(with("replicas", "three")),
	}
	for name, obj := range creates {
		t.Run("create "+name, func(t *testing.T) {
			want, got := outcome(server, nil, obj), outcome(ours, nil, obj)
			if want != got {
				t.Errorf("server:\n%s\nfake:\n%s", want, got)
			}
			t.Log(got)
		})
	}
	old := machine(ok)
	longNote := machine(with("note", "this note is longer than twenty"))
	dupTags := machine(with("tags", []any{"x", "x"}))
	updates := map[string][2]M{
		"a spec change":                       {old, machine(with("replicas", int64(2)))},
		"a label change":                      {old, machine(ok, meta("labels", M{"a": "b"}))},
		"a status change":                     {old, machine(ok, func(o M) { o["status"] = M{"phase": "Gone"} })},
		"no status":                           {old, machine(ok, func(o M) { delete(o, "status") })},
		"a transition rule broken":            {old, machine(with("zone", "b"))},
		"an invalid value kept (ratcheting)":  {longNote, machine(with("note", "this note is longer than twenty"), meta("labels", M{"a": "b"}))},
		"an invalid value changed":            {longNote, machine(with("note", "this note is longer than twenty too"))},
		"a duplicate kept (ratcheting)":       {dupTags, machine(with("tags", []any{"x", "x"}), meta("labels", M{"a": "b"}))},
		"a duplicate added":                   {old, machine(with("tags", []any{"y", "y"}))},
		"a status with negative replicas":     {old, machine(ok, func(o M) { o["status"] = M{"replicas": int64(-1)} })},
		"a status of the wrong type":          {old, machine(ok, func(o M) { o["status"] = M{"phase": int64(1)} })},
		"an immutable metadata field changed": {old, machine(ok, meta("namespace", "other"))},
		"a finalizer added":                   {old, machine(ok, meta("finalizers", []any{"plain"}))},
	}
	for name, u := range updates {
		t.Run("update "+name, func(t *testing.T) {
			want, got := outcome(server, u[0], u[1]), outcome(ours, u[0], u[1])
			if want != got {
				t.Errorf("server:\n%s\nfake:\n%s", want, got)
			}
			t.Log(got)
		})
		t.Run("status update "+name, func(t *testing.T) {
			want, got := outcome(customresource.NewStatusStrategy(server), u[0], u[1]), outcome(customResourceStatusStrategy{ours}, u[0], u[1])
			if want != got {
				t.Errorf("server:\n%s\nfake:\n%s", want, got)
			}
			t.Log(got)
		})
	}
	if _, ok := any(ours).(writeStrategy); !ok {
		t.Error("the strategy is not a create and update strategy")
	}
	for _, q := range []struct {
		name      string
		want, got bool
	}{
		{"NamespaceScoped", server.NamespaceScoped(), ours.NamespaceScoped()},
		{"AllowCreateOnUpdate", server.AllowCreateOnUpdate(t.Context()), ours.AllowCreateOnUpdate(t.Context())},
		{"AllowUnconditionalUpdate", server.AllowUnconditionalUpdate(t.Context()), ours.AllowUnconditionalUpdate(t.Context())},
	} {
		if q.want != q.got {
			t.Errorf("%s: the server's answers %v, the fake's %v", q.name, q.want, q.got)
		}
	}
}

// outcome is what a strategy makes of a create (old nil) or an update: the object
// prepared, the validation errors, the warnings.
func outcome(s rest.RESTUpdateStrategy, old, obj map[string]any) string {
	ctx := context.Background()
	u := &unstructured.Unstructured{Object: runtime.DeepCopyJSON(obj)}
	var errs field.ErrorList
	var warnings []string
	if old == nil {
		c := s.(rest.RESTCreateStrategy)
		c.PrepareForCreate(ctx, u)
		errs, warnings = c.Validate(ctx, u), c.WarningsOnCreate(ctx, u)
	} else {
		o := &unstructured.Unstructured{Object: runtime.DeepCopyJSON(old)}
		s.PrepareForUpdate(ctx, u, o)
		errs, warnings = s.ValidateUpdate(ctx, u, o), s.WarningsOnUpdate(ctx, u, o)
	}
	data, _ := json.MarshalIndent(u.Object, "", " ")
	return fmt.Sprintf("%s\nerrors: %v\nwarnings: %q", data, errs, warnings)
}
