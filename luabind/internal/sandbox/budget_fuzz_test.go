package sandbox

import (
	"context"
	"strings"
	"testing"
	"time"

	lua "github.com/luaop/luaop/third_party/gopher-lua"
	"github.com/luaop/luaop/third_party/gopher-lua/parse"
)

// Fuzzing of the Lua entry points the budgets guard (`make fuzz`; as tests, the seeds
// run in `make test`): whatever the input, compiling and pattern matching end, with a
// result or an error, within their deadline, and never panic or crash the process.

// fuzzDeadline is each input's deadline; an input must end within a second of it.
const fuzzDeadline = 200 * time.Millisecond

func checkEndedInTime(t *testing.T, start time.Time) {
	t.Helper()
	if took := time.Since(start); took > fuzzDeadline+time.Second {
		t.Fatalf("ran %s, deadline %s", took, fuzzDeadline)
	}
}

// FuzzLoad parses and compiles a chunk (what a saved script, luaop check and
// loadstring do).
func FuzzLoad(f *testing.F) {
	for _, s := range []string{
		"return 1", "local t = {1, 2, {3}}", "return " + strings.Repeat("{", 300) + strings.Repeat("}", 300),
		"return " + strings.Repeat("not ", 300) + "true", "return " + strings.Repeat("#", 300) + "x",
		"return " + strings.Repeat("1 .. ", 300) + "1", "return " + strings.Repeat("(", 300) + "1" + strings.Repeat(")", 300),
		"if a then elseif b then elseif c then else end", "for i = 1, 10 do while true do repeat until x end end end",
		"local function f(...) return ... end", "goto x ::x::", "return f()()()[1].a.b:c()",
		strings.Repeat("local a = 1\n", 300), "return " + strings.Repeat("-", 300) + "1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		ctx, cancel := context.WithTimeout(context.Background(), fuzzDeadline)
		defer cancel()
		start := time.Now()
		chunk, err := parse.ParseContext(ctx, strings.NewReader(src), "fuzz.lua")
		if err == nil {
			_, _ = lua.CompileContext(ctx, chunk, "fuzz.lua")
		}
		checkEndedInTime(t, start)
	})
}

// FuzzPatterns runs string.find, match, gmatch and gsub with any pattern on any
// subject (repeated to make backtracking costly).
func FuzzPatterns(f *testing.F) {
	for _, s := range [][2]string{
		{"a-b", "aaaa"}, {".-.-.-b", "aaaaaaaa"}, {"(a*)(a)b", "aaab"}, {"%b()", "((()"}, {"^%s*(.-)%s*$", "  x  "},
		{"(%w+)=(%w+)", "a=1,b=2"}, {"[%a%d_]+", "x_1"}, {"%f[%w]%w+", "hello world"}, {"(a)%1", "aa"}, {"", ""},
		{"[", "x"}, {"%", "x"}, {"(()", "x"}, {"a*a*a*a*b", "aaaaaaaaaa"},
	} {
		f.Add(s[0], s[1], uint16(1000))
	}
	L := NewState(Options{MaxStringSize: 1 << 20})
	defer L.Close()
	code := `local pat, s = PAT, string.rep(SUBJECT, N)
pcall(string.find, s, pat)
pcall(string.match, s, pat)
pcall(string.gsub, s, pat, "%0")
pcall(function() local n = 0 for _ in string.gmatch(s, pat) do n = n + 1 if n > 1e5 then break end end end)`
	fn, err := L.LoadString(code)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, pat, subject string, n uint16) {
		if len(subject)*int(n) > 1<<20 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), fuzzDeadline)
		defer cancel()
		L.SetContext(ctx)
		defer L.RemoveContext()
		L.SetGlobal("PAT", lua.LString(pat))
		L.SetGlobal("SUBJECT", lua.LString(subject))
		L.SetGlobal("N", lua.LNumber(n))
		start := time.Now()
		L.Push(fn)
		_ = L.PCall(0, 0, nil) // errors are fine; hanging or crashing is not
		checkEndedInTime(t, start)
	})
}
