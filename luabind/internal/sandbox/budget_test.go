package sandbox

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	lua "github.com/luaop/luaop/third_party/gopher-lua"
	"github.com/luaop/luaop/third_party/gopher-lua/parse"

	"github.com/luaop/luaop/luabind/internal/luatest"
)

// Issue 34: what the patched gopher-lua (third_party/gopher-lua) bounds. Each test
// fails on gopher-lua as published (most of them by killing the test binary).

// runWithin runs code on a fresh state under a context of the given deadline and
// returns the error and how long after the deadline it came.
func runWithin(t *testing.T, deadline time.Duration, code string) (time.Duration, error) {
	t.Helper()
	L := NewState(Options{})
	defer L.Close()
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	L.SetContext(ctx)
	start := time.Now()
	_, err := luatest.Call(t, L, code)
	return time.Since(start) - deadline, err
}

func TestNestingLimits(t *testing.T) {
	deep := func(open, close string, n int) string {
		return strings.Repeat(open, n) + "1" + strings.Repeat(close, n)
	}
	for _, tc := range []struct {
		name string
		code string
		ok   bool
	}{
		{"tables, a million", "return " + deep("{", "}", 1_000_000), false},
		{"not, a million", "return " + strings.Repeat("not ", 1_000_000) + "true", false},
		{"length, 900,000", "return " + strings.Repeat("#", 900_000) + "x", false},
		{"parentheses, 100,000", "return " + deep("(", ")", 100_000), false},
		{"blocks, 200,000", strings.Repeat("do ", 200_000) + strings.Repeat("end ", 200_000), false},
		{"concatenation, 100,000 operands", "return " + strings.Repeat(`"a" .. `, 100_000) + `"a"`, false},
		{"functions, 150", "return " + strings.Repeat("function() return ", 150) + "1" + strings.Repeat(" end", 150), false},
		{"sum of 100,000 terms", "return " + strings.Repeat("1 + ", 100_000) + "1", false},
		// What Lua 5.1 accepts.
		{"tables, 190", "return " + deep("{", "}", 190), true},
		{"functions, 90", "return " + strings.Repeat("function() return ", 90) + "1" + strings.Repeat(" end", 90), true},
		{"sum of 4,000 terms", "return " + strings.Repeat("1 + ", 4_000) + "1", true},
		{"3,000 elseif", "local x = 1\nif x == 0 then\n" + strings.Repeat("elseif x == 2 then\n", 3_000) + "end", true},
		{"a chain of 1,000 calls", "local function f() return f end\nreturn f" + strings.Repeat("()", 1_000), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			chunk, err := parse.Parse(strings.NewReader(tc.code), "deep.lua")
			if err == nil {
				_, err = lua.Compile(chunk, "deep.lua")
			}
			if tc.ok {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.HasPrefix(err.Error(), "deep.lua:1: chunk has too many syntax levels") {
				t.Fatalf("error = %v, want deep.lua:1: chunk has too many syntax levels", err)
			}
			// loadstring inside a script says the same (and does not crash).
			L := NewState(Options{})
			defer L.Close()
			L.SetGlobal("SRC", lua.LString(tc.code))
			got := luatest.MustCall(t, L, `local f, err = loadstring(SRC, "deep.lua"); return tostring(err)`).String()
			if !strings.Contains(got, "chunk has too many syntax levels") {
				t.Errorf("loadstring: %s", got)
			}
		})
	}
}

func TestCompileEndsWithItsContext(t *testing.T) {
	var src strings.Builder
	src.WriteString("return {")
	for i := range 200_000 {
		fmt.Fprintf(&src, "%d, ", i)
	}
	src.WriteString("}")
	chunk, err := parse.Parse(strings.NewReader(src.String()), "data.lua")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := lua.CompileContext(ctx, chunk, "data.lua"); err == nil || !strings.Contains(err.Error(), "compilation cancelled: context canceled") {
		t.Fatalf("compile under an ended context: %v", err)
	}
	if _, err := parse.ParseContext(ctx, strings.NewReader(src.String()), "data.lua"); err == nil || !strings.Contains(err.Error(), "parsing cancelled") {
		t.Fatalf("parse under an ended context: %v", err)
	}
	if _, err := lua.CompileContext(t.Context(), chunk, "data.lua"); err != nil {
		t.Fatal(err)
	}
}

// The constants of a function are still shared (the map replacing the scan keeps
// LValue equality).
func TestCompileSharesConstants(t *testing.T) {
	chunk, err := parse.Parse(strings.NewReader(`return {1, 1, "a", "a", 2.5, 2.5, "1"}`), "k.lua")
	if err != nil {
		t.Fatal(err)
	}
	proto, err := lua.Compile(chunk, "k.lua")
	if err != nil {
		t.Fatal(err)
	}
	if got := len(proto.Constants); got != 4 {
		t.Fatalf("%d constants %v, want 4 (1, a, 2.5, \"1\")", got, proto.Constants)
	}
}

