package scriptcheck

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/luabind/adversary"
)

// scriptsOf makes scripts of name, source pairs.
func scriptsOf(pairs ...string) []luabind.Script {
	var out []luabind.Script
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, luabind.Script{Name: pairs[i], Source: []byte(pairs[i+1])})
	}
	return out
}

// luaop check reports, with file:line, each problem once and in order: what the
// operator would refuse at load and what would only fail (or be ignored) at run
// time (issue 14); a global read in one file and defined only in another, each
// script having its own globals (issue 16); the options that do not apply to
// admission handlers; every file's load-time error, not only the first the load
// meets.
func TestCheckReports(t *testing.T) {
	for _, tc := range []struct {
		name    string
		scripts []luabind.Script
		want    []string // the problems' beginnings, in order
	}{{
		name: "every problem",
		scripts: scriptsOf("a.lua", `local luaop = require("luaop")
local R = "example.com/v1/widgets"
luaop.on.create(R, function(ctx)
  local f = io.open("/etc/passwd")
  local home = os.getenv("HOME")
  local t = os.time()
end, { id = "greet", interval = 10 })
luaop.on.update("widgets", function(ctx) end, { id = "u" })
luaop.timer(R, function(ctx) end, { id = "t", interval = 5, optional = true })
luaop.on.delete(R, function(ctx) end, { id = "greet" })
`, "b.lua", "local x = 7 // 2\n", "c.lua", "local y <const> = 1\n"),
		want: []string{
			"a.lua:4: io is not available",
			"a.lua:5: os.getenv is not available in luaop's sandbox (its os has clock, date, time)",
			"a.lua:7: luaop.on.create: option interval does not apply here (only to timers)",
			`a.lua:8: luaop.on.update: resource "widgets": write it as`,
			"a.lua:9: luaop.timer: option optional does not apply here (only to on.delete)",
			`a.lua:10: duplicate handler id "greet" (first registered at a.lua:3)`,
			"b.lua:1: '//' (floor division, Lua 5.3) is not Lua 5.1",
			"c.lua:1: local attributes <const>/<close> (Lua 5.4)",
		},
	}, {
		// A recursive local function sees itself, not a global of its name; an
		// undefined global in its body is still reported.
		name: "recursive local function",
		scripts: scriptsOf("a.lua", "local luaop = require('luaop')\nlocal function fact(n) if n <= 1 then return 1 end return n * fact(n - 1) end\n"+
			"luaop.on.create('v1/configmaps', function() return fact(3) + io.x end)\n"),
		want: []string{"a.lua:3: io is not available in luaop's sandbox"},
	}, {
		name: "globals of other files",
		scripts: scriptsOf("a.lua", "PREFIX = 'x'\nlocal function f() return PREFIX end\n",
			"b.lua", "local luaop = require('luaop')\nluaop.on.create('v1/configmaps', function() return PREFIX end)\nlocal p = package.loaded\n"),
		want: []string{
			"b.lua:2: PREFIX is a global of a.lua, and each script has its own globals: share it through a module",
			"b.lua:3: package is not available in luaop's sandbox",
			"b.lua:3: attempt to index a non-table object(nil) with key 'loaded'", // the load's own error
		},
	}, {
		// retries/backoff/errors do not apply to admission handlers; timeout does
		// (the webhook's); the admission options apply to them only.
		name: "admission options",
		scripts: scriptsOf("a.lua", `local luaop = require("luaop")
luaop.on.validate("example.com/v1/widgets", function(ctx) end, { id = "v", retries = 3, timeout = 5, failure_policy = "Ignore" })
luaop.on.mutate("example.com/v1/widgets", function(ctx) end, { id = "m", operations = "CREATE", side_effects = true, subresource = "status" })
luaop.daemon("example.com/v1/widgets", function(ctx) end, { id = "d", side_effects = true })
`),
		want: []string{
			"a.lua:2: luaop.on.validate: option retries does not apply here",
			"a.lua:4: luaop.daemon: option side_effects does not apply here (only to admission handlers (on.validate, on.mutate))",
		},
	}, {
		name: "every load error",
		scripts: scriptsOf("a.lua", "local luaop = require('luaop')\nerror('first broken file')\n",
			"b.lua", "local luaop = require('luaop')\nlocal x = nil\nlocal y = x.field\n",
			"c.lua", "local luaop = require('luaop')\nluaop.on.create('v1/configmaps', function(ctx) end, {id = 'fine'})\n"),
		want: []string{"a.lua:2: first broken file", "b.lua:3: "},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			rep := Check(t.Context(), tc.scripts, luabind.Options{})
			var got []string
			for _, p := range rep.Problems {
				got = append(got, p.String())
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %d problems, want %d:\n%s", len(got), len(tc.want), strings.Join(got, "\n"))
			}
			for i := range tc.want {
				if !strings.HasPrefix(got[i], tc.want[i]) {
					t.Errorf("problem %d:\n got %s\nwant %s...", i, got[i], tc.want[i])
				}
			}
		})
	}
}

