package luabind

import (
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/luaop/luaop/handling"
	"github.com/luaop/luaop/processing/causes"
)

const relatedScript = `local luaop = require("luaop")
local function heal(ctx)
  local seen = {}
  for _, r in ipairs(ctx.related or {}) do
    seen[#seen + 1] = table.concat({r.relation, r.resource, r.kind, r.namespace or "-", r.name, r.type,
      r.old and r.old.data.v or "nil", r.new and r.new.data.v or "nil", r.object.data.v}, " ")
  end
  return { reason = ctx.reason, seen = seen, parent = ctx.name }
end
luaop.on.create("example.com/v1/widgets", heal, {id = "heal"})
luaop.on.related("example.com/v1/widgets", heal, {
  id = "heal",
  owned = {"v1/configmaps", "v1/secrets"},
  controller = false,
  labelled = {["v1/configmaps"] = "example.com/of"},
  mapped = {["v1/namespaces"] = function(ctx)
    if ctx.labels.team == nil then return nil end
    return {{namespace = ctx.labels.team, name = "a"}, "b/c", {name = "d"}}
  end},
})
`

// on.related registers the relations as data, in a stable order, and one function
// registered for create and related changes under one id is one handler of both.
func TestRelatedRegistration(t *testing.T) {
	rt := loadedRuntime(t, Options{}, "w.lua", relatedScript)
	spec := specOf(t, rt, "heal")
	if !spec.Serves(causes.Create) || !spec.Serves(causes.Related) {
		t.Fatalf("reasons %v: want create and related in one handler", spec.Reasons)
	}
	var got []string
	for _, r := range spec.Related {
		got = append(got, strings.Join([]string{string(r.Kind), r.Resource.String(), r.Label}, " ")+map[bool]string{true: " any", false: ""}[r.AnyOwner])
	}
	want := []string{"labelled v1/configmaps example.com/of", "mapped v1/namespaces ", "owned v1/configmaps  any", "owned v1/secrets  any"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("relations %q: want %q", got, want)
	}
}

func TestRelatedRegistrationErrors(t *testing.T) {
	for _, tc := range []struct{ name, src, want string }{
		{"no relation", `luaop.on.related("v1/configmaps", function() end, {id = "x"})`, "needs the objects that trigger it"},
		{"owned elsewhere", `luaop.on.update("v1/configmaps", function() end, {owned = "v1/secrets"})`, "option owned applies to luaop.on.related only"},
		{"field", `luaop.on.related("v1/configmaps", function() end, {owned = "v1/secrets", field = "data.x"})`, "options field, value, old and new do not apply"},
		{"bad label", `luaop.on.related("v1/configmaps", function() end, {labelled = {["v1/secrets"] = 3}})`, "must be a string"},
		{"bad map", `luaop.on.related("v1/configmaps", function() end, {mapped = {["v1/secrets"] = "x"}})`, "must be a function(ctx)"},
		{"bad resource", `luaop.on.related("v1/configmaps", function() end, {owned = "secrets"})`, "write it as"},
		{"twice", `luaop.on.related("v1/configmaps", function() end, {owned = {"v1/secrets", "v1/secrets"}})`, "is owned twice"},
		{"controller", `luaop.on.related("v1/configmaps", function() end, {owned = "v1/secrets", controller = "no"})`, "option controller must be true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := newTestRuntime(t, Options{})
			_, err := rt.Load(t.Context(), scriptsOf("x.lua", "local luaop = require('luaop')\n"+tc.src))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("load error %v: want %q", err, tc.want)
			}
		})
	}
}

// A mapped relation's function sees the related object as its ctx and returns
// parents as tables or "namespace/name" strings.
func TestMapRelated(t *testing.T) {
	rt := loadedRuntime(t, Options{}, "w.lua", relatedScript)
	spec := specOf(t, rt, "heal")
	mapped := -1
	for i, r := range spec.Related {
		if r.Kind == causes.RelationMapped {
			mapped = i
		}
	}
	ns := map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": "n1", "uid": "u-ns", "labels": map[string]any{"team": "red"}}}
	refs, err := rt.MapRelated(t.Context(), causes.Call{Handler: spec, Cause: handling.ForObject(spec.Related[mapped].Resource, ns)}, mapped)
	if err != nil {
		t.Fatal(err)
	}
	want := []causes.ObjectRef{{Namespace: "red", Name: "a"}, {Namespace: "b", Name: "c"}, {Name: "d"}}
	if !reflect.DeepEqual(refs, want) {
		t.Fatalf("parents %v: want %v", refs, want)
	}
	delete(ns["metadata"].(map[string]any), "labels")
	if refs, err = rt.MapRelated(t.Context(), causes.Call{Handler: spec, Cause: handling.ForObject(spec.Related[mapped].Resource, ns)}, mapped); err != nil || len(refs) != 0 {
		t.Fatalf("unlabelled: %v, %v: want none", refs, err)
	}
}

func TestMapRelatedErrorNamesTheHandler(t *testing.T) {
	rt := loadedRuntime(t, Options{}, "w.lua", `local luaop = require("luaop")
luaop.on.related("v1/configmaps", function() end, {id = "m", mapped = {["v1/namespaces"] = function(ctx) return 3 end}})`)
	spec := specOf(t, rt, "m")
	_, err := rt.MapRelated(t.Context(), causes.Call{Handler: spec, Cause: handling.ForObject(spec.Related[0].Resource, map[string]any{})}, 0)
	if err == nil || !strings.Contains(err.Error(), `mapped = {["v1/namespaces"] = ...} of m`) || !strings.Contains(err.Error(), "return a list") {
		t.Fatalf("error %v: want it to name the relation, the handler and what to return", err)
	}
}

// ctx.related lists the changes: old is nil for ADDED, new for DELETED.
func TestCtxRelated(t *testing.T) {
	rt := loadedRuntime(t, Options{}, "w.lua", relatedScript)
	spec := specOf(t, rt, "heal")
	cm := func(v string) map[string]any { return map[string]any{"data": map[string]any{"v": v}} }
	cause := handling.ForRelated(spec.Resource, widgetObject("u-1"), nil, []causes.RelatedChange{
		{Relation: causes.RelationOwned, Resource: cmRes, Kind: "ConfigMap", Namespace: "default", Name: "a", Type: "ADDED", Object: cm("1")},
		{Relation: causes.RelationLabelled, Resource: cmRes, Kind: "ConfigMap", Namespace: "x", Name: "b", Type: "MODIFIED", Object: cm("2"), Old: cm("1")},
		{Relation: causes.RelationOwned, Resource: cmRes, Kind: "ConfigMap", Name: "c", Type: "DELETED", Object: cm("3"), Old: cm("3")},
	})
	res := mustInvoke(t, rt, "heal", cause)
	got := res.Value.(map[string]any)
	want := []any{
		"owned v1/configmaps ConfigMap default a ADDED nil 1 1",
		"labelled v1/configmaps ConfigMap x b MODIFIED 1 2 2",
		"owned v1/configmaps ConfigMap - c DELETED 3 nil 3",
	}
	if got["reason"] != "related" || !reflect.DeepEqual(got["seen"], want) {
		t.Fatalf("handler saw %v: want reason related and %q", got, want)
	}
	// Any other cause: no ctx.related.
	res = mustInvoke(t, rt, "heal", createCause("u-2"))
	if seen := res.Value.(map[string]any)["seen"]; !reflect.ValueOf(seen).IsValid() || reflect.ValueOf(seen).Len() != 0 {
		t.Fatalf("a create cause saw related changes: %v", seen)
	}
}

var cmRes = causes.Resource{GroupVersionResource: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}}
