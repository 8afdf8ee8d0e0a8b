package adversary

import (
	"fmt"
	"strings"
	"time"
)

// Case is one attack, as the body of a create handler.
type Case struct {
	// ID is the handler's id (letters, digits, '_').
	ID string
	// Body is one line of Lua run with ctx in scope (the handler's body); its
	// error must name this line.
	Body string
	// Want is a substring of the error; OrWant, when set, another one the error
	// may hold instead (a case whose limit and deadline race: either ends the call
	// cleanly, which is the promise).
	Want, OrWant string
	// Deadline: the call runs until its deadline stops it (else a limit stops it
	// at once).
	Deadline bool
	// Result: the error is the conversion of what the handler returned or wrote
	// into ctx.patch, after it returned: it names the handler's line (where it was
	// registered), the line before Body.
	Result bool
}

// Stopped tells whether msg is the error the case expects.
func (c Case) Stopped(msg string) bool {
	return strings.Contains(msg, c.Want) || c.OrWant != "" && strings.Contains(msg, c.OrWant)
}

// Cases are the attacks run in a handler (issue 34, items 1-7 and 11; issue 46).
var Cases = []Case{
	// 1. Nesting in compiled source (loadstring in a handler).
	{ID: "nested_tables", Body: `assert(loadstring("return " .. string.rep("{", 1e6) .. string.rep("}", 1e6)))`, Want: "chunk has too many syntax levels"},
	{ID: "nested_not", Body: `assert(loadstring("return " .. string.rep("not ", 1e6) .. "true"))`, Want: "chunk has too many syntax levels"},
	{ID: "nested_length", Body: `assert(loadstring("return " .. string.rep("#", 9e5) .. "x"))`, Want: "chunk has too many syntax levels"},
	{ID: "nested_blocks", Body: `assert(loadstring(string.rep("do ", 2e5) .. string.rep("end ", 2e5)))`, Want: "chunk has too many syntax levels"},
	{ID: "long_concatenation", Body: `assert(loadstring("return " .. string.rep("'a' .. ", 1e5) .. "'a'"))`, Want: "chunk has too many syntax levels"},
	// 2. Endless tail calls: the traceback of the deadline's error stays short.
	{ID: "endless_tail_call", Body: `local function f() return f() end return f()`, Want: "deadline", Deadline: true},
	{ID: "endless_loop", Body: `while true do end`, Want: "deadline", Deadline: true},
	// 3. Conversions of shared sub-tables, json and yaml.
	{ID: "shared_subtables", Body: `local t = {"x"}; for i = 1, 40 do t = {t, t} end; return {v = t}`, Want: "value too large", Result: true},
	{ID: "shared_subtables_patch", Body: `local t = {"x"}; for i = 1, 40 do t = {t, t} end; ctx.patch.status.v = t`, Want: "value too large", Result: true},
	// 8. A result the API server would refuse fails for good, once.
	{ID: "result_too_large", Body: `return {data = string.rep("x", 2 * 1024 * 1024)}`, Want: "the API server stores at most 1.5 MiB in an object", Result: true},
	{ID: "json_shared_string", Body: `local s = string.rep("x", 16 * 1024 * 1024 - 64); local t = {}; for i = 1, 100 do t[i] = s end; return luaop.json.encode(t)`, Want: "value too large"},
	// 100 KB aliased 400 times expands to 40 MB, past the 16 MiB cap as the 15 MB
	// scalar is (6 GB), with a tenth of the parsing: the limit is reached long before
	// the deadline even in a race build on a loaded machine (1 MB took up to 8 s there).
	{ID: "yaml_aliases", Body: `local v, err = luaop.yaml.decode("a: &a " .. string.rep("x", 1e5) .. "\nb: [" .. string.rep("*a, ", 400) .. "*a]\n"); error(err)`, Want: "once its aliases are expanded"},
	{ID: "json_decode_values", Body: `local v, err = luaop.json.decode("[" .. string.rep("[],", 3e6) .. "[]]"); error(err)`, Want: "document too large"},
	// 4. String doubling and other builders.
	{ID: "string_doubling", Body: `local s = "x"; for i = 1, 40 do s = s .. s end`, Want: "string too large"},
	{ID: "rep_nan", Body: `local s = string.rep("a", 0/0); error("rep of NaN gave " .. #s .. " bytes")`, Want: "rep of NaN gave 0 bytes"},
	{ID: "os_date", Body: `return os.date(string.rep("%c", 8e6))`, Want: "os.date: result too large"},
	{ID: "format_q", Body: `return string.format("%q", string.rep("\0", 8e6))`, Want: "string.format: result too large"},
	{ID: "table_concat", Body: `local t = {}; for i = 1, 2e4 do t[i] = string.rep("y", 1000) end; return table.concat(t)`, Want: "table.concat: result too large"},
	// 5. Patterns.
	{ID: "pattern_lazy", Body: `return string.find(string.rep("a", 200000), ".-.-.-.-.-.-.-b")`, Want: "deadline", Deadline: true},
	{ID: "pattern_one_lazy", Body: `return string.find(string.rep("a", 990000), "a-b")`, Want: "deadline", Deadline: true},
	{ID: "pattern_match", Body: `return string.match(string.rep("a", 300000), "a-a-a-b")`, Want: "deadline", Deadline: true},
	{ID: "pattern_gsub", Body: `return string.gsub(string.rep("a", 300000), "a-a-b", "")`, Want: "deadline", Deadline: true},
	{ID: "pattern_gmatch", Body: `for m in string.gmatch(string.rep("a", 300000), "a-a-b") do end`, Want: "deadline", Deadline: true},
	{ID: "pattern_gmatch_all", Body: `local n = 0; for m in string.gmatch(string.rep("a", 16e6), "") do n = n + 1 end`, Want: "deadline", Deadline: true,
		// gmatch finds every match before the loop's first: 16 million of them
		// reach the memory budget first on a slow or busy machine.
		OrWant: "memory budget exceeded"},
	{ID: "sort_large_table", Body: `local t = {}; for i = 1, 3e6 do t[i] = (i * 7919) % 1000003 end; while true do table.sort(t); table.sort(t, function(a, b) return a > b end) end`, Want: "deadline", Deadline: true},
	// 6. Compilation inside a handler.
	{ID: "compile_data_table", Body: `local s = "return {" .. string.rep("12345, ", 1e5) .. "}"; while true do assert(loadstring(s)) end`, Want: "deadline", Deadline: true},
	// 7. Logs: a loop of ctx.logger.info stays within the call's log budget.
	{ID: "log_flood", Body: `local s = string.rep("x", 1e5); while true do ctx.logger.info(s) end`, Want: "deadline", Deadline: true},
	// 11. Messages.
	{ID: "stack_overflow", Body: `local function f() return 1 + f() end; return f()`, Want: "stack overflow"},
	{ID: "metamethod_recursion", Body: `local t = setmetatable({}, {__index = function(t, k) return t[k] end}); return t.x`, Want: "stack overflow"},
	{ID: "pcall_recursion", Body: `local function f() local ok, e = pcall(f); if not ok then error(e, 0) end end; return f()`, Want: "stack overflow"},

	// Issue 46 (round 2): every path from a Lua value to Go is bounded.
	// 1. Cycles in what is converted.
	{ID: "patch_cycle", Body: `ctx.patch.x = ctx.patch`, Want: "cycle at ctx.patch.x: it refers back to ctx.patch", Result: true},
	{ID: "result_cycle", Body: `local t = {a = {}}; t.a.b = t; return t`, Want: "cycle at a.b", Result: true},
	// 2. Messages joined or rendered before any bound: print, ctx.logger, its
	// fields, error(t), string.format("%#v"), %s: refused or cut before they are
	// built. A log message over the call's log budget is dropped (the call goes on:
	// its error shows it did).
	{ID: "print_join", Body: bigStrings + `print(unpack(t)); error("printed")`, Want: "printed"},
	{ID: "logger_join", Body: bigStrings + `ctx.logger.info(unpack(t)); error("logged")`, Want: "logged"},
	{ID: "logger_fields", Body: `local s = string.rep("a", 16 * 1024 * 1024 - 1); local f = {}; for i = 1, 300 do f["k" .. i] = s end; ctx.logger.info("m", f); error("logged")`, Want: "logged"},
	{ID: "error_table", Body: bigStrings + `error(t)`, Want: `{[1] = `},
	{ID: "format_v", Body: bigStrings + `return string.format("%#v", t)`, Want: "invalid option '%v' to 'format'"},
	{ID: "format_s", Body: `local s = string.rep("a", 16 * 1024 * 1024 - 1); return string.format("%s%s%s", s, s, s)`, Want: "string.format: result too large"},
	// 3. Builders fed from Lua: load's reader, json.encode's escapes, a deep patch.
	{ID: "load_reader", Body: `assert(load(function() return string.rep("x", 16 * 1024 * 1024) end))`, Want: "load: chunk too large"},
	{ID: "json_escapes", Body: `return luaop.json.encode(string.rep("\0", 16 * 1024 * 1024 - 64))`, Want: "more than 16777216 bytes as JSON"},
	{ID: "patch_chain", Body: `local p = ctx.patch; for i = 1, 250000 do p = p.x end`, Want: "ctx.patch: nested deeper than 100 levels"},
	// 4. The VM's limits: array growth, upvalues.
	{ID: "array_far_key", Body: `local t = {}; t[67108863] = true; error("set " .. #t .. " " .. tostring(t[67108863]))`, Want: "set 0 true"},
	{ID: "table_insert_far", Body: `local t = {}; table.insert(t, 67108000, 1); error("inserted " .. table.maxn(t))`, Want: "inserted 67108000"},
	{ID: "upvalues_257", Body: fmt.Sprintf("assert(loadstring(%q))", UpvaluesSource(257)), Want: "too many upvalues (limit is 60)"},
	{ID: "upvalues_300", Body: fmt.Sprintf("assert(loadstring(%q))", UpvaluesSource(300)), Want: "too many upvalues (limit is 60)"},
	// 5. Arguments checked as Lua checks them.
	{ID: "sleep_huge", Body: `luaop.sleep(1e10)`, Want: "deadline", Deadline: true},
	{ID: "sleep_inf", Body: `luaop.sleep(1/0)`, Want: "bad argument #1 to 'luaop.sleep' (seconds must be finite, got inf)"},
	{ID: "sleep_nan", Body: `luaop.sleep(0/0)`, Want: "bad argument #1 to 'luaop.sleep' (seconds must be a number, got nan)"},
	{ID: "sleep_negative", Body: `luaop.sleep(-5)`, Want: "bad argument #1 to 'luaop.sleep' (seconds must not be negative, got -5)"},
	{ID: "pcall_sleep", Body: `local ok, e = pcall(luaop.sleep, {}); error("[" .. e .. "]", 0)`, Want: "[" + File + ":"},
	{ID: "math_random", Body: `return math.random(0)`, Want: "bad argument #1 to 'random' (interval is empty)"},
}