// What only running the scripts shows (an error raised at load, a timer without
// interval) comes from the real load, with its file and line.
func TestCheckReportsLoadErrors(t *testing.T) {
	rep := Check(t.Context(), []luabind.Script{
		{Name: "ok.lua", Source: []byte("local luaop = require('luaop')\nluaop.on.create('v1/configmaps', function() end)\n")},
		{Name: "t.lua", Source: []byte("local luaop = require('luaop')\n\nluaop.timer('v1/configmaps', function() end, {id = 'x'})\n")},
	}, luabind.Options{})
	if len(rep.Problems) != 1 || rep.Problems[0].File != "t.lua" || rep.Problems[0].Line != 3 ||
		!strings.Contains(rep.Problems[0].Message, "needs an interval or idle") {
		t.Fatalf("problems: %v", rep.Problems)
	}
	rep = Check(t.Context(), []luabind.Script{{Name: "ok.lua", Source: []byte("local luaop = require('luaop')\nluaop.on.create('v1/configmaps', function() end)\n")}}, luabind.Options{})
	if len(rep.Problems) != 0 || len(rep.Handlers) != 1 {
		t.Fatalf("a good script: %+v", rep)
	}
}

// Static resolution of luaop.kube calls (used by luaop rbac): literals, locals,
// and objects built by local functions through luaop.adopt.
func TestAnalyzeKubeCalls(t *testing.T) {
	a := Analyze([]luabind.Script{{Name: "k.lua", Source: []byte(`local luaop = require("luaop")
local CM = "ConfigMap"
local function desired(ctx)
  local cm = { apiVersion = "v1", kind = CM, metadata = {} }
  return luaop.adopt(cm)
end
luaop.on.create("v1/secrets", function(ctx)
  luaop.kube.apply(desired(ctx))
  luaop.kube.get("apps/v1", "Deployment", "ns", "n")
  luaop.kube.delete(ctx.spec.apiVersion, ctx.spec.kind, "ns", "n")
end)
`)}})
	if len(a.Problems) != 0 {
		t.Fatalf("problems: %v", a.Problems)
	}
	want := []KubeCall{
		{File: "k.lua", Line: 8, Verb: "apply", APIVersion: "v1", Kind: "ConfigMap", Resolved: true},
		{File: "k.lua", Line: 9, Verb: "get", APIVersion: "apps/v1", Kind: "Deployment", Resolved: true},
		{File: "k.lua", Line: 10, Verb: "delete"},
	}
	if len(a.KubeCalls) != len(want) {
		t.Fatalf("kube calls: %+v", a.KubeCalls)
	}
	for i := range want {
		if a.KubeCalls[i] != want[i] {
			t.Errorf("call %d: got %+v, want %+v", i, a.KubeCalls[i], want[i])
		}
	}
}

// luaop check agrees with the load: one local function for two causes under one id
// is no duplicate; two functions under one id are.
func TestCheckAcceptsOneFunctionForTwoCauses(t *testing.T) {
	a := Analyze(scriptsOf("pods.lua", `local luaop = require("luaop")
local function f(ctx) end
luaop.on.resume("v1/pods", f, { id = "f" })
luaop.on.create("v1/pods", f, { id = "f" })
luaop.on.create("v1/pods", function() end, { id = "g" })
luaop.on.update("v1/pods", function() end, { id = "g" })
`))
	var dups []string
	for _, p := range a.Problems {
		if strings.Contains(p.Message, "duplicate handler id") {
			dups = append(dups, p.Message)
		}
	}
	if len(dups) != 1 || !strings.Contains(dups[0], `"g"`) {
		t.Errorf("duplicates reported: %q; want only g's", dups)
	}
}

// The sandbox has no coroutine library: luaop check says so (the runtime's side:
// luabind's TestCoroutineMisuseGivesAScriptError).
func TestCheckReportsCoroutine(t *testing.T) {
	rep := Check(t.Context(), scriptsOf("co.lua", "local co = coroutine.create(print)\n"), luabind.Options{})
	if len(rep.Problems) == 0 || !strings.Contains(rep.Problems[0].String(), "co.lua:1: coroutine is not available") {
		t.Errorf("luaop check: %v", rep.Problems)
	}
}

