package luabind

import (
	"errors"
	"strings"
	"testing"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// kopf's index functions may key their results by tuples ({(namespace, name): ...}),
// compared by value. In Lua a table key is compared by identity, so luaop compares
// index keys that are tables by value: what one object's index function returned
// under {ns, name} is found by another handler under a new table {ns, name}, and
// pairs gives the keys back as tables.
func TestIndexKeysThatAreTablesAreComparedByValue(t *testing.T) {
	rt := loadedRuntime(t, Options{}, "idx.lua", `
local luaop = require("luaop")
luaop.index("`+widgetsResource+`", function(ctx)
  return { [{ctx.namespace, ctx.name}] = ctx.status.phase == "Running", [7] = "seven", plain = ctx.name }
end, { id = "is_running" })
luaop.index("`+widgetsResource+`", function(ctx) return { [1] = ctx.name } end, { id = "listed" })
luaop.on.create("`+widgetsResource+`", function(ctx)
  local idx = ctx.indexes.is_running
  local found = idx[{"ns1", "w1"}]
  local keys = {}
  for k, v in pairs(idx) do
    if type(k) == "table" then table.insert(keys, k[1] .. "/" .. k[2] .. "=" .. tostring(v[1])) else table.insert(keys, tostring(k)) end
  end
  table.sort(keys)
  return { found = found and found[1], count = #idx, keys = table.concat(keys, ","),
           seven = idx[7][1], missing = idx[{"ns1", "nope"}] == nil, listed = ctx.indexes.listed[""][1] }
end, { id = "reader" })
`)
	indexes := state.NewIndexes()
	for _, o := range []struct{ name, phase string }{{"w1", "Running"}, {"w2", "Pending"}} {
		body := widgetObject("u-" + o.name)
		body["metadata"].(map[string]any)["name"] = o.name
		body["status"] = map[string]any{"phase": o.phase}
		for _, id := range []string{"is_running", "listed"} {
			res, err := rt.Invoke(t.Context(), causes.Call{Handler: specOf(t, rt, id), Cause: causes.Cause{Body: body}, Patch: state.NewPatch()})
			if err != nil {
				t.Fatal(err)
			}
			entries, ok := res.Value.(map[string]any)
			if !ok {
				entries = map[string]any{"": res.Value} // as the core keeps a non-table result
			}
			indexes.Set(id, "ns1/"+o.name, entries)
		}
	}
	res, err := rt.Invoke(t.Context(), causes.Call{Handler: specOf(t, rt, "reader"), Cause: createCause("u-r"), Patch: state.NewPatch(), Indexes: indexes})
	if err != nil {
		t.Fatal(err)
	}
	got := res.Value.(map[string]any)
	want := map[string]any{"found": true, "count": int64(4), "keys": "7,ns1/w1=true,ns1/w2=false,plain",
		"seven": "seven", "missing": true, "listed": []any{"w1"}}
	for k, v := range want {
		if gv := got[k]; !equalJSON(gv, v) {
			t.Errorf("%s = %#v, want %#v (all: %v)", k, gv, v, got)
		}
	}
}

// An index that no object fed yet (a probe or a startup handler before the first
// listing) reads as empty, not as an unknown index; an unknown one is an error.
func TestIndexRegisteredButNotYetFedIsEmpty(t *testing.T) {
	rt := loadedRuntime(t, Options{}, "idx.lua", `
local luaop = require("luaop")
luaop.index("`+widgetsResource+`", function(ctx) return { [ctx.name] = true } end, { id = "names" })
luaop.on.probe(function(ctx) local n = 0; for _ in pairs(ctx.indexes.names) do n = n + 1 end; return n end, { id = "count" })
luaop.on.probe(function(ctx) return ctx.indexes.other end, { id = "unknown" })
`)
	res, err := rt.Invoke(t.Context(), causes.Call{Handler: specOf(t, rt, "count")})
	if err != nil || !equalJSON(res.Value, int64(0)) {
		t.Fatalf("count = %v, %v; want 0", res.Value, err)
	}
	if _, err := rt.Invoke(t.Context(), causes.Call{Handler: specOf(t, rt, "unknown"), Indexes: state.NewIndexes()}); err == nil {
		t.Fatal("reading an index nobody registers: no error")
	}
}

// equalJSON compares two JSON-like Go values, numbers by value whatever their Go
// type (int64 or float64).
func equalJSON(a, b any) bool {
	switch x := a.(type) {
	case int64:
		switch y := b.(type) {
		case int64:
			return x == y
		case float64:
			return float64(x) == y
		}
	case float64:
		switch y := b.(type) {
		case int64:
			return x == float64(y)
		case float64:
			return x == y
		}
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !equalJSON(x[i], y[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k := range x {
			if !equalJSON(x[k], y[k]) {
				return false
			}
		}
		return true
	}
	return a == b
}

// Every kind of handler says which field its field option names (Spec.NamedField):
// the core adds those fields to the essence its idle timers watch (kopf adds every
// handler's field to the essence). Only change handlers get Field (it reduces their
// cause to the field).
func TestNamedFieldOfEveryKind(t *testing.T) {
	rt := loadedRuntime(t, Options{}, "f.lua", `
local luaop = require("luaop")
local r = "`+widgetsResource+`"
luaop.timer(r, function() end, { id = "timer", idle = 5, field = "status.phase" })
luaop.daemon(r, function() end, { id = "daemon", field = "spec.size", value = 3 })
luaop.on.event(r, function() end, { id = "event", field = "metadata.labels.app" })
luaop.on.field(r, "spec.mode", function() end, { id = "field" })
luaop.on.update(r, function() end, { id = "update", field = "spec.items" })
luaop.on.create(r, function() end, { id = "plain" })
`)
	for id, want := range map[string]string{"timer": "status.phase", "daemon": "spec.size", "event": "metadata.labels.app",
		"field": "spec.mode", "update": "spec.items", "plain": ""} {
		spec := specOf(t, rt, id)
		if got := strings.Join(spec.NamedField, "."); got != want {
			t.Errorf("%s: NamedField %q, want %q", id, got, want)
		}
		changeOrNot := spec.Kind == causes.KindChange
		if gotField := strings.Join(spec.Field, "."); changeOrNot && gotField != want || !changeOrNot && gotField != "" {
			t.Errorf("%s (%s): Field %q", id, spec.Kind, gotField)
		}
	}
}

// kopf's two decorators on one function (@kopf.on.resume and @kopf.on.create, its
// builtins example) make one handler of both causes: in Lua, the same function
// registered for two causes under one id, with the same options, is one handler
// serving both, with one progress record. Another function, or other options,
// under that id is a duplicate.
func TestOneFunctionRegisteredForTwoCausesUnderOneID(t *testing.T) {
	rt := loadedRuntime(t, Options{}, "pods.lua", `
local luaop = require("luaop")
local function pod_in_sight(ctx) return ctx.reason end
luaop.on.resume("v1/pods", pod_in_sight, { id = "pod_in_sight", retries = 3 })
luaop.on.create("v1/pods", pod_in_sight, { id = "pod_in_sight", retries = 3 })
`)
	spec := specOf(t, rt, "pod_in_sight")
	if len(rt.Specs()) != 1 || !spec.Serves(causes.Resume) || !spec.Serves(causes.Create) || spec.Serves(causes.Update) || spec.Source != "pods.lua:4" {
		t.Fatalf("specs %v, pod_in_sight %+v: want one handler of resume and create, registered at its first line", specIDs(rt.Specs()), spec)
	}
	for _, tc := range []struct{ name, src string }{
		{"another function", `luaop.on.create("v1/pods", function() end, { id = "x" })
luaop.on.resume("v1/pods", function() end, { id = "x" })`},
		{"other options", `local function f() end
luaop.on.create("v1/pods", f, { id = "x", retries = 1 })
luaop.on.resume("v1/pods", f, { id = "x", retries = 2 })`},
		{"another kind", `local function f() end
luaop.on.create("v1/pods", f, { id = "x" })
luaop.timer("v1/pods", f, { id = "x", interval = 1 })`},
	} {
		_, err := newTestRuntime(t, Options{}).Load(t.Context(), scriptsOf("d.lua", "local luaop = require('luaop')\n"+tc.src))
		if err == nil || !strings.Contains(err.Error(), `duplicate handler id "x"`) {
			t.Errorf("%s: err = %v, want a duplicate id", tc.name, err)
		}
	}
}

// What one object's index function returns stays in the operator's memory while the
// object exists, so it is bound as a handler's result is (1.5 MiB as JSON), in all:
// entries under keys that are tables are converted one by one, against one budget,
// not each against its own. Within the bound, both kinds of keys are kept.
func TestIndexResultIsBoundAsAWhole(t *testing.T) {
	rt := loadedRuntime(t, Options{}, "idx.lua", `
local luaop = require("luaop")
local function big(n) return string.rep("x", n * 1024) end
luaop.index("`+widgetsResource+`", function(ctx) return { [{ctx.namespace, ctx.name}] = big(2048) } end, { id = "one_large" })
luaop.index("`+widgetsResource+`", function(ctx)
  local out = {}
  for i = 1, 4 do out[{ctx.name, i}] = big(512) end -- 2 MiB in all, 512 KiB each
  return out
end, { id = "many_tuples" })
luaop.index("`+widgetsResource+`", function(ctx)
  local out = { plain = big(256) }
  for i = 1, 4 do out[i * 10] = big(256) end -- 1.25 MiB; numbers: keys that are not strings
  return out
end, { id = "mixed_within" })
luaop.index("`+widgetsResource+`", function(ctx) return { plain = big(2048) } end, { id = "strings_large" })
`)
	for _, tt := range []struct {
		id      string
		wantErr bool
	}{
		{"one_large", true},
		{"many_tuples", true},
		{"mixed_within", false},
		{"strings_large", true},
	} {
		t.Run(tt.id, func(t *testing.T) {
			res, err := rt.Invoke(t.Context(), causes.Call{Handler: specOf(t, rt, tt.id), Cause: createCause("u-" + tt.id), Patch: state.NewPatch()})
			if !tt.wantErr {
				entries, ok := res.Value.(map[string]any)
				if err != nil || !ok || len(entries) != 5 {
					t.Fatalf("within the bound: %d entries, %v; want 5, no error", len(entries), err)
				}
				return
			}
			var pe *causes.PermanentError
			if !errors.As(err, &pe) || !strings.Contains(err.Error(), "value too large") || !strings.Contains(err.Error(), "index entries stay in the operator's memory") {
				t.Fatalf("error = %v (%T), want a permanent error: value too large, naming the operator's memory", err, err)
			}
		})
	}
}
