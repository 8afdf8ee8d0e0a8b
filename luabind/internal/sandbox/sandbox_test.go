package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	lua "github.com/luaop/luaop/third_party/gopher-lua"

	"github.com/luaop/luaop/luabind/internal/luatest"
	"github.com/luaop/luaop/luabind/internal/luavalue"
)

// newTestState returns a sandboxed state closed at the end of the test.
func newTestState(t testing.TB) *lua.LState {
	t.Helper()
	L := NewState(Options{})
	t.Cleanup(L.Close)
	return L
}

func TestSandboxLibraries(t *testing.T) {
	cases := []struct {
		name string
		lua  string
		want string
	}{
		{"io absent", `return type(io)`, "nil"},
		{"debug absent", `return type(debug)`, "nil"},
		{"coroutine absent", `return type(coroutine)`, "nil"},
		{"channel absent", `return type(channel)`, "nil"},
		{"os.execute absent", `return type(os.execute)`, "nil"},
		{"os.exit absent", `return type(os.exit)`, "nil"},
		{"os.getenv absent", `return type(os.getenv)`, "nil"},
		{"os.remove absent", `return type(os.remove)`, "nil"},
		{"package.loaded.os is the safe os", `return tostring(package.loaded.os == os) .. type(package.loaded.os.execute)`, "truenil"},
		{"loadfile absent", `return type(loadfile)`, "nil"},
		{"dofile absent", `return type(dofile)`, "nil"},
		{"_printregs absent", `return type(_printregs)`, "nil"},
		{"package.loadlib absent", `return type(package.loadlib)`, "nil"},
		{"package.path absent", `return type(package.path) .. type(package.cpath)`, "nilnil"},
		{"collectgarbage harmless", `return collectgarbage("collect") + collectgarbage("count")`, "0"},
		{"os.time", `return type(os.time()) .. tostring(os.time() > 1700000000)`, "numbertrue"},
		{"os.time table", `return os.time({year = 2026, month = 1, day = 2, hour = 12})> 0`, "true"},
		{"os.date", `return tostring(#os.date("%Y-%m-%d") == 10)`, "true"},
		{"os.clock", `return type(os.clock())`, "number"},
		{"string lib", `return ("Hello"):upper() .. string.format("%s-%d", "a", 3)`, "HELLOa-3"},
		{"math lib", `return math.max(1, 5, 3)`, "5"},
		{"table lib", `local t = {3, 1, 2}; table.sort(t); return table.concat(t, ",")`, "1,2,3"},
		{"table.concat 10000 items", `local t = {}; for i = 1, 10000 do t[i] = "x" end; return #table.concat(t, ",")`, "19999"},
		{"unpack 10000 items", `local t = {}; for i = 1, 10000 do t[i] = i end; return select("#", unpack(t))`, "10000"},
		{"load still works", `return loadstring("return 1 + 1")()`, "2"},
	}
	L := newTestState(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := luatest.Call(t, L, tc.lua)
			if err != nil {
				t.Fatal(err)
			}
			if got.String() != tc.want {
				t.Fatalf("got %q, want %q", got.String(), tc.want)
			}
		})
	}
}

func TestSandboxDeepRecursion(t *testing.T) {
	L := newTestState(t)
	_, err := luatest.Call(t, L, `local function f(n) return 1 + f(n + 1) end; return f(1)`)
	if err == nil || !strings.Contains(err.Error(), "stack overflow") {
		t.Fatalf("err = %v", err)
	}
	// The state is still usable.
	if got := luatest.MustCall(t, L, `return 1 + 1`); got.String() != "2" {
		t.Fatal(got)
	}
}

