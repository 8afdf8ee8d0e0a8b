package luabind

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// Issue 46, item 5: a generator, not a list. luaProgram writes a Lua handler body
// from a grammar (nesting, closures, metatables, string and table library calls with
// extreme arguments, conversions of what it built at the return), each choice taken
// from the fuzzer's bytes, so that Go's fuzzer explores programs rather than bytes.
// Each program runs as a handler body (fuzzCall): whatever it does, the call ends
// within a second of its deadline, the runtime never panics and serves the next call.
// A failing input is saved by `go test -fuzz` under testdata/fuzz/FuzzGrammar and
// replayed by every `go test` from then on.

// grammar is the generator's state: the choices left and the locals declared.
type grammar struct {
	choices []byte
	b       strings.Builder
	locals  int
}

// pick takes the next choice, in [0, n); 0 once the choices are used up (the
// shortest productions are first, so a program always ends).
func (g *grammar) pick(n int) int {
	if len(g.choices) == 0 {
		return 0
	}
	c := int(g.choices[0]) % n
	g.choices = g.choices[1:]
	return c
}

// extremes are the numbers Lua's libraries must refuse or survive.
var extremes = []string{"0", "1", "-1", "3", "255", "1e6", "67108863", "2^31", "-2^53", "1e308", "1/0", "-1/0", "0/0", "16*1024*1024", "0.5"}

var formats = []string{`"%s"`, `"%q"`, `"%d"`, `"%5.1f"`, `"%x"`, `"%c"`, `"%-99s"`, `"%099d"`, `"%s%s%s"`, `"%v"`}

func (g *grammar) number() string { return extremes[g.pick(len(extremes))] }

func (g *grammar) variable() string {
	if g.locals == 0 {
		return "ctx"
	}
	return fmt.Sprintf("v%d", g.pick(g.locals))
}

func (g *grammar) expr(depth int) string {
	if depth > 6 {
		return g.number()
	}
	d := depth + 1
	switch g.pick(20) {
	case 0:
		return g.number()
	case 1:
		return fmt.Sprintf("%q", strings.Repeat("ab\x00\"", g.pick(4)))
	case 2:
		return g.variable()
	case 3:
		return fmt.Sprintf("{%s, %s, k = %s}", g.expr(d), g.expr(d), g.expr(d))
	case 4:
		return fmt.Sprintf("function(...) return %s, ... end", g.expr(d))
	case 5:
		return fmt.Sprintf("string.rep(%s, %s)", g.expr(d), g.number())
	case 6:
		return fmt.Sprintf("string.format(%s, %s, %s, %s)", formats[g.pick(len(formats))], g.expr(d), g.expr(d), g.expr(d))
	case 7:
		return fmt.Sprintf("table.concat(%s, %s)", g.expr(d), g.expr(d))
	case 8:
		return fmt.Sprintf("tostring(%s)", g.expr(d))
	case 9:
		return fmt.Sprintf("select('#', unpack(%s, 1, %s))", g.expr(d), g.number())
	case 10:
		return fmt.Sprintf("math.random(%s)", g.number())
	case 11:
		return fmt.Sprintf("(%s .. %s)", g.expr(d), g.expr(d))
	case 12:
		return fmt.Sprintf("#%s", g.expr(d))
	case 13:
		return fmt.Sprintf("setmetatable({}, {__index = %s, __tostring = %s, __concat = %s})", g.expr(d), g.expr(d), g.expr(d))
	case 14:
		return fmt.Sprintf("%s(%s)", g.variable(), g.expr(d))
	case 15:
		return fmt.Sprintf("select(2, pcall(%s, %s))", g.expr(d), g.expr(d))
	case 16:
		return fmt.Sprintf("string.gsub(%s, %q, %s)", g.expr(d), []string{".-", "(a*)*b", "%b()", "."}[g.pick(4)], g.expr(d))
	case 17:
		return fmt.Sprintf("luaop.json.encode(%s)", g.expr(d))
	case 18:
		return fmt.Sprintf("(%s + %s)", g.expr(d), g.expr(d))
	default:
		return fmt.Sprintf("(function() local t = {} for i = 1, %s do t[i] = %s end return t end)()", g.number(), g.expr(d))
	}
}

func (g *grammar) block(depth int, statements int) {
	for range statements {
		g.statement(depth)
	}
}

