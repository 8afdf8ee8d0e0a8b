package luabind

import (
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	lua "github.com/luaop/luaop/third_party/gopher-lua"
	"github.com/luaop/luaop/third_party/gopher-lua/parse"

	"github.com/luaop/luaop/scriptapi"
)

// stubDoc is what the tests read from the ---@meta file: the classes with their
// fields, the documented functions with their doc blocks, and the declared types.
type stubDoc struct {
	classes map[string]map[string]string // class -> field -> first token of its type
	funcs   map[string]stubFunc          // "luaop.kube.get" -> its doc
	types   map[string]bool              // names declared by @class, @alias, @generic
}

type stubFunc struct {
	params []string
	doc    []string // the --- lines right above the function
}

var (
	stubClassLine = regexp.MustCompile(`^---@class\s+(?:\([^)]*\)\s*)?([A-Za-z_][\w.]*)`)
	stubAliasLine = regexp.MustCompile(`^---@alias\s+([A-Za-z_][\w.]*)`)
	stubGeneric   = regexp.MustCompile(`^---@generic\s+(.*)$`)
	stubFieldLine = regexp.MustCompile(`^---@field\s+(\[[^\]]*\]|[A-Za-z_]\w*)\??\s+(\S+)`)
	stubFuncLine  = regexp.MustCompile(`^function\s+(luaop(?:\.[A-Za-z_]\w*)+)\(([^)]*)\)`)
	stubParamLine = regexp.MustCompile(`^---@param\s+([A-Za-z_]\w*|\.\.\.)\??\s`)
)

func parseStubs(t *testing.T, text string) stubDoc {
	t.Helper()
	d := stubDoc{classes: map[string]map[string]string{}, funcs: map[string]stubFunc{}, types: map[string]bool{}}
	lines := strings.Split(text, "\n")
	class := "" // the class whose ---@field lines follow
	for i, raw := range lines {
		line := strings.TrimSpace(raw)
		if !strings.HasPrefix(line, "---") {
			class = ""
		}
		if m := stubClassLine.FindStringSubmatch(line); m != nil {
			class = m[1]
			d.types[class] = true
			if d.classes[class] == nil {
				d.classes[class] = map[string]string{}
			}
			continue
		}
		if m := stubAliasLine.FindStringSubmatch(line); m != nil {
			d.types[m[1]] = true
		}
		if m := stubGeneric.FindStringSubmatch(line); m != nil {
			for _, g := range strings.Split(m[1], ",") {
				d.types[strings.TrimSpace(strings.SplitN(g, ":", 2)[0])] = true
			}
		}
		if m := stubFieldLine.FindStringSubmatch(line); m != nil {
			if class == "" {
				t.Errorf("stubs line %d: ---@field outside a ---@class block: %s", i+1, line)
				continue
			}
			if _, dup := d.classes[class][m[1]]; dup {
				t.Errorf("stubs line %d: field %s of %s documented twice", i+1, m[1], class)
			}
			d.classes[class][m[1]] = m[2]
		}
		if m := stubFuncLine.FindStringSubmatch(line); m != nil {
			var params []string
			for _, p := range strings.Split(m[2], ",") {
				if p = strings.TrimSpace(p); p != "" {
					params = append(params, p)
				}
			}
			var doc []string
			for j := i - 1; j >= 0 && strings.HasPrefix(strings.TrimSpace(lines[j]), "---"); j-- {
				doc = append([]string{strings.TrimSpace(lines[j])}, doc...)
			}
			if _, dup := d.funcs[m[1]]; dup {
				t.Errorf("stubs line %d: function %s documented twice", i+1, m[1])
			}
			d.funcs[m[1]] = stubFunc{params: params, doc: doc}
		}
	}
	return d
}

func TestStubsParse(t *testing.T) {
	text := Stubs()
	if !strings.HasPrefix(text, "---@meta luaop\n") {
		t.Errorf("the stubs must start with the line ---@meta luaop (LuaLS resolves require(\"luaop\") by it)")
	}
	if !strings.HasSuffix(strings.TrimSpace(text), "return luaop") {
		t.Errorf("the stubs must end with return luaop (the type require(\"luaop\") gets)")
	}
	if _, err := parse.Parse(strings.NewReader(text), "luaop.lua"); err != nil {
		t.Fatalf("the stubs are not valid Lua: %v", err)
	}
	// The file also runs, and returns the module table with its sub-tables: a
	// `function luaop.x.y` over an undefined luaop.x would fail here.
	L := lua.NewState()
	defer L.Close()
	if err := L.DoString(text); err != nil {
		t.Fatalf("the stubs do not run: %v", err)
	}
	mod, ok := L.Get(-1).(*lua.LTable)
	if !ok {
		t.Fatalf("the stubs return %s, want the module table", L.Get(-1).Type())
	}
	if _, ok := mod.RawGetString("on").(*lua.LTable).RawGetString("create").(*lua.LFunction); !ok {
		t.Errorf("the stubs' module has no function on.create")
	}
}

