package luabind

import (
	"strings"
	"testing"
)

// isoAttacker tries, in a.lua, every way a script could change what another script
// sees; each attack runs under pcall and reports "ok" or its error. attack(ctx) runs
// at load time (ctx nil) and again inside a handler.
const isoAttacker = `local luaop = require("luaop")
local attacks = {
  {"string metatable __index", function() getmetatable("").__index.upper = function() return "pwned" end end},
  {"string metatable replaced field", function() getmetatable("").__index = {} end},
  {"string library field", function() string.upper = nil end},
  {"string library rawset", function() rawset(string, "upper", nil) end},
  {"table library field", function() table.insert = nil end},
  {"table.insert into a library", function() table.insert(string, 1) end},
  {"math library field", function() math.floor = nil end},
  {"os library field", function() os.time = nil end},
  {"luaop module field", function() luaop.on = nil end},
  {"luaop module nested field", function() luaop.kube.get = nil end},
  {"luaop required again", function() require("luaop").timer = nil end},
  {"luaop.array on a library", function() luaop.array(string) end},
  {"ctx.logger field", function(ctx) if ctx then ctx.logger.info = nil else error("no ctx at load") end end},
  {"ctx metatable", function(ctx) if ctx then getmetatable(ctx).__index = nil else error("no ctx at load") end end},
  {"ctx.patch metatable", function(ctx) if ctx then getmetatable(ctx.patch).__index = nil else error("no ctx at load") end end},
  {"JSON marker metatable", function() getmetatable(luaop.array()).__index = function() return 1 end end},
  {"marker userdata metatable", function() getmetatable(luaop.PRESENT).__tostring = nil end},
  {"setmetatable on strings", function() setmetatable("", {__index = {upper = function() return "pwned" end}}) end},
  {"setmetatable on numbers", function() setmetatable(1, {__index = {x = 1}}) end},
  {"setmetatable on _G", function() setmetatable(_G, nil) end},
  {"rawset on _G", function() rawset(_G, "x_raw", 1) end},
  {"global assignment", function() x_global = 1 end},
  {"_G.print", function() _G.print = nil end},
  {"getfenv of a Go function", function() getfenv(print).tostring = nil end},
  {"getfenv level 0", function() getfenv(0).x_env0 = 1 end},
  {"setfenv level 0", function() setfenv(0, {}) end},
  {"setfenv of a luaop helper", function() setfenv(luaop.adopt, {}) end},
  {"getfenv of a luaop helper", function() getfenv(luaop.adopt).type = nil end},
  {"loadstring writing a library", function() loadstring("string.lower = nil")() end},
  {"loadstring defining a global", function() loadstring("x_load = 1")() end},
  {"package", function() package.loaded.string.upper = nil end},
  {"module", function() module("string") end},
}
function attack(ctx)
  local out = {}
  for _, a in ipairs(attacks) do
    local ok, err = pcall(a[2], ctx)
    out[a[1]] = ok and "ok" or tostring(err)
  end
  -- What the attacker itself sees afterwards: its own changes stay visible to it.
  out.self = table.concat({type(x_raw), type(x_global), type(print), type(x_env0), type(x_load)}, ",")
  return out
end
at_load = attack(nil)
luaop.on.create("example.com/v1/widgets", function(ctx) return {load = at_load, call = attack(ctx)} end, {id = "a"})
`

// isoProbe (b.lua) reads everything the attacks aimed at.
const isoProbe = `local luaop = require("luaop")
local function probe(ctx)
  return table.concat({
    ("x"):upper(), string.upper("y"), string.lower("Z"), type(table.insert), type(math.floor), type(os.time),
    type(luaop.on), type(luaop.kube.get), type(luaop.timer), type(print), tostring(getfenv(print) == _G),
    type(x_raw), type(x_global), type(x_env0), type(x_load), type(tostring), type(type),
    tostring(luaop.PRESENT), tostring(#luaop.array({1, 2})), type(ctx.logger.info), ctx.uid,
    tostring(ctx.patch.status ~= nil), tostring(getmetatable("x") ~= nil), tostring(("a"):rep(3)),
  }, ",")
end
luaop.on.create("example.com/v1/widgets", function(ctx) return probe(ctx) end, {id = "b"})
`