// Loading attacks (luabind's TestAdversarialLoads runs them through the operator's
// load): luaop check and the scripts guard compile the same way, and fail (or
// succeed) as the load does, naming file:line.
func TestAdversarialLoadsCheck(t *testing.T) {
	timeout := 5 * time.Second
	if raceDetector { // compiling the 589 KB data table is many times slower with it
		timeout = time.Minute
	}
	for _, c := range adversary.LoadCases {
		t.Run(c.Name, func(t *testing.T) {
			scripts := scriptsOf("a.lua", `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function() return "a" end, {id = "a"})`, "b.lua", c.Source())
			timeout := timeout
			if c.LongCompile {
				timeout = adversary.LongCompileDeadline
			}
			checkLoad := CheckLoad(t.Context(), scripts, luabind.Options{HandlerTimeout: timeout})
			rep := Check(t.Context(), scripts, luabind.Options{HandlerTimeout: timeout})
			if c.Want == "" {
				if checkLoad != nil || len(rep.Problems) > 0 {
					t.Fatalf("refused: guard %v, check %v", checkLoad, rep.Problems)
				}
				return
			}
			where := fmt.Sprintf("b.lua:%d: ", c.Line)
			if checkLoad == nil || !strings.HasPrefix(checkLoad.Error(), where) || !strings.Contains(checkLoad.Error(), c.Want) {
				t.Errorf("scripts guard: %v, want %s...%s", checkLoad, where, c.Want)
			}
			if len(rep.Problems) != 1 || rep.Problems[0].String() != where+rep.Problems[0].Message || !strings.Contains(rep.Problems[0].Message, c.Want) {
				t.Errorf("check: %v", rep.Problems)
			}
		})
	}
}

// Compiling is under the load's deadline (luabind's TestCompileUnderTheLoadDeadline):
// luaop check says so.
func TestCheckCompilesUnderTheLoadDeadline(t *testing.T) {
	var big strings.Builder
	for i := range 400_000 {
		fmt.Fprintf(&big, "local function f%d(ctx) return ctx.spec.size + %d end\n", i%150, i)
	}
	const deadline = 300 * time.Millisecond
	rep := Check(t.Context(), scriptsOf("big.lua", big.String()), luabind.Options{HandlerTimeout: deadline})
	if len(rep.Problems) != 1 || !strings.Contains(rep.Problems[0].Message, "compiling took longer than the 300ms load deadline") {
		t.Errorf("check: %v", rep.Problems)
	}
}

// Recursive local functions (local function f ... f() ... end, and gopher-lua's
// local f = function ... f() ... end, which it compiles the same way), mutually
// recursive and forward-declared locals are the scripts' own names, not globals the
// sandbox lacks (issue 44: an ordinary script failed CI). The scripts are real
// ones: the adversarial handlers (luabind/adversary, recursion in three of them) and
// the sandbox tests' recursions; a name no local binds is still reported.
func TestCheckAcceptsRecursiveLocals(t *testing.T) {
	adversarial, _ := adversary.Script(adversary.Cases)
	for _, tc := range []struct {
		name, src string
		want      []string // problems' beginnings
	}{
		{"the adversarial handlers", adversarial, nil},
		{"recursion", "local function f(n) return 1 + f(n + 1) end\nreturn f(1)\n", nil},
		{"recursion through pcall", "local function f() local ok, e = pcall(f); error(e, 0) end\nf()\n", nil},
		{"a chain of calls", "local function f() return f end\nreturn f()()()\n", nil},
		{"nested", "local luaop = require('luaop')\nluaop.on.create('v1/configmaps', function(ctx)\n  local function depth(n) if n == 0 then return 0 end return 1 + depth(n - 1) end\n  return { d = depth(3) }\nend)\n", nil},
		{"a function value bound to a local", "local g = function(n) if n > 0 then return g(n - 1) end return 0 end\nreturn g(2)\n", nil},
		{"mutual recursion, forward-declared", `local is_even, is_odd
function is_even(n) if n == 0 then return true end return is_odd(n - 1) end
function is_odd(n) if n == 0 then return false end return is_even(n - 1) end
local walk
local function visit(t) for _, v in pairs(t) do if type(v) == "table" then walk(v) end end end
walk = function(t) visit(t) end
return is_even(4), walk({})
`, nil},
		// Lua binds the other names after their initializers: the f of the body
		// is a global (nil at run time), as the check says.
		{"two names", "local f, n = function() return f() end, 1\nreturn f()\n", []string{"a.lua:1: f is not available"}},
		{"a local after its use", "local function a() return b() end\nlocal function b() return a() end\nreturn a()\n", []string{"a.lua:1: b is not available"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := Analyze(scriptsOf("a.lua", tc.src))
			var got []string
			for _, p := range a.Problems {
				got = append(got, p.String())
			}
			if len(got) != len(tc.want) {
				t.Fatalf("problems:\n%s\nwant %d: %v", strings.Join(got, "\n"), len(tc.want), tc.want)
			}
			for i := range tc.want {
				if !strings.HasPrefix(got[i], tc.want[i]) {
					t.Errorf("problem %d: got %s, want %s...", i, got[i], tc.want[i])
				}
			}
		})
	}
}