func TestSandboxPrint(t *testing.T) {
	var lines []string
	L := NewState(Options{Print: func(L *lua.LState, args []lua.LValue) {
		msg, err := luavalue.NewBudget(luavalue.Limits{}).Join(L, args, "\t")
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, msg)
	}})
	defer L.Close()
	luatest.MustCall(t, L, `print("a", 1, nil, true, 2.5, setmetatable({}, {__tostring = function() return "T" end})); print(); print("second")`)
	want := []string{"a\t1\tnil\ttrue\t2.5\tT", "", "second"}
	if fmt.Sprint(lines) != fmt.Sprint(want) {
		t.Fatalf("got %q, want %q", lines, want)
	}
	// Without a Print function output is discarded.
	quiet := NewState(Options{})
	defer quiet.Close()
	luatest.MustCall(t, quiet, `print("nothing")`)
}

func TestSandboxStringBounds(t *testing.T) {
	const limit = 1024
	cases := []struct {
		name    string
		lua     string
		want    string // result, when no error
		wantErr string
	}{
		{"rep under the limit", `return #string.rep("ab", 512)`, "1024", ""},
		{"rep over the limit", `return string.rep("ab", 513)`, "", "handler.lua:1: string.rep: result too large (1026 bytes > 1024)"},
		{"rep method form", `return ("x"):rep(2000)`, "", "string.rep: result too large (2000 bytes > 1024)"},
		{"rep huge count", `return ("x"):rep(1e18)`, "", "string.rep: result too large (1000000000000000000 bytes > 1024)"},
		{"rep empty string", `return #(""):rep(1e18)`, "0", ""},
		{"rep negative", `return #("x"):rep(-5)`, "0", ""},
		{"rep zero", `return #("x"):rep(0)`, "0", ""},
		{"format normal", `return string.format("%5.1f|%s|%d", 2.25, "x", 7)`, "  2.2|x|7", ""},
		{"format wide", `return string.format("%2000d", 1)`, "", "handler.lua:1: invalid format (width or precision too long)"},
		{"format Go's argument index", `return string.format(string.rep("%[1]s", 100), string.rep("x", 100))`, "", "invalid option '%[' to 'format'"},
		{"format method form", `return ("%99d"):rep(11):format(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)`, "", "string.format: result too large (more than 1024 bytes)"},
		{"format %s over the limit", `return string.format("%s%s", ("x"):rep(600), ("y"):rep(600))`, "", "string.format: result too large (more than 1024 bytes)"},
		{"gsub under the limit", `return #(("x"):rep(500):gsub("x", "yy"))`, "1000", ""},
		{"gsub over the limit", `return (("x"):rep(1000):gsub("x", "yy"))`, "", "string.gsub: result too large (more than 1024 bytes)"},
		{"gsub method with function", `return (("x"):rep(600):gsub("x", function() return "abc" end))`, "", "string.gsub: result too large"},
		{"gsub shrinking a large input", `return #(BIG:gsub("x", ""))`, "0", ""},
		{"concat over the limit", `local t = {}; for i = 1, 600 do t[i] = "ab" end; return table.concat(t)`, "", "table.concat: result too large (more than 1024 bytes)"},
		{"concat under the limit", `local t = {}; for i = 1, 100 do t[i] = i end; return #table.concat(t, ",")`, "291", ""},
	}
	L := NewState(Options{MaxStringSize: limit})
	defer L.Close()
	// An input larger than the limit (from an object, say: no script can build one).
	L.SetGlobal("BIG", lua.LString(strings.Repeat("x", 2000)))
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := luatest.Call(t, L, tc.lua)
			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("no error, got %d bytes", len(got.String()))
				}
				if !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %q does not contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.String() != tc.want {
				t.Fatalf("got %q, want %q", got.String(), tc.want)
			}
		})
	}
}

func TestSandboxDefaultStringLimit(t *testing.T) {
	L := newTestState(t)
	if got := luatest.MustCall(t, L, `return #("x"):rep(16 * 1024 * 1024)`); got.String() != "16777216" {
		t.Fatal(got)
	}
	_, err := luatest.Call(t, L, `return ("x"):rep(16 * 1024 * 1024 + 1)`)
	if err == nil || !strings.Contains(err.Error(), "string.rep: result too large (16777217 bytes > 16777216)") {
		t.Fatalf("err = %v", err)
	}
}

