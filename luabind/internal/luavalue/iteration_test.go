package luavalue

import (
	"strings"
	"testing"

	lua "github.com/luaop/luaop/third_party/gopher-lua"

	"github.com/luaop/luaop/luabind/internal/luatest"
)

// The replaced pairs/ipairs must behave exactly like the originals on plain tables.
func TestIterationUnchangedOnPlainTables(t *testing.T) {
	scripts := []struct {
		name string
		lua  string
	}{
		{"pairs mixed", `local t = {10, 20, 30, a = 1, b = 2}; t.c = 3; t.a = nil; local s = ""; for k, v in pairs(t) do s = s .. tostring(k) .. "=" .. tostring(v) .. ";" end; return s`},
		{"pairs empty", `local n = 0; for k in pairs({}) do n = n + 1 end; return n`},
		{"ipairs stops at hole", `local s = ""; for i, v in ipairs({1, 2, nil, 4}) do s = s .. i .. ":" .. v .. ";" end; return s`},
		{"ipairs ignores hash", `local s = ""; for i, v in ipairs({1, 2, x = 3}) do s = s .. v end; return s`},
		{"pairs returns three values", `local f, t, k = pairs({}); return type(f) .. type(t) .. tostring(k)`},
		{"ipairs returns three values", `local f, t, k = ipairs({}); return type(f) .. type(t) .. tostring(k)`},
		{"pairs on nil", `local ok, e = pcall(pairs, nil); return e`},
		{"ipairs on a string", `local ok, e = pcall(ipairs, "x"); return e`},
		{"pairs on a table with a metatable", `local t = setmetatable({a = 1}, {__index = function() return 5 end}); local s = ""; for k, v in pairs(t) do s = s .. k .. v end; return s`},
		{"modify during pairs", `local t = {a = 1, b = 2, c = 3}; local n = 0; for k in pairs(t) do t[k] = nil; n = n + 1 end; return n`},
		{"__pairs on a plain table", `local t = setmetatable({}, {__pairs = function(t) return function(_, k) if not k then return 1, "one" end end, t, nil end}); local s = ""; for k, v in pairs(t) do s = s .. k .. v end; return s`},
	}
	plain := lua.NewState()
	defer plain.Close()
	L := newTestState(t)
	for _, tc := range scripts {
		t.Run(tc.name, func(t *testing.T) {
			got := luatest.MustCall(t, L, tc.lua).String()
			if strings.HasPrefix(tc.name, "__pairs") {
				if got != "1one" {
					t.Fatalf("got %q", got)
				}
				return
			}
			want := luatest.MustCall(t, plain, tc.lua).String()
			if got != want {
				t.Fatalf("got %q, original gives %q", got, want)
			}
		})
	}
}

// BenchmarkPairsPlainTable compares the replaced pairs/ipairs with the originals on a
// plain table of 100 entries.
func BenchmarkPairsPlainTable(b *testing.B) {
	code := `local t = {}; for i = 1, 50 do t[i] = i; t["k" .. i] = i end
		return function() local n = 0; for k, v in pairs(t) do n = n + 1 end; for i, v in ipairs(t) do n = n + 1 end; return n end`
	for _, bc := range []struct {
		name string
		L    func() *lua.LState
	}{
		{"original", func() *lua.LState { return lua.NewState() }},
		{"replaced", func() *lua.LState { L := lua.NewState(); InstallIteration(L); return L }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			L := bc.L()
			defer L.Close()
			L.Push(luatest.Compile(b, L, "bench.lua", code))
			L.Call(0, 1)
			fn := L.Get(-1)
			L.Pop(1)
			b.ReportAllocs()
			for b.Loop() {
				L.Push(fn)
				L.Call(0, 1)
				L.Pop(1)
			}
		})
	}
}