func TestCompileErrorsReadFileLine(t *testing.T) {
	var locals strings.Builder
	locals.WriteString("local x = 1\n")
	for i := range 250 {
		fmt.Fprintf(&locals, "local v%d = %d\n", i, i)
	}
	chunk, err := parse.Parse(strings.NewReader(locals.String()), "h.lua")
	if err != nil {
		t.Fatal(err)
	}
	_, err = lua.Compile(chunk, "h.lua")
	if err == nil || !strings.HasPrefix(err.Error(), "h.lua:") || !strings.Contains(err.Error(), "too many local variables (limit is 200)") || strings.Contains(err.Error(), "line(0)") {
		t.Fatalf("error = %v", err)
	}
}

func TestConcatenationIsBounded(t *testing.T) {
	L := NewState(Options{MaxStringSize: 1 << 20})
	defer L.Close()
	_, err := luatest.Call(t, L, `local s = "x"
for i = 1, 40 do s = s .. s end
return #s`)
	if err == nil || !strings.Contains(err.Error(), "handler.lua:2: string too large: the concatenation would be 2097152 bytes, over the limit of 1048576") {
		t.Fatalf("error = %v", err)
	}
	// Threads inherit the bound; under it everything works.
	co, _ := L.NewThread()
	if got := luatest.MustCall(t, co, `local s = "ab"; for i = 1, 19 do s = s .. s end; return #(s .. "")`).String(); got != "1048576" {
		t.Fatalf("got %s", got)
	}
	if _, err := luatest.Call(t, co, `local s = string.rep("x", 1048576); return s .. "y"`); err == nil || !strings.Contains(err.Error(), "string too large") {
		t.Fatalf("thread: %v", err)
	}
}

func TestStackOverflowHasALocation(t *testing.T) {
	for name, code := range map[string]string{
		"recursion":   "local function f() return 1 + f() end\nreturn f()",
		"metamethods": "local t = setmetatable({}, {__index = function(t, k) return t[k] end})\nreturn t.x",
		"pcall loop":  "local function f() local ok, e = pcall(f); if not ok then error(e, 0) end end\nreturn f()",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := runWithin(t, 5*time.Second, code)
			if err == nil || !strings.Contains(err.Error(), "stack overflow") || strings.Contains(err.Error(), "callstack") {
				t.Fatalf("error = %v", err)
			}
			var apiErr *lua.ApiError
			if errors.As(err, &apiErr) && apiErr.Type == lua.ApiErrorPanic {
				t.Fatalf("a Go panic, not a Lua error: %v", err)
			}
		})
	}
}

func TestTracebackOfEndlessTailCallsIsShort(t *testing.T) {
	_, err := runWithin(t, 300*time.Millisecond, `local function f() return f() end
return f()`)
	var apiErr *lua.ApiError
	if !errors.As(err, &apiErr) || !strings.Contains(err.Error(), "context deadline exceeded") {
		t.Fatalf("error = %v", err)
	}
	if n := len(apiErr.StackTrace); n > 4096 {
		t.Fatalf("traceback of %d bytes: %.300s", n, apiErr.StackTrace)
	}
	if !strings.Contains(apiErr.StackTrace, "(tail call)") {
		t.Errorf("traceback: %s", apiErr.StackTrace)
	}
}

func TestPatternsEndWithTheirContext(t *testing.T) {
	const deadline = 300 * time.Millisecond
	for name, code := range map[string]string{
		"find, lazy quantifiers":   `return string.find(string.rep("a", 200000), ".-.-.-.-.-.-.-b")`,
		"find, one lazy":           `return string.find(string.rep("a", 300000), "a-b")`,
		"match":                    `return string.match(string.rep("a", 300000), "a-a-a-b")`,
		"gmatch":                   `for m in string.gmatch(string.rep("a", 300000), "a-a-b") do end`,
		"gsub":                     `return string.gsub(string.rep("a", 300000), "a-a-b", "")`,
		"balanced":                 `return string.find(string.rep("(", 200000), "%b()")`,
		"greedy, deep backtrack":   `return string.find(string.rep("a", 100000), "a*a*a*a*b")`,
		"find from every position": `local s = string.rep("a", 5000) for i = 1, 1e9 do s:find(".-b") end`,
	} {
		t.Run(name, func(t *testing.T) {
			late, err := runWithin(t, deadline, code)
			if err == nil || !strings.Contains(err.Error(), "context deadline exceeded") || !strings.Contains(err.Error(), "handler.lua:1:") {
				t.Fatalf("error = %v", err)
			}
			if late > time.Second {
				t.Fatalf("ended %s after its deadline", late)
			}
		})
	}
}