// TestStubsDocumentModule walks the `luaop` module of a real shard: every function
// must be documented as `function luaop.<path>(...)`, every other value (markers,
// sub-tables) as a ---@field of the class of its table, sub-tables recursively. And
// nothing is documented that the module does not have.
func TestStubsDocumentModule(t *testing.T) {
	d := parseStubs(t, Stubs())
	r := New(Options{Shards: 1})
	defer r.Close()
	mod := r.shards[0].Load().module

	seenFuncs := map[string]bool{}
	var walk func(tbl *lua.LTable, path, class string)
	walk = func(tbl *lua.LTable, path, class string) {
		fields := d.classes[class]
		var keys []string
		tbl.ForEach(func(k, _ lua.LValue) {
			ks, ok := k.(lua.LString)
			if !ok {
				t.Errorf("%s has a non-string key %s", path, k)
				return
			}
			keys = append(keys, string(ks))
		})
		sort.Strings(keys)
		inModule := map[string]bool{}
		for _, name := range keys {
			inModule[name] = true
			full := path + "." + name
			switch v := tbl.RawGetString(name).(type) {
			case *lua.LFunction:
				seenFuncs[full] = true
				if _, ok := d.funcs[full]; !ok {
					t.Errorf("%s is not documented: add `function %s(...) end` with ---@param/---@return to luaop_meta.lua", full, full)
				}
			case *lua.LTable:
				typ, ok := fields[name]
				switch {
				case class == "": // already reported for an enclosing table
				case !ok:
					t.Errorf("table %s is not documented: add `---@field %s <Class>` to ---@class %s in luaop_meta.lua", full, name, class)
				case d.classes[typ] == nil:
					t.Errorf("%s is documented as %s, which is not a ---@class", full, typ)
				}
				if d.classes[typ] == nil {
					typ = "" // still walk it, for its functions
				}
				walk(v, full, typ)
			default:
				if _, ok := fields[name]; !ok && class != "" {
					t.Errorf("%s (a %s) is not documented: add `---@field %s <type>` to ---@class %s in luaop_meta.lua", full, v.Type(), name, class)
				}
			}
		}
		for name := range fields {
			if !inModule[name] {
				t.Errorf("---@class %s documents field %s, which %s does not have", class, name, path)
			}
		}
	}
	walk(mod, "luaop", "LuaopModule")
	if len(seenFuncs) < 30 {
		t.Errorf("found only %d functions in the module: the walk is broken", len(seenFuncs))
	}
	for name := range d.funcs {
		if !seenFuncs[name] {
			t.Errorf("the stubs document %s, which the module does not have", name)
		}
	}
}

