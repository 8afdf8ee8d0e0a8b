package luabind

import (
	"errors"
	"strings"
	"testing"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// Issue 16: handler ids that differ only in what an annotation name cannot hold ("a/b",
// "a.b", "a:b" all become a.b) would share one progress record in annotations storage,
// so one handler's success would stand for the other's: refused at load, and for
// subhandlers when the parent registers them.
func TestHandlerIDsSharingARecordAreRefused(t *testing.T) {
	rt := newTestRuntime(t, Options{Shards: 1})
	_, err := rt.Load(t.Context(), scriptsOf("ids.lua", `local luaop = require("luaop")
local R = "example.com/v1/widgets"
luaop.on.create(R, function() end, {id = "deploy.web"})
luaop.on.update(R, function() end, {id = "deploy/web"})
`))
	checkScriptError(t, err, "ids.lua", 4, `handler id "deploy/web" would share its progress record with handler "deploy.web" (first registered at ids.lua:3)`)

	mustLoad(t, rt, "subs.lua", `local luaop = require("luaop")
local R = "example.com/v1/widgets"
luaop.on.create(R, function() end, {id = "p.a"})
luaop.on.create(R, function(ctx) ctx.subhandler(function() end, {id = "a"}) end, {id = "p"})
luaop.on.create(R, function(ctx)
  ctx.subhandler(function() end, {id = "x.y"})
  ctx.subhandler(function() end, {id = "x_y"})
  ctx.subhandler(function() end, {id = "x-y"})
end, {id = "q"})
`)
	_, _, err = invokeHandler(t, rt, "p", createCause("u1"))
	checkScriptError(t, err, "subs.lua", 4, `subhandler id "p/a" would share its progress record with handler "p.a"`)
	// Ids that stay distinct as annotation names are fine.
	if res := mustInvoke(t, rt, "q", createCause("u1")); len(res.Subhandlers) != 3 {
		t.Errorf("q registered %d subhandlers, want 3", len(res.Subhandlers))
	}
	// The long ids shortened with a hash never collide (state.TestAnnotationKey).
	long := strings.Repeat("h", 70)
	if recordName(long+"/one") == recordName(long+"/two") {
		t.Error("long ids sharing a prefix collide")
	}
}

// Issue 16, a malformed object: fields of the wrong type (a string where the handler
// expects a number, a list where it expects an object, null) give the handler's own
// Lua error with file:line, never a panic, and a handler that checks types handles
// them.
func TestMalformedObjectGivesAScriptError(t *testing.T) {
	rt := loadedRuntime(t, Options{Shards: 1}, "m.lua", `local luaop = require("luaop")
local R = "example.com/v1/widgets"
luaop.on.create(R, function(ctx) return ctx.spec.size * 2 end, {id = "arith"})
luaop.on.create(R, function(ctx) return ctx.spec.items.first.name end, {id = "index"})
luaop.on.create(R, function(ctx) return #ctx.spec.mode end, {id = "len"})
luaop.on.create(R, function(ctx)
  local n = tonumber(ctx.spec.size)
  if type(ctx.spec.items) ~= "table" or n == nil then error(luaop.permanent_error("spec.size must be a number")) end
  return n
end, {id = "checked"})
luaop.on.create(R, function(ctx)
  local out = {}
  for k, v in pairs(ctx.spec) do out[#out + 1] = k .. "=" .. type(v) end
  table.sort(out)
  return table.concat(out, ",")
end, {id = "walk"})
`)
	bad := widgetObject("u1")
	bad["spec"] = map[string]any{"size": "three", "items": map[string]any{"first": nil}, "mode": nil, "extra": []any{nil, true}}
	cause := causes.Cause{Reason: causes.Create, Body: bad}
	for _, tc := range []struct {
		id   string
		line int
		want string
	}{
		{"arith", 3, "cannot perform mul operation between string and number"},
		{"index", 4, "null"},
		{"len", 5, "__len undefined"},
	} {
		_, _, err := invokeHandler(t, rt, tc.id, cause)
		checkScriptError(t, err, "m.lua", tc.line, tc.want)
	}
	_, _, err := invokeHandler(t, rt, "checked", cause)
	if !causes.IsPermanent(err) || !strings.Contains(err.Error(), "spec.size must be a number") {
		t.Errorf("checked: %v", err)
	}
	if res := mustInvoke(t, rt, "walk", cause); res.Value != "extra=table,items=table,mode=userdata,size=string" {
		t.Errorf("walk = %#v", res.Value)
	}
	// A body that is not even an object's shape.
	for _, body := range []map[string]any{
		{"metadata": "not a map", "spec": []any{1, 2}},
		{"spec": map[string]any{"size": map[string]any{"deep": []any{map[string]any{}}}}},
	} {
		_, _, err := invokeHandler(t, rt, "arith", causes.Cause{Reason: causes.Create, Body: body})
		var se *ScriptError
		if !errors.As(err, &se) || se.File != "m.lua" {
			t.Errorf("body %v: %v, want a script error at m.lua", body, err)
		}
	}
}

// Issue 16, a 1 MB object: a handler reads a field of it, copies part of it into the
// patch and returns a 1 MB string; every value comes back whole.
func TestOneMegabyteObject(t *testing.T) {
	rt := loadedRuntime(t, Options{Shards: 1}, "big.lua", `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function(ctx)
  local n = 0
  for _, item in ipairs(ctx.spec.items) do n = n + #item.data end
  ctx.patch.status.count = #ctx.spec.items
  ctx.patch.status.copy = ctx.spec.items[512].data
  return {bytes = n, blob = string.rep("b", 1024 * 1024)}
end, {id = "big"})
`)
	items := make([]any, 1024)
	for i := range items {
		items[i] = map[string]any{"name": "item", "data": strings.Repeat("d", 1024)}
	}
	body := widgetObject("u1")
	body["spec"] = map[string]any{"items": items}
	patch := state.NewPatch()
	res, err := rt.Invoke(t.Context(), causes.Call{Handler: specOf(t, rt, "big"), Cause: causes.Cause{Reason: causes.Create, Body: body}, Patch: patch})
	if err != nil {
		t.Fatal(err)
	}
	v := res.Value.(map[string]any)
	if v["bytes"] != int64(1024*1024) || len(v["blob"].(string)) != 1024*1024 {
		t.Errorf("bytes = %v, blob of %d bytes", v["bytes"], len(v["blob"].(string)))
	}
	status := patch.Map()["status"].(map[string]any)
	if status["count"] != int64(1024) || status["copy"] != strings.Repeat("d", 1024) {
		t.Errorf("patch status: count %v, copy of %d bytes", status["count"], len(status["copy"].(string)))
	}
}

// Issue 16, coroutine or yield misuse: the sandbox has no coroutine library, so a
// script using it fails with file:line, at load or in a handler (luaop check says
// "coroutine is not available"), and nothing a script can reach yields (blocking
// functions release the Lua state without yielding, so they work inside pcall:
// TestKubeCallReleasesShard, TestDaemonSleepReleasesShardAndFlushes).
func TestCoroutineMisuseGivesAScriptError(t *testing.T) {
	rt := newTestRuntime(t, Options{Shards: 1})
	_, err := rt.Load(t.Context(), scriptsOf("co.lua", "local luaop = require('luaop')\nlocal co = coroutine.create(function() end)\n"))
	checkScriptError(t, err, "co.lua", 2, "with key 'create'")
	mustLoad(t, rt, "co.lua", `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function(ctx) return coroutine.yield(1) end, {id = "yield"})
luaop.on.create("example.com/v1/widgets", function(ctx)
  local ok, err = pcall(function() return coroutine.wrap(print) end)
  return tostring(ok)
end, {id = "pcalled"})
`)
	_, _, err = invokeHandler(t, rt, "yield", createCause("u1"))
	checkScriptError(t, err, "co.lua", 2, "with key 'yield'")
	if res := mustInvoke(t, rt, "pcalled", createCause("u1")); res.Value != "false" {
		t.Errorf("pcalled = %#v", res.Value)
	}
	// luaop check's side: scriptcheck's TestCheckReportsCoroutine.
}