// Patterns still match as before (the backtracking moved from the Go stack to the
// heap): captures, anchors, alternatives restored on failure.
func TestPatternsMatchAsBefore(t *testing.T) {
	L := NewState(Options{})
	defer L.Close()
	for code, want := range map[string]string{
		`return table.concat({string.find("key=value", "(%w+)=(%w+)")}, ",")`:                                     "1,9,key,value",
		`return string.match("  trim  ", "^%s*(.-)%s*$")`:                                                         "trim",
		`return (string.gsub("hello world", "(o)", "[%1]"))`:                                                      "hell[o] w[o]rld",
		`return string.match("aaab", "(a*)(a)b")`:                                                                 "aa",
		`return select(2, string.match("abcabc", "(a(b)c)%1"))`:                                                   "b",
		`return tostring(string.find("abc", "^b"))`:                                                               "nil",
		`return string.match("f(a(b)c)d", "%b()")`:                                                                "(a(b)c)",
		`local n = 0; for k, v in string.gmatch("a=1, b=2, c=3", "(%w+)=(%w+)") do n = n + v end; return n`:       "6",
		`local t = {}; for w in ("one two  three"):gmatch("%a+") do t[#t+1] = w end; return table.concat(t, "|")`: "one|two|three",
		`local n = 0; for _ in ("abc"):gmatch("") do n = n + 1 end; return n`:                                     "4",
		`local n = 0; for _ in ("aaa"):gmatch("^a") do n = n + 1 end; return n`:                                   "1",
		`return string.match("2026-12-01", "(%d+)-(%d+)-(%d+)$")`:                                                 "2026",
		`return (string.gsub("abc", "%w", "%0%0"))`:                                                               "aabbcc",
		`return string.match("[[x]]", "%[(%b[])%]")`:                                                              "[x]",
		`return tostring(string.match("ab", "()b"))`:                                                              "2",
	} {
		if got := luatest.MustCall(t, L, code).String(); got != want {
			t.Errorf("%s = %q, want %q", code, got, want)
		}
	}
}

// gmatch finds one match per iteration: breaking out early costs that much.
func TestGmatchIsLazy(t *testing.T) {
	L := NewState(Options{})
	defer L.Close()
	L.SetGlobal("BIG", lua.LString(strings.Repeat("ab", 4<<20)))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	L.SetContext(ctx)
	// A billion steps would be needed to find every match up front.
	got := luatest.MustCall(t, L, `local n = 0
for i = 1, 1000 do for m in BIG:gmatch("a") do n = n + 1; break end end
return n`).String()
	if got != "1000" {
		t.Fatalf("got %s", got)
	}
}

func TestBuiltinResultsAreBounded(t *testing.T) {
	L := NewState(Options{MaxStringSize: 1 << 20})
	defer L.Close()
	for code, want := range map[string]string{
		`return os.date(string.rep("%c", 8e4))`:                "os.date: result too large",
		`return string.format("%q", string.rep("\0", 300000))`: "string.format: result too large",
		`return string.format("%x", string.rep("a", 400000))`:  "string.format: result too large",
		`return string.rep("a", 0/0)`:                          "",
		`return #os.date("%Y-%m-%d %c")`:                       "",
	} {
		got, err := luatest.Call(t, L, code)
		if want == "" {
			if err != nil {
				t.Errorf("%s: %v", code, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %d bytes, error %v; want %q", code, len(got.String()), err, want)
		}
	}
}

// BenchmarkCompileDataTable: a data table of 100,000 numbers (589 KB), which
// gopher-lua as published compiled in 46 s (a scan of every constant per constant).
func BenchmarkCompileDataTable(b *testing.B) {
	var src strings.Builder
	src.WriteString("return {")
	for i := range 100_000 {
		fmt.Fprintf(&src, "%d, ", i)
	}
	src.WriteString("}")
	code := src.String()
	b.SetBytes(int64(len(code)))
	for b.Loop() {
		chunk, err := parse.Parse(strings.NewReader(code), "data.lua")
		if err != nil {
			b.Fatal(err)
		}
		if _, err := lua.Compile(chunk, "data.lua"); err != nil {
			b.Fatal(err)
		}
	}
}

// Pushing many values (unpack, varargs) grows the data stack ("registry")
// geometrically: gopher-lua as published grows it by a fixed step, copying it each
// time, so one unpack of 100,000 values on a call thread's registry (luabind's
// thread.go: 64 slots, step 256) allocated about 320 MB of copies and took
// seconds of CPU (30 s under the race detector on a loaded machine). Measured as
// bytes allocated, which do not depend on the machine's load.
func TestRegistryGrowsGeometrically(t *testing.T) {
	L := lua.NewState(lua.Options{RegistrySize: 64, RegistryGrowStep: 256, RegistryMaxSize: 128 * 1024})
	defer L.Close()
	luatest.MustCall(t, L, `local w = {} for i = 1, 100000 do w[i] = i end _G.w = w return 0`)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	got := luatest.MustCall(t, L, `return select("#", unpack(_G.w))`).String()
	runtime.ReadMemStats(&after)
	if got != "100000" {
		t.Fatalf("unpack of 100,000 values gave %s values", got)
	}
	// The final registry is 128K slots of 16 bytes (2 MiB); doubling copies at most
	// as much again. The fixed step allocated 100,000²/(2·256) slots: 312 MB.
	if allocated := after.TotalAlloc - before.TotalAlloc; allocated > 16<<20 {
		t.Fatalf("unpack of 100,000 values allocated %d MB, want the registry grown geometrically (under 16 MB)", allocated>>20)
	}
}