// TestStubsDocumentFunctions: every documented function has a description and a
// ---@param for each of its parameters.
func TestStubsDocumentFunctions(t *testing.T) {
	d := parseStubs(t, Stubs())
	for name, f := range d.funcs {
		params := map[string]bool{}
		described := false
		for _, line := range f.doc {
			if m := stubParamLine.FindStringSubmatch(line); m != nil {
				params[m[1]] = true
			}
			if !strings.HasPrefix(line, "---@") && strings.TrimSpace(strings.TrimPrefix(line, "---")) != "" {
				described = true
			}
		}
		if !described {
			t.Errorf("%s has no description line above it", name)
		}
		for _, p := range f.params {
			if !params[p] {
				t.Errorf("%s: parameter %s has no ---@param", name, p)
			}
		}
		for p := range params {
			if !slicesContains(f.params, p) {
				t.Errorf("%s: ---@param %s is not a parameter of the function", name, p)
			}
		}
	}
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// ctxFieldNames extracts the keys ctxField serves from the case labels of its switch.
func ctxFieldNames(t *testing.T) []string {
	t.Helper()
	src, err := os.ReadFile("call.go")
	if err != nil {
		t.Fatal(err)
	}
	text := string(src)
	start := strings.Index(text, "func (s *shard) ctxField(")
	if start < 0 {
		t.Fatal("func ctxField not found in call.go")
	}
	body := text[start:]
	if end := strings.Index(body, "\n}\n"); end > 0 {
		body = body[:end]
	}
	caseLine := regexp.MustCompile(`(?m)^\s*case\s+("[^"]*"(?:\s*,\s*"[^"]*")*)\s*:`)
	quoted := regexp.MustCompile(`"([^"]*)"`)
	var names []string
	for _, m := range caseLine.FindAllStringSubmatch(body, -1) {
		for _, q := range quoted.FindAllStringSubmatch(m[1], -1) {
			names = append(names, q[1])
		}
	}
	if len(names) < 20 {
		t.Fatalf("found only %d ctx fields in ctxField (%v): the extraction is broken", len(names), names)
	}
	return names
}

func TestStubsDocumentCtxFields(t *testing.T) {
	d := parseStubs(t, Stubs())
	fields := d.classes["HandlerContext"]
	if fields == nil {
		t.Fatal("no ---@class HandlerContext in the stubs")
	}
	served := map[string]bool{}
	for _, name := range ctxFieldNames(t) {
		served[name] = true
		if _, ok := fields[name]; !ok {
			t.Errorf("ctx.%s is not documented: add `---@field %s <type> <description>` to ---@class HandlerContext", name, name)
		}
	}
	for name := range fields {
		if !served[name] {
			t.Errorf("---@class HandlerContext documents %s, which ctxField does not serve", name)
		}
	}
}

func TestStubsDocumentOptions(t *testing.T) {
	d := parseStubs(t, Stubs())
	fields := d.classes["HandlerOptions"]
	if fields == nil {
		t.Fatal("no ---@class HandlerOptions in the stubs")
	}
	for _, name := range scriptapi.HandlerOptions {
		if _, ok := fields[name]; !ok {
			t.Errorf("option %s is not documented: add `---@field %s? <type> <description>` to ---@class HandlerOptions", name, name)
		}
	}
	for name := range fields {
		if !scriptapi.IsHandlerOption(name) {
			t.Errorf("---@class HandlerOptions documents %s, which is not in scriptapi.HandlerOptions", name)
		}
	}
}

// TestStubsTypes: every type named in a ---@field, ---@param or ---@return is a
// built-in type or declared in the file, so that a misspelt class name (which LuaLS
// silently treats as unknown) fails here.
func TestStubsTypes(t *testing.T) {
	d := parseStubs(t, Stubs())
	builtin := map[string]bool{}
	for _, b := range strings.Fields("any nil boolean true false string number integer table userdata function fun thread lightuserdata self unknown") {
		builtin[b] = true
	}
	annotation := regexp.MustCompile(`^---@(field|param|return)\s+(.*)$`)
	ident := regexp.MustCompile(`[A-Za-z_][\w.]*(\??\s*:)?`)
	literal := regexp.MustCompile(`"[^"]*"`)
	for i, raw := range strings.Split(Stubs(), "\n") {
		m := annotation.FindStringSubmatch(strings.TrimSpace(raw))
		if m == nil {
			continue
		}
		rest := m[2]
		if m[1] != "return" { // skip the field or parameter name
			f := strings.Fields(rest)
			if len(f) < 2 {
				t.Errorf("stubs line %d: ---@%s without a type: %s", i+1, m[1], raw)
				continue
			}
			rest = strings.TrimSpace(strings.TrimPrefix(rest, f[0]))
		}
		typ := literal.ReplaceAllString(stubTypeExpr(rest), `""`)
		for _, id := range ident.FindAllString(typ, -1) {
			if strings.HasSuffix(id, ":") { // a parameter or table field name
				continue
			}
			if !builtin[id] && !d.types[id] {
				t.Errorf("stubs line %d: unknown type %s in %q", i+1, id, strings.TrimSpace(raw))
			}
		}
	}
}

// stubTypeExpr returns the type at the start of an annotation's text: up to the first
// blank outside brackets that does not continue the type (after ':', ',' or '|', or
// before '|').
func stubTypeExpr(s string) string {
	depth := 0
	inString := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"':
			inString = !inString
		case inString:
		case c == '(' || c == '{' || c == '<' || c == '[':
			depth++
		case c == ')' || c == '}' || c == '>' || c == ']':
			depth--
		case c == ' ' && depth == 0:
			prev := strings.TrimRight(s[:i], " ")
			next := strings.TrimLeft(s[i:], " ")
			if strings.HasSuffix(prev, ":") || strings.HasSuffix(prev, ",") || strings.HasSuffix(prev, "|") || strings.HasPrefix(next, "|") {
				continue
			}
			return s[:i]
		}
	}
	return s
}