// The bounded gsub must give what gopher-lua's gsub gives.
func TestSandboxGsubSameAsOriginal(t *testing.T) {
	cases := []string{
		`return ("hello world"):gsub("o", "0")`,
		`return ("hello world"):gsub("(%w+)", "<%1>")`,
		`return ("hello world"):gsub("%w+", "%0 %0", 1)`,
		`return ("hello world"):gsub("(%w+) (%w+)", "%2 %1")`,
		`return ("abc"):gsub("", "-")`,
		`return ("abc"):gsub("^a", "A")`,
		`return ("aaa"):gsub("^a", "A")`,
		`return ("abc"):gsub("x*", "-")`,
		`return ("a,b,,c"):gsub(",", ";", 2)`,
		`return ("100%"):gsub("%%", " percent")`,
		`return ("x"):gsub("x", "%%")`,
		`return ("x"):gsub("x", "%a")`,
		`return ("x"):gsub("x", "end%")`,
		`return ("$name is $age"):gsub("%$(%w+)", {name = "Ann", age = 7})`,
		`return ("$name is $unknown"):gsub("%$(%w+)", {name = "Ann"})`,
		`return ("abc"):gsub("%w", function(c) return c:upper() .. "." end)`,
		`return ("abc"):gsub("%w", function(c) if c == "b" then return false end return "_" end)`,
		`return ("key=val"):gsub("(%w+)=(%w+)", function(k, v) return v .. "=" .. k end)`,
		`return ("abc"):gsub("()b()", function(a, b) return a .. "," .. b end)`,
		`return ("abc"):gsub("()", "%1")`,
		`return (("ab"):rep(1000)):gsub("b", "c")`,
		`return ("hello"):gsub("l+", "L")`,
		`return ("  trim  "):gsub("^%s*(.-)%s*$", "%1")`,
		`return ("abc"):gsub(".", {a = 1, b = true})`,
		`return ("a.b.c"):gsub("%.", "/")`,
		`return pcall(string.gsub, "abc", "(", "x")`,
		`return pcall(string.gsub, "abc", "b", "%2")`,
	}
	plain := lua.NewState()
	defer plain.Close()
	L := newTestState(t)
	run := func(L *lua.LState, code string) string {
		fn := luatest.Compile(t, L, "g.lua", code)
		top := L.GetTop()
		L.Push(fn)
		if err := L.PCall(0, lua.MultRet, nil); err != nil {
			return "error: " + err.Error()
		}
		var parts []string
		for i := top + 1; i <= L.GetTop(); i++ {
			parts = append(parts, L.Get(i).Type().String()+":"+L.Get(i).String())
		}
		L.SetTop(top)
		return strings.Join(parts, " | ")
	}
	for _, code := range cases {
		t.Run(code, func(t *testing.T) {
			want := run(plain, code)
			got := run(L, code)
			if got != want {
				t.Fatalf("got  %q\nwant %q", got, want)
			}
		})
	}
}

func TestSandboxRequireDoesNotReadFiles(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "evil.lua"), []byte(`evil_ran = true; return {}`), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	t.Setenv("LUA_PATH", filepath.Join(dir, "?.lua"))
	L := newTestState(t)
	_, err := luatest.Call(t, L, `return require("evil")`)
	if err == nil {
		t.Fatal("require read a file")
	}
	if got := luatest.MustCall(t, L, `return tostring(evil_ran)`); got.String() != "nil" {
		t.Fatal("evil.lua ran")
	}
}

func TestSandboxOptionsDefaults(t *testing.T) {
	o := Options{}.withDefaults()
	if o.CallStackSize <= 0 || o.RegistrySize < 128 || o.RegistryMaxSize <= o.RegistrySize || o.RegistryGrowStep <= 0 || o.MaxStringSize != 16<<20 || o.Print == nil {
		t.Fatalf("defaults: %+v", o)
	}
	o = Options{RegistrySize: 4096, RegistryMaxSize: 100}.withDefaults()
	if o.RegistryMaxSize <= 4096 {
		t.Fatalf("registry cannot grow: %+v", o)
	}
}