const isoProbeWant = "X,Y,z,function,function,function,userdata,function,function,function,true,nil,nil,nil,nil,function,function,luaop.PRESENT,2,function,u1,true,true,aaa"

// Each script has its own globals and reads the shared libraries and the luaop
// module through read-only views: an attack in one script fails or changes only that
// script, at load time and inside a handler alike, and the next script (on the same
// Lua state: one shard) sees everything as before.
func TestIsolationBetweenScripts(t *testing.T) {
	rt := loadedRuntime(t, Options{Shards: 1}, "a.lua", isoAttacker, "b.lua", isoProbe)
	before := mustInvoke(t, rt, "b", createCause("u1")).Value
	if before != isoProbeWant {
		t.Fatalf("b before the attacks ran in a handler:\n got %v\nwant %v", before, isoProbeWant)
	}
	res := mustInvoke(t, rt, "a", createCause("u1")).Value.(map[string]any)
	// Every attack fails (with this in its message) or stays local ("ok": the
	// attacker's own globals only).
	want := map[string]string{
		"string metatable __index":        "cannot set string.upper: string is shared by every script and read-only",
		"string metatable replaced field": `cannot set getmetatable("").__index`,
		"string library field":            "cannot set string.upper",
		"string library rawset":           "table expected, got userdata",
		"table library field":             "cannot set table.insert",
		"table.insert into a library":     "table expected, got userdata",
		"math library field":              "cannot set math.floor",
		"os library field":                "cannot set os.time",
		"luaop module field":              "cannot set luaop.on",
		"luaop module nested field":       "cannot set luaop.kube.get",
		"luaop required again":            "cannot set luaop.timer",
		"luaop.array on a library":        "table or nil expected, got userdata",
		"JSON marker metatable":           "attempt to index a non-table object(boolean)",
		"marker userdata metatable":       "attempt to index a non-table object(boolean)",
		"setmetatable on strings":         "table expected, got string",
		"setmetatable on numbers":         "table expected, got number",
		"setmetatable on _G":              "cannot change a protected metatable",
		"rawset on _G":                    "ok",
		"global assignment":               "ok",
		"_G.print":                        "ok",
		"getfenv of a Go function":        "ok",
		"getfenv level 0":                 "ok",
		"setfenv level 0":                 "setfenv: only the environment of a script's own functions can change",
		"setfenv of a luaop helper":       "setfenv: only the environment of a script's own functions can change",
		"getfenv of a luaop helper":       "ok",
		"loadstring writing a library":    "cannot set string.lower",
		"loadstring defining a global":    "ok",
		"package":                         "attempt to index a non-table object(nil)",
		"module":                          "attempt to call a non-function object",
		"ctx.logger field":                "cannot set ctx.logger.info",
		"ctx metatable":                   "attempt to index a non-table object(boolean)",
		"ctx.patch metatable":             "attempt to index a non-table object(boolean)",
	}
	for _, phase := range []string{"load", "call"} {
		got := res[phase].(map[string]any)
		for name, w := range want {
			msg, _ := got[name].(string)
			if phase == "load" && strings.HasPrefix(name, "ctx") {
				w = "no ctx at load"
			}
			if w == "ok" && msg != "ok" || w != "ok" && !strings.Contains(msg, w) {
				t.Errorf("%s, %s: got %q, want %q", phase, name, msg, w)
			}
			if w != "ok" && !strings.Contains(msg, "a.lua:") && !strings.HasPrefix(name, "loadstring") {
				t.Errorf("%s, %s: error %q does not name the script's file:line", phase, name, msg)
			}
		}
		if len(got) != len(want)+1 {
			t.Errorf("%s: %d results, want %d: an attack is not checked", phase, len(got), len(want)+1)
		}
		// The changes that were allowed are the attacker's own: it sees them. (A
		// global of the base set to nil reads through to the base again: print stays.)
		if self := got["self"]; self != "number,number,function,number,number" {
			t.Errorf("%s: the attacker's own view = %v", phase, self)
		}
	}
	after := mustInvoke(t, rt, "b", createCause("u1")).Value
	if after != isoProbeWant {
		t.Errorf("b after the attacks:\n got %v\nwant %v", after, isoProbeWant)
	}
	// A reload runs a.lua's attacks again into fresh environments: still nothing leaks.
	mustLoad(t, rt, "a.lua", isoAttacker, "b.lua", isoProbe)
	if got := mustInvoke(t, rt, "b", createCause("u2")).Value; got != strings.Replace(isoProbeWant, ",u1,", ",u2,", 1) {
		t.Errorf("b after a reload:\n got %v", got)
	}
}