// bigStrings starts a case's body: t holds 1,000 references to one string of 16
// MiB (16 GiB if anything copied each).
const bigStrings = `local s = string.rep("a", 16 * 1024 * 1024 - 1); local t = {}; for i = 1, 1000 do t[i] = s end; `

// UpvaluesSource is a chunk whose innermost function refers to n locals of the
// functions around it (a function has at most 200 locals, so they are spread over
// enclosing functions of 150): Lua 5.1 refuses more than 60 upvalues.
func UpvaluesSource(n int) string {
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

// File is the name of the script Script writes.
const File = "adversary.lua"

// Resource is the resource the script's handlers serve.
const Resource = "example.com/v1/widgets"

// Script is a script registering one create handler of Resource per case (id: the
// case's ID) and a "fine" handler returning "fine"; lines gives the line of each
// case's body.
func Script(cases []Case) (src string, lines map[string]int) {
	return ScriptFor(Resource, cases, false)
}

// ScriptFor is Script for a resource; with byLabel each handler serves only the
// objects labelled attack=<its id> (attack=fine for "fine"), so that one object
// runs one attack in an operator.
func ScriptFor(resource string, cases []Case, byLabel bool) (src string, lines map[string]int) {
	var b strings.Builder
	lines = map[string]int{}
	b.WriteString("local luaop = require(\"luaop\")\n")
	b.WriteString(fmt.Sprintf("local R = %q\n", resource))
	opts := func(id string) string {
		if byLabel {
			return fmt.Sprintf("{id = %q, labels = {attack = %q}}", id, LabelValue(id))
		}
		return fmt.Sprintf("{id = %q}", id)
	}
	line := 3
	for _, c := range cases {
		b.WriteString("luaop.on.create(R, function(ctx)\n")
		b.WriteString(c.Body + "\n")
		lines[c.ID] = line + 1
		b.WriteString("end, " + opts(c.ID) + ")\n")
		line += 3
	}
	b.WriteString("luaop.on.create(R, function(ctx) return \"fine\" end, " + opts("fine") + ")\n")
	return b.String(), lines
}

// LabelValue is the attack label of a case's objects (ScriptFor with byLabel), also
// a valid object name.
func LabelValue(id string) string { return strings.ReplaceAll(id, "_", "-") }

// LoadCase is an attack at the top level of a script file: the load must fail with
// Want naming File:Line, or succeed when Want is "".
type LoadCase struct {
	Name   string
	Source func() string
	Line   int
	Want   string
	// LongCompile: compiling the file takes a second or more on a loaded machine
	// (100,000 or 262,145 constants): suites give it a load deadline of a minute, so that the
	// limit, not the deadline, ends it on a loaded machine.
	LongCompile bool
}

// LongCompileDeadline is the load deadline of the LongCompile cases.
const LongCompileDeadline = time.Minute

// LoadCases are the attacks on loading (item 1 and 6): a file saved into the
// watched folder, a `luaop check`, the scripts guard.
var LoadCases = []LoadCase{
	{Name: "nested_tables_file", Source: func() string {
		return "local luaop = require(\"luaop\")\nreturn " + strings.Repeat("{", 1_000_000) + strings.Repeat("}", 1_000_000) + "\n"
	}, Line: 2, Want: "chunk has too many syntax levels"},
	{Name: "length_file", Source: func() string { return "return " + strings.Repeat("#", 900_000) + "x\n" }, Line: 1, Want: "chunk has too many syntax levels"},
	{Name: "concat_operands_file", Source: func() string { return "return " + strings.Repeat(`"a" .. `, 100_000) + `"a"` + "\n" }, Line: 1, Want: "chunk has too many syntax levels"},
	{Name: "nested_blocks_file", Source: func() string { return strings.Repeat("do ", 200_000) + strings.Repeat("end ", 200_000) + "\n" }, Line: 1, Want: "chunk has too many syntax levels"},
	{Name: "data_table_file", Source: func() string {
		var b strings.Builder
		b.WriteString("local data = {")
		for i := range 100_000 {
			fmt.Fprintf(&b, "%d, ", i)
		}
		b.WriteString("}\nlocal luaop = require(\"luaop\")\nluaop.on.create(\"example.com/v1/widgets\", function() return #data end, {id = \"data\"})\n")
		return b.String()
	}, LongCompile: true},
	{Name: "too_many_locals_file", Source: func() string {
		var b strings.Builder
		for i := range 250 {
			fmt.Fprintf(&b, "local v%d = %d\n", i, i)
		}
		return b.String()
	}, Line: 201, Want: "too many local variables (limit is 200)"},

	// Issue 46.
	// print joins its arguments within a budget: at the top level of a file too.
	{Name: "print_join_file", Source: func() string {
		return bigStrings + "print(unpack(t))\n"
	}},
	{Name: "upvalues_file", Source: func() string { return UpvaluesSource(300) }, Line: 303, Want: "too many upvalues (limit is 60)"},
	{Name: "constants_file", Source: func() string {
		var b strings.Builder
		b.WriteString("local t = {\n")
		for i := range 263 {
			for j := range 1000 {
				fmt.Fprintf(&b, "%d.5,", i*1000+j)
			}
			b.WriteString("\n")
		}
		b.WriteString("}\n")
		return b.String()
	}, Line: 264, Want: "constant table overflow", LongCompile: true},
	{Name: "options_nan_file", Source: func() string {
		return "local luaop = require(\"luaop\")\nluaop.on.create(\"example.com/v1/widgets\", function() end, {id = \"nan\", timeout = 0/0, retries = 0/0})\n"
	}, Line: 2, Want: "must be a number from 0 to"},
}
