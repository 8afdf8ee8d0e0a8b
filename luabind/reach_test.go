package luabind

import (
	"slices"
	"strings"
	"testing"
)

// Issue 45: a daemon's code hash (what a reload restarts it on, and what a handler
// waiting in its backoff is retried on) changes with anything its function can
// reach, and with nothing else.

// reachScripts are a daemon calling a helper of its file, a global helper, a
// module required at the top and one required inside it, reading a configuration
// table; a function of its file it never calls; another file; and a module it never
// requires.
var reachScripts = []string{
	"backup.lua", `local luaop = require("luaop")
local util = require("lib.util")
local CONFIG = { image = "busybox", retries = 3 }

local function job_for(name)
  return { command = "echo backup " .. name, image = CONFIG.image }
end

function global_helper(x) return x .. "!" end

local function unused(x) return x .. " never called" end

luaop.daemon("example.com/v1/widgets", function(ctx)
  local lazy = require("lib.lazy")
  while luaop.sleep(5) do
    local job = job_for(ctx.name)
    job.tag = util.tag(global_helper(lazy.suffix))
    job.kind = "other" -- the name of a handler script: not a module it requires
  end
end, { id = "backup" })

luaop.on.create("example.com/v1/widgets", function(ctx) return unused("x") end, { id = "other" })
`,
	"other.lua", `local luaop = require("luaop")
luaop.on.create("example.com/v1/gadgets", function(ctx) return "other file" end, { id = "gadgets" })
`,
	"lib/util.lua", `local M = {}
function M.tag(s) return s .. "-v1" end
return M
`,
	"lib/lazy.lua", `return { suffix = "lazy-v1" }
`,
	"lib/unrelated.lua", `return { nothing = true }
`,
}

func TestReachChangesTheCodeHashExactlyWithWhatADaemonCanRun(t *testing.T) {
	edit := func(file, old, new string) func([]string) []string {
		return func(files []string) []string {
			files = slices.Clone(files)
			i := slices.Index(files, file) + 1
			if i == 0 || !strings.Contains(files[i], old) {
				t.Fatalf("%s has no %q", file, old)
			}
			files[i] = strings.Replace(files[i], old, new, 1)
			return files
		}
	}
	for _, tt := range []struct {
		name    string
		edit    func([]string) []string
		changes bool
	}{
		{"a local helper of its file", edit("backup.lua", `"echo backup "`, `"echo backup v2 "`), true},
		{"a global helper of its file", edit("backup.lua", `x .. "!"`, `x .. "?"`), true},
		{"a configuration table it reads", edit("backup.lua", `image = "busybox"`, `image = "alpine"`), true},
		{"a field of that table it does not read (conservative)", edit("backup.lua", `retries = 3`, `retries = 4`), true},
		{"a module required at the top", edit("lib/util.lua", `"-v1"`, `"-v2"`), true},
		{"a module required inside the daemon", edit("lib/lazy.lua", `lazy-v1`, `lazy-v2`), true},
		{"its own code", edit("backup.lua", `luaop.sleep(5)`, `luaop.sleep(6)`), true},
		{"a function of its file it never calls", edit("backup.lua", `" never called"`, `" still never called"`), false},
		{"lines moved, a comment added", edit("backup.lua", "local CONFIG", "-- a comment\n\n\nlocal CONFIG"), false},
		{"another file", edit("other.lua", `"other file"`, `"other file, edited"`), false},
		{"a module it never requires", edit("lib/unrelated.lua", "true", "false"), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rt := newTestRuntime(t, Options{Shards: 2})
			mustLoad(t, rt, reachScripts...)
			before := specOf(t, rt, "backup").CodeHash
			mustLoad(t, rt, tt.edit(reachScripts)...)
			after := specOf(t, rt, "backup").CodeHash
			if changed := after != before; changed != tt.changes {
				t.Errorf("code hash changed: %v, want %v (%s -> %s)", changed, tt.changes, before, after)
			}
			// A fresh runtime loading the edited scripts agrees (no state carried).
			fresh := newTestRuntime(t, Options{Shards: 1})
			mustLoad(t, fresh, tt.edit(reachScripts)...)
			if got := specOf(t, fresh, "backup").CodeHash; got != after {
				t.Errorf("a fresh load hashes %s, the reload %s", got, after)
			}
		})
	}
}

// A function whose code names _G may reach any global of its file: every global
// of the file counts; and a helper that refers to itself (recursion, a cycle of
// tables) is walked once.
func TestReachOfDynamicGlobalsAndCycles(t *testing.T) {
	script := `local luaop = require("luaop")
function helper() return "v1" end
local t = {}
t.self = t
local function rec(n) if n > 0 then return rec(n - 1) end return t end
luaop.daemon("example.com/v1/widgets", function(ctx)
  rec(3)
  return _G["helper"]()
end, { id = "dyn" })
`
	rt := newTestRuntime(t, Options{Shards: 1})
	mustLoad(t, rt, "d.lua", script)
	before := specOf(t, rt, "dyn").CodeHash
	mustLoad(t, rt, "d.lua", strings.Replace(script, `"v1"`, `"v2"`, 1))
	if specOf(t, rt, "dyn").CodeHash == before {
		t.Errorf("a global reached through _G changed, the code hash did not")
	}
}

// The instruction decoding of reach.go agrees with the compiler: the globals a
// compiled function names are found.
func TestReachFindsGlobals(t *testing.T) {
	proto, _, err := compile(t.Context(), Script{Name: "g.lua", Source: []byte(`
function f() return helper(x) end
y = 1
`)})
	if err != nil {
		t.Fatal(err)
	}
	names := globalNames(proto, nil)
	slices.Sort(names)
	names = slices.Compact(names)
	if want := []string{"f", "helper", "x", "y"}; !slices.Equal(names, want) {
		t.Errorf("globals %v, want %v", names, want)
	}
}