// Files share values through modules only: a module runs once per load, every file
// that requires it gets the same value (a table one file changes, the other sees),
// and the module's globals are its own.
func TestIsolationModulesAreShared(t *testing.T) {
	rt := loadedRuntime(t, Options{Shards: 1},
		"a.lua", `local luaop = require("luaop")
local counter = require("lib.counter")
counter.n = counter.n + 1
helper_a = true
luaop.on.create("example.com/v1/widgets", function(ctx) counter.n = counter.n + 10; return counter.n end, {id = "a"})
`,
		"b.lua", `local luaop = require("luaop")
local counter = require("lib.counter")
luaop.on.create("example.com/v1/widgets", function(ctx)
  return {n = counter.n, runs = counter.runs, helper_a = type(helper_a), module_global = type(module_global),
          module_sees = counter.sees()}
end, {id = "b"})
`,
		"lib/counter.lua", `runs = (runs or 0) + 1
module_global = true
local M = {n = 0, runs = runs}
function M.sees() return type(helper_a) .. "," .. type(module_global) end
return M
`)
	if got := mustInvoke(t, rt, "a", createCause("u1")).Value; got != int64(11) {
		t.Fatalf("a = %#v, want 11", got)
	}
	got := mustInvoke(t, rt, "b", createCause("u1")).Value.(map[string]any)
	want := map[string]any{"n": int64(11), "runs": int64(1), "helper_a": "nil", "module_global": "nil", "module_sees": "nil,boolean"}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("b's %s = %#v, want %#v", k, got[k], w)
		}
	}
}

// pairs lists a library's functions through its read-only view, and the views say
// what they are.
func TestIsolationViewsAreUsable(t *testing.T) {
	rt := loadedRuntime(t, Options{Shards: 1}, "a.lua", `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function(ctx)
  local n = 0
  for k, v in pairs(string) do if type(v) == "function" then n = n + 1 end end
  local kube = 0
  for k in pairs(luaop.kube) do kube = kube + 1 end
  local lower = string.lower
  local env_ok = getfenv(1) == _G and getfenv() == _G
  local chunk = loadstring("return x_here")
  x_here = 7
  return {string_functions = n > 10, kube_functions = kube > 3, name = tostring(string), lower = lower("A"),
          env = env_ok, loaded_chunk_env = chunk(), marked = setmetatable(luaop.array(), nil) ~= nil}
end, {id = "a"})
`)
	got := mustInvoke(t, rt, "a", createCause("u1")).Value.(map[string]any)
	want := map[string]any{"string_functions": true, "kube_functions": true, "name": "string (read-only)", "lower": "a",
		"env": true, "loaded_chunk_env": int64(7), "marked": true}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s = %#v, want %#v", k, got[k], w)
		}
	}
}
