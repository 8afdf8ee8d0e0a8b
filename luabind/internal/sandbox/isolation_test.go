package sandbox

import (
	"strings"
	"testing"

	lua "github.com/luaop/luaop/third_party/gopher-lua"

	"github.com/luaop/luaop/luabind/internal/luatest"
)

// Two scripts on one state, each in its own environment: what the first does (code)
// gives want (a value, or an error containing want) and leaves the second (probe)
// seeing probeWant. luabind's TestIsolationBetweenScripts runs the same kind of
// attacks through the whole runtime.
func TestIsolationEnvs(t *testing.T) {
	cases := []struct {
		name      string
		code      string
		want      string
		probe     string
		probeWant string
	}{
		{"global assignment", `x = 1; return x`, "1", `return type(x)`, "nil"},
		{"rawset on _G", `rawset(_G, "x", 1); return x`, "1", `return type(x)`, "nil"},
		{"_G is the script's environment", `return tostring(_G == getfenv())`, "true", `return type(_G.print)`, "function"},
		{"base global set to nil reads through", `print = nil; return type(print)`, "function", `return type(print)`, "function"},
		{"library field", `string.upper = nil`, "cannot set string.upper", `return string.upper("a")`, "A"},
		{"library rawset", `rawset(string, "upper", nil)`, "bad argument #1 to rawset", `return ("a"):upper()`, "A"},
		{"table.insert into a library", `table.insert(math, 1)`, "bad argument #1 to insert", `return type(math.floor)`, "function"},
		{"string metatable", `getmetatable("").__index.upper = nil`, "cannot set string.upper", `return ("b"):upper()`, "B"},
		{"module nested field", `luaop.kube.get = nil`, "cannot set luaop.kube.get", `return luaop.kube.get()`, "got"},
		{"module field", `luaop.version = 2`, "cannot set luaop.version", `return luaop.version`, "1"},
		{"pairs over a view", `local n = 0; for k in pairs(luaop.kube) do n = n + 1 end; return n`, "1", `return tostring(luaop.kube)`, "luaop.kube (read-only)"},
		{"getfenv of a Go function", `getfenv(print).y = 1; return y`, "1", `return type(y)`, "nil"},
		{"getfenv level 0", `getfenv(0).y = 1; return y`, "1", `return type(y)`, "nil"},
		{"setfenv level 0", `setfenv(0, {})`, "setfenv: only the environment of a script's own functions", `return type(print)`, "function"},
		{"setfenv of a Go function", `setfenv(print, {})`, "setfenv: only the environment", `return type(print)`, "function"},
		{"setfenv of a script function", `local function f() return z end; setfenv(f, {z = 5}); return f()`, "5", `return type(z)`, "nil"},
		{"loadstring compiles into the caller's env", `loadstring("y = 2")(); return y`, "2", `return type(y)`, "nil"},
		{"load compiles into the caller's env", `local done; load(function() if done then return nil end; done = true; return "y = 3" end)(); return y`, "3", `return type(y)`, "nil"},
		{"setmetatable on a protected metatable", `setmetatable(setmetatable({}, {__metatable = "no"}), {})`, "cannot change a protected metatable", `return "ok"`, "ok"},
		{"setmetatable replaces a replaceable one", `return getmetatable(setmetatable(marked(), {__metatable = "mine"}))`, "mine", `return "ok"`, "ok"},
		{"setmetatable on a string", `setmetatable("", {})`, "bad argument #1 to setmetatable", `return ("c"):upper()`, "C"},
		{"no package, no module", `return type(package) .. type(module)`, "nilnil", `return type(require)`, "nil"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			L := newTestState(t)
			kube := L.NewTable()
			kube.RawSetString("get", L.NewFunction(func(L *lua.LState) int {
				L.Push(lua.LString("got"))
				return 1
			}))
			mod := L.NewTable()
			mod.RawSetString("version", lua.LNumber(1))
			mod.RawSetString("kube", kube)
			marker := L.NewTable()
			marker.RawSetString("__metatable", lua.LFalse)
			iso := NewIsolation(L, mod, marker)
			env := func() *lua.LTable {
				e := iso.NewEnv(L, nil)
				e.RawSetString("luaop", iso.Module())
				e.RawSetString("marked", L.NewFunction(func(L *lua.LState) int {
					t := L.NewTable()
					t.Metatable = marker
					L.Push(t)
					return 1
				}))
				return e
			}
			run := func(env *lua.LTable, code string) (string, error) {
				fn := luatest.Compile(t, L, "script.lua", code)
				fn.Env = env
				L.Push(fn)
				if err := L.PCall(0, 1, nil); err != nil {
					return "", err
				}
				defer L.Pop(1)
				return L.ToStringMeta(L.Get(-1)).String(), nil
			}
			got, err := run(env(), tc.code)
			switch {
			case err != nil && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("error %q, want %q", err, tc.want)
			case err == nil && got != tc.want:
				t.Fatalf("got %q, want %q", got, tc.want)
			}
			if got, err := run(env(), tc.probe); err != nil || got != tc.probeWant {
				t.Fatalf("the other script sees %q (error %v), want %q", got, err, tc.probeWant)
			}
		})
	}
}

// Globals lists what luaop check and the luacheck configuration describe: the
// libraries with their fields, the safe functions, nothing of package or module.
func TestIsolationGlobals(t *testing.T) {
	L := newTestState(t)
	g := NewIsolation(L, nil).Globals()
	for _, name := range []string{"string", "table", "math", "os"} {
		if len(g[name]) == 0 {
			t.Errorf("%s: no fields listed", name)
		}
	}
	if got := strings.Join(g["os"], ","); got != "clock,date,time" {
		t.Errorf("os fields: %s", got)
	}
	for _, name := range []string{"print", "pairs", "getfenv", "setmetatable", "loadstring"} {
		if f, ok := g[name]; !ok || f != nil {
			t.Errorf("%s: listed %v, %v", name, ok, f)
		}
	}
	for _, name := range []string{"package", "module", "require", "_G", "io", "dofile"} {
		if _, ok := g[name]; ok {
			t.Errorf("%s is listed", name)
		}
	}
}
