package sandbox

import (
	"context"
	"strings"
	"testing"

	lua "github.com/luaop/luaop/third_party/gopher-lua"
	"github.com/luaop/luaop/third_party/gopher-lua/parse"
)

// Benchmarks of the hot paths the budgets touch (third_party/gopher-lua/README.md):
// the VM's instruction loop, concatenation, the pattern matcher and the compiler, on
// a state made by NewState with a context set, as every handler call runs. Compare
// before and after a change of the VM with
//
//	go test -run XXX -bench 'VM|Compile' -count 6 ./luabind/internal/sandbox
func benchLua(b *testing.B, code string) {
	L := NewState(Options{})
	defer L.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	L.SetContext(ctx)
	fn, err := L.LoadString(code)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		L.Push(fn)
		if err := L.PCall(0, 0, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVMLoop: arithmetic, comparisons, jumps and table reads (100,000 iterations).
func BenchmarkVMLoop(b *testing.B) {
	benchLua(b, `local t = {1, 2, 3, 4, 5, 6, 7}; local s = 0
		for i = 1, 100000 do if i % 2 == 0 then s = s + t[i % 7 + 1] else s = s - 1 end end`)
}

// BenchmarkVMCall: Lua function calls, tail calls included (20,000 of each).
func BenchmarkVMCall(b *testing.B) {
	benchLua(b, `local function f(x) return x + 1 end; local function g(x) return f(x) end
		local s = 0; for i = 1, 20000 do s = g(s) end`)
}

// BenchmarkVMConcat: short concatenations, as handlers build names and messages
// (10,000 of three operands each).
func BenchmarkVMConcat(b *testing.B) {
	benchLua(b, `local n = 0; for i = 1, 10000 do local s = "pod-" .. i .. "-x"; n = n + #s end`)
}

// BenchmarkVMPatterns: string.find, match, gsub and gmatch on short strings
// (1,000 rounds of each).
func BenchmarkVMPatterns(b *testing.B) {
	benchLua(b, `local s = "app=web,tier=frontend,env=prod"
		for i = 1, 1000 do
			local a = string.find(s, "tier=(%w+)"); local m = s:match("env=(%a+)")
			local g = s:gsub("=", ":"); for k, v in s:gmatch("(%w+)=(%w+)") do end
		end`)
}

// BenchmarkCompile: parse and compile a 30 KB script of ordinary code.
func BenchmarkCompile(b *testing.B) {
	var src strings.Builder
	for i := 0; i < 300; i++ {
		src.WriteString(`luaop.on.update("apps/v1/deployments", function(ctx)
  local replicas = ctx.spec.replicas or 1
  if replicas > 3 then ctx.patch.status.phase = "Big" .. replicas else ctx.patch.status.phase = "Small" end
  return {ok = true, n = replicas, list = {1, 2, 3}}
end, {id = "h` + strings.Repeat("x", i%7) + `"})
`)
	}
	code := src.String()
	b.SetBytes(int64(len(code)))
	b.ReportAllocs()
	for b.Loop() {
		chunk, err := parse.Parse(strings.NewReader(code), "bench.lua")
		if err != nil {
			b.Fatal(err)
		}
		if _, err := lua.Compile(chunk, "bench.lua"); err != nil {
			b.Fatal(err)
		}
	}
}
