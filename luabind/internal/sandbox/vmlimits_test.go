package sandbox

import (
	"fmt"
	"strings"
	"testing"

	lua "github.com/luaop/luaop/third_party/gopher-lua"

	"github.com/luaop/luaop/luabind/internal/luatest"
)

// Issue 46, item 2: the VM's limits are Lua 5.1's, each failing with Lua's message
// and the script's line (patches of third_party/gopher-lua); and a Go panic inside
// a built-in is a Lua error at the caller's line (item 3).
func TestVMLimitsAreLua51s(t *testing.T) {
	// n upvalues of one function: locals of up to three enclosing functions (a
	// function has at most 200 locals), each line one local; the innermost function
	// refers to them all on its last line.
	upvalues := func(n int) string {
		var b strings.Builder
		for i := range n {
			if i > 0 && i%150 == 0 {
				b.WriteString("return (function()\n")
			}
			fmt.Fprintf(&b, "local u%d = %d\n", i, i)
		}
		b.WriteString("local function f()\n  return 0")
		for i := range n {
			fmt.Fprintf(&b, " + u%d", i)
		}
		b.WriteString("\nend\nreturn f()\n")
		for i := 150; i < n; i += 150 {
			b.WriteString("end)()\n")
		}
		return b.String()
	}
	constants := func() string {
		var b strings.Builder
		b.WriteString("local t = {\n")
		for i := range 270_000 {
			fmt.Fprintf(&b, "%d.5,\n", i)
		}
		b.WriteString("}\n")
		return b.String()
	}
	// a loop whose body is longer than a jump reaches (2^17 instructions: two a line)
	longJump := "while x do\n" + strings.Repeat("a = 1\n", 70_000) + "end\n"
	for _, tc := range []struct {
		name, src, want string
	}{
		{"60 upvalues", upvalues(60), ""},
		{"61 upvalues", upvalues(61), "handler.lua:63: too many upvalues (limit is 60)"},
		{"257 upvalues", upvalues(257), "handler.lua:260: too many upvalues (limit is 60)"},
		{"300 upvalues", upvalues(300), "handler.lua:303: too many upvalues (limit is 60)"},
		{"constants", constants(), "handler.lua:262145: constant table overflow (more than 262144 constants in one function)"},
		{"jump", longJump, "handler.lua:1: control structure too long"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			L := newTestState(t)
			_, err := L.Load(strings.NewReader(tc.src), "handler.lua")
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				// The closure reads every upvalue (upstream's 8-bit count made
				// the function return another value past 255).
				if got := luatest.MustCall(t, L, tc.src); got.String() != "1770" {
					t.Errorf("f() = %s, want 1770", got)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestArrayGrowsWithinItsUse(t *testing.T) {
	L := newTestState(t)
	for _, tc := range []struct{ name, lua, want string }{
		{"far key", `local t = {} t[67108863] = true return tostring(t[67108863]) .. #t`, "true0"},
		{"far insert", `local t = {1, 2} table.insert(t, 67108000, 3) return t[67108000] .. #t .. table.maxn(t)`, "3267108000"},
		{"pairs sees hash integer keys", `local t = {} t[1e6] = "a" t[5e6] = "b" t.x = "c" local n, s = 0, 0
for k, v in pairs(t) do n = n + 1 if type(k) == "number" then s = s + k end end return n .. ":" .. s`, "3:6000000"},
		{"reverse fill becomes a list", `local t = {} for i = 1000, 1, -1 do t[i] = i end local s = 0 for i, v in ipairs(t) do s = s + v end return #t .. ":" .. s`, "1000:500500"},
		{"gap filled", `local t = {} t[1] = 1 t[500] = 500 for i = 2, 499 do t[i] = i end t[501] = 501 return #t .. ":" .. t[500]`, "501:500"},
		{"next over mixed", `local t = {1, 2, 3} t[100000] = 4 local keys = {} for k in pairs(t) do keys[#keys + 1] = k end table.sort(keys) return table.concat(keys, ",")`, "1,2,3,100000"},
		{"unpack reads the hash part", `local t = {} t[1] = 1 t[100] = 100 return select("#", unpack(t, 99, 100)) .. tostring(select(2, unpack(t, 99, 100)))`, "2100"},
		{"remove", `local t = {1, 2, 3} t[1000] = 9 table.remove(t) return #t .. t[1000]`, "29"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := luatest.Call(t, L, tc.lua)
			if err != nil {
				t.Fatal(err)
			}
			if got.String() != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
}

func TestGoPanicsAreLuaErrorsAtTheCallersLine(t *testing.T) {
	L := newTestState(t)
	L.SetGlobal("boom", L.NewFunction(func(L *lua.LState) int {
		m := nilMap()
		m["x"] = 1 // a Go runtime panic, as a built-in's bug would be
		return 0
	}))
	for _, tc := range []struct{ name, lua, want string }{
		{"math.random(0)", "local x = 1\nreturn math.random(0)", "handler.lua:2: bad argument #1 to 'random' (interval is empty)"},
		{"math.random(2, 1)", "return math.random(2, 1)", "handler.lua:1: bad argument #2 to 'random' (interval is empty)"},
		{"pcall(math.random, 0)", "local ok, e = pcall(math.random, 0)\nerror(e, 0)", "handler.lua:1: bad argument #1 to 'random' (interval is empty)"},
		{"a Go panic", "local x = 1\nboom()", "handler.lua:2: boom: assignment to entry in nil map"},
		{"a Go panic in pcall", "local ok, e = pcall(boom)\nerror(e, 0)", "handler.lua:1: (anonymous): assignment to entry in nil map"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := luatest.Call(t, L, tc.lua)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
	got := luatest.MustCall(t, L, `local lo, hi = 1e9, 0 for i = 1, 1000 do local r = math.random(-3, 3) lo = math.min(lo, r) hi = math.max(hi, r) end return lo .. hi .. math.random(1)`)
	if got.String() != "-331" {
		t.Errorf("math.random ranges: %s", got)
	}
}

// nilMap is a map never made: writing to it is a Go runtime panic.
func nilMap() map[string]int { return nil }