func (g *grammar) statement(depth int) {
	if depth > 4 {
		fmt.Fprintf(&g.b, "local v%d = %s\n", g.locals, g.expr(depth))
		g.locals++
		return
	}
	d := depth + 1
	switch g.pick(9) {
	case 0:
		fmt.Fprintf(&g.b, "local v%d = %s\n", g.locals, g.expr(depth))
		g.locals++
	case 1:
		fmt.Fprintf(&g.b, "%s[%s] = %s\n", g.variable(), g.expr(d), g.expr(d))
	case 2:
		fmt.Fprintf(&g.b, "for i = 1, %s do\n", g.number())
		g.block(d, 1+g.pick(3))
		g.b.WriteString("end\n")
	case 3:
		fmt.Fprintf(&g.b, "if %s then\n", g.expr(d))
		g.block(d, 1+g.pick(3))
		g.b.WriteString("else\n")
		g.block(d, g.pick(3))
		g.b.WriteString("end\n")
	case 4:
		fmt.Fprintf(&g.b, "local v%d = function(a, b)\n", g.locals)
		g.locals++
		g.block(d, 1+g.pick(3))
		fmt.Fprintf(&g.b, "return %s\nend\n", g.expr(d))
	case 5:
		fmt.Fprintf(&g.b, "table.insert(%s, %s, %s)\n", g.variable(), g.number(), g.expr(d))
	case 6:
		fmt.Fprintf(&g.b, "ctx.patch.status[%q] = %s\n", fmt.Sprint("f", g.pick(4)), g.expr(d))
	case 7:
		fmt.Fprintf(&g.b, "ctx.logger.info(%s, %s)\nprint(%s, %s)\n", g.expr(d), g.expr(d), g.expr(d), g.expr(d))
	default:
		fmt.Fprintf(&g.b, "pcall(function()\n")
		g.block(d, 1+g.pick(3))
		g.b.WriteString("end)\n")
	}
}

// luaProgram is the handler body the choices write: statements, then a return that
// converts what they built (a result, and error values when it fails).
func luaProgram(choices []byte) string {
	g := &grammar{choices: choices}
	g.block(0, 1+g.pick(8))
	switch g.pick(3) {
	case 0:
		fmt.Fprintf(&g.b, "return %s\n", g.variable())
	case 1:
		fmt.Fprintf(&g.b, "return {a = %s, b = {%s, %s}}\n", g.variable(), g.variable(), g.expr(0))
	default:
		fmt.Fprintf(&g.b, "error(%s)\n", g.variable())
	}
	return g.b.String()
}

// grammarRuntime runs a generated body as a handler (loadstring'd from spec.body:
// the fuzzer changes data, not the scripts), with luaop and ctx in reach.
func grammarRuntime(t testing.TB) *Runtime {
	return loadedRuntime(t, Options{Shards: 1, HandlerTimeout: fuzzCallDeadline}, "grammar.lua", `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function(ctx)
  local f = loadstring("local luaop, ctx = ...\n" .. ctx.spec.body)
  if f then return f(luaop, ctx) end
end, {id = "body"})
luaop.on.create("example.com/v1/widgets", function(ctx) return "fine" end, {id = "fine"})`)
}

// FuzzGrammar explores generated programs (`make fuzz`).
func FuzzGrammar(f *testing.F) {
	r := rand.New(rand.NewPCG(46, 46))
	for range 16 {
		seed := make([]byte, 64+r.IntN(192))
		for i := range seed {
			seed[i] = byte(r.UintN(256))
		}
		f.Add(seed)
	}
	rt := grammarRuntime(f)
	f.Fuzz(func(t *testing.T, choices []byte) {
		fuzzCall(t, rt, "body", map[string]any{"body": luaProgram(choices)})
	})
}

// TestGrammarPrograms runs a fixed number of generated programs in every `go test`
// (the bounded share of the generator in `make test`): the same seeds each time, so a
// failure is reproduced by its program, which the failure prints.
func TestGrammarPrograms(t *testing.T) {
	programs := 150
	if raceDetector || testing.Short() {
		programs = 40
	}
	rt := grammarRuntime(t)
	r := rand.New(rand.NewPCG(46, 5))
	outcomes := map[string]int{}
	for i := range programs {
		choices := make([]byte, 32+r.IntN(224))
		for j := range choices {
			choices[j] = byte(r.UintN(256))
		}
		program := luaProgram(choices)
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			defer func() {
				if t.Failed() {
					t.Logf("the program:\n%s", program)
				}
			}()
			err := fuzzCall(t, rt, "body", map[string]any{"body": program})
			outcomes[outcome(err)]++
		})
	}
	t.Logf("%d generated programs ran: %v", programs, outcomes)
}

// outcome classifies how a generated program's call ended, for the log.
func outcome(err error) string {
	switch {
	case err == nil:
		return "returned"
	case strings.Contains(err.Error(), "deadline"):
		return "deadline"
	case strings.Contains(err.Error(), "too large"), strings.Contains(err.Error(), "budget"):
		return "limit"
	default:
		return "error"
	}
}
