package scriptcheck

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/luaop/luaop/third_party/gopher-lua/ast"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/scriptapi"
)

// KubeCall is one luaop.kube call found in the source.
type KubeCall struct {
	File string
	Line int
	Verb string // get, list, create, patch, delete, apply; reads (luaop.reads)
	// APIVersion and Kind, when Resolved: literals at the call (or locals, local
	// functions returning table constructors, luaop.adopt/label of those). For
	// luaop.reads, Kind is the resource string's last part (a plural, a kind or a
	// short name).
	APIVersion, Kind string
	Resolved         bool
}

// Function is the function of scriptapi's table the call is of (its Access says
// what the call needs).
func (c KubeCall) Function() scriptapi.Function {
	if f, ok := scriptapi.Lookup("kube." + c.Verb); ok {
		return f
	}
	f, _ := scriptapi.Lookup(c.Verb)
	return f
}

// Registration is one handler registration found in the source.
type Registration struct {
	File     string
	Line     int
	Function string // "on.create", "daemon", ...
	Resource string // "" when not a literal
}

// Analysis is what Analyze found in the source.
type Analysis struct {
	Problems      []Problem
	KubeCalls     []KubeCall
	Registrations []Registration
	syntaxErrors  bool
}

func (a *Analysis) covers(p Problem) bool {
	for _, q := range a.Problems {
		if q.File == p.File && p.Line >= q.span[0] && p.Line <= q.span[1] && q.span[0] > 0 {
			return true
		}
	}
	return false
}

// literalID is the first registration of a literal handler id: where, whether a
// change handler, and the local its function is (nil when not one).
type literalID struct {
	where  string
	change bool
	fn     *binding
}

// binding is what a local name is bound to.
type binding struct {
	init   ast.Expr // its initializer (nil: unknown)
	scope  *scope   // where the initializer is evaluated
	module bool     // require("luaop")
}

type scope struct {
	parent *scope
	names  map[string]*binding
}

func (s *scope) lookup(name string) *binding {
	for ; s != nil; s = s.parent {
		if b, ok := s.names[name]; ok {
			return b
		}
	}
	return nil
}

func (s *scope) child() *scope { return &scope{parent: s, names: map[string]*binding{}} }

type analyzer struct {
	a        *Analysis
	file     string
	globals  map[string][]string        // the sandbox's
	defined  map[string]map[string]bool // per file, the globals it assigns
	ids      map[string]literalID       // literal handler ids -> their first registration
	reported map[string]bool
	quiet    bool // evaluating, not reporting
}

// Analyze reads the scripts' source without running it, each file compiled under
// the default handler deadline.
func Analyze(scripts []luabind.Script) *Analysis {
	return analyze(context.Background(), scripts, luabind.DefaultHandlerTimeout)
}

// analyze is Analyze with each file's compilation under ctx and timeout (the load
// deadline of the operator).
func analyze(ctx context.Context, scripts []luabind.Script, timeout time.Duration) *Analysis {
	a := &Analysis{}
	chunks := map[string][]ast.Stmt{}
	for _, s := range scripts {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		chunk, err := luabind.ParseScript(cctx, s)
		timedOut := cctx.Err() != nil && ctx.Err() == nil
		cancel()
		if err != nil {
			a.syntaxErrors = true
			p := problemOf(err)
			if timedOut {
				p.Message = fmt.Sprintf("compiling took longer than the %s load deadline (--handler-timeout): %s", timeout, p.Message)
			} else if hint := lua5Hint(s.Source, p.Line); hint != "" && strings.HasPrefix(p.Message, "syntax error") {
				p.Message = hint
			}
			a.Problems = append(a.Problems, p)
			continue
		}
		chunks[s.Name] = chunk
	}
	z := &analyzer{a: a, globals: luabind.SandboxGlobals(), defined: map[string]map[string]bool{}, ids: map[string]literalID{}, reported: map[string]bool{}}
	names := make([]string, 0, len(chunks))
	for n := range chunks {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		z.defined[n] = map[string]bool{}
		collectGlobals(chunks[n], z.defined[n])
	}
	for _, n := range names {
		z.file = n
		z.block(chunks[n], &scope{names: map[string]*binding{}})
	}
	return a
}

// collectGlobals finds the globals a chunk assigns (at any depth; locals shadowing
// them are not told apart, which only makes the check more lenient).
func collectGlobals(stmts []ast.Stmt, out map[string]bool) {
	walkStmts(stmts, func(st ast.Stmt) {
		switch st := st.(type) {
		case *ast.AssignStmt:
			for _, l := range st.Lhs {
				if id, ok := l.(*ast.IdentExpr); ok {
					out[id.Value] = true
				}
			}
		case *ast.FuncDefStmt:
			if id, ok := st.Name.Func.(*ast.IdentExpr); ok {
				out[id.Value] = true
			}
		}
	})
}

// walkStmts calls fn for every statement, nested blocks and function bodies included.
func walkStmts(stmts []ast.Stmt, fn func(ast.Stmt)) {
	var exprs func(es ...ast.Expr)
	exprs = func(es ...ast.Expr) {
		for _, e := range es {
			switch e := e.(type) {
			case *ast.FunctionExpr:
				walkStmts(e.Stmts, fn)
			case *ast.FuncCallExpr:
				exprs(e.Func, e.Receiver)
				exprs(e.Args...)
			case *ast.TableExpr:
				for _, f := range e.Fields {
					exprs(f.Key, f.Value)
				}
			case *ast.AttrGetExpr:
				exprs(e.Object, e.Key)
			case *ast.LogicalOpExpr:
				exprs(e.Lhs, e.Rhs)
			case *ast.RelationalOpExpr:
				exprs(e.Lhs, e.Rhs)
			case *ast.ArithmeticOpExpr:
				exprs(e.Lhs, e.Rhs)
			case *ast.StringConcatOpExpr:
				exprs(e.Lhs, e.Rhs)
			case *ast.UnaryMinusOpExpr:
				exprs(e.Expr)
			case *ast.UnaryNotOpExpr:
				exprs(e.Expr)
			case *ast.UnaryLenOpExpr:
				exprs(e.Expr)
			}
		}
	}
	for _, st := range stmts {
		fn(st)
		switch st := st.(type) {
		case *ast.AssignStmt:
			exprs(st.Lhs...)
			exprs(st.Rhs...)
		case *ast.LocalAssignStmt:
			exprs(st.Exprs...)
		case *ast.FuncCallStmt:
			exprs(st.Expr)
		case *ast.DoBlockStmt:
			walkStmts(st.Stmts, fn)
		case *ast.WhileStmt:
			exprs(st.Condition)
			walkStmts(st.Stmts, fn)
		case *ast.RepeatStmt:
			walkStmts(st.Stmts, fn)
			exprs(st.Condition)
		case *ast.IfStmt:
			exprs(st.Condition)
			walkStmts(st.Then, fn)
			walkStmts(st.Else, fn)
		case *ast.NumberForStmt:
			exprs(st.Init, st.Limit, st.Step)
			walkStmts(st.Stmts, fn)
		case *ast.GenericForStmt:
			exprs(st.Exprs...)
			walkStmts(st.Stmts, fn)
		case *ast.FuncDefStmt:
			exprs(st.Func)
		case *ast.ReturnStmt:
			exprs(st.Exprs...)
		}
	}
}

func (z *analyzer) problem(rule string, line int, span [2]int, format string, args ...any) {
	if z.quiet {
		return
	}
	p := Problem{File: z.file, Line: line, Message: fmt.Sprintf(format, args...), Rule: rule, span: span}
	key := p.String()
	if z.reported[key] {
		return
	}
	z.reported[key] = true
	z.a.Problems = append(z.a.Problems, p)
}

func (z *analyzer) block(stmts []ast.Stmt, sc *scope) {
	for _, st := range stmts {
		z.stmt(st, sc)
	}
}

func (z *analyzer) stmt(st ast.Stmt, sc *scope) {
	switch st := st.(type) {
	case *ast.LocalAssignStmt:
		// `local function f` (and, in gopher-lua, `local f = function`: the parser
		// gives both the same tree) binds f before its body is compiled, so that
		// the body's f is the local (recursion); any other local is bound after
		// its initializers. The compiler decides so (compileLocalAssignStmt): the
		// check must agree with it.
		if isLocalFunction(st) {
			sc.names[st.Names[0]] = &binding{scope: sc, init: st.Exprs[0]}
		}
		for _, e := range st.Exprs {
			z.expr(e, sc)
		}
		if isLocalFunction(st) {
			return
		}
		for i, n := range st.Names {
			b := &binding{scope: sc}
			if i < len(st.Exprs) {
				b.init = st.Exprs[i]
				b.module = isRequireLuaop(st.Exprs[i])
			}
			sc.names[n] = b
		}
	case *ast.AssignStmt:
		for _, e := range st.Rhs {
			z.expr(e, sc)
		}
		for _, e := range st.Lhs {
			if _, ok := e.(*ast.IdentExpr); ok {
				continue // a write
			}
			if ag, ok := e.(*ast.AttrGetExpr); ok {
				z.expr(ag.Object, sc)
				z.expr(ag.Key, sc)
				continue
			}
			z.expr(e, sc)
		}
	case *ast.FuncCallStmt:
		z.expr(st.Expr, sc)
	case *ast.DoBlockStmt:
		z.block(st.Stmts, sc.child())
	case *ast.WhileStmt:
		z.expr(st.Condition, sc)
		z.block(st.Stmts, sc.child())
	case *ast.RepeatStmt:
		inner := sc.child()
		z.block(st.Stmts, inner)
		z.expr(st.Condition, inner)
	case *ast.IfStmt:
		z.expr(st.Condition, sc)
		z.block(st.Then, sc.child())
		z.block(st.Else, sc.child())
	case *ast.NumberForStmt:
		z.expr(st.Init, sc)
		z.expr(st.Limit, sc)
		if st.Step != nil {
			z.expr(st.Step, sc)
		}
		inner := sc.child()
		inner.names[st.Name] = &binding{}
		z.block(st.Stmts, inner)
	case *ast.GenericForStmt:
		for _, e := range st.Exprs {
			z.expr(e, sc)
		}
		inner := sc.child()
		for _, n := range st.Names {
			inner.names[n] = &binding{}
		}
		z.block(st.Stmts, inner)
	case *ast.FuncDefStmt:
		if st.Name.Receiver != nil {
			z.expr(st.Name.Receiver, sc)
		} else if ag, ok := st.Name.Func.(*ast.AttrGetExpr); ok {
			z.expr(ag.Object, sc)
		}
		z.function(st.Func, sc, st.Name.Method != "")
	case *ast.ReturnStmt:
		for _, e := range st.Exprs {
			z.expr(e, sc)
		}
	}
}

func (z *analyzer) function(f *ast.FunctionExpr, sc *scope, method bool) {
	inner := sc.child()
	if method {
		inner.names["self"] = &binding{}
	}
	if f.ParList != nil {
		for _, n := range f.ParList.Names {
			inner.names[n] = &binding{}
		}
		if f.ParList.HasVargs {
			inner.names["arg"] = &binding{}
		}
	}
	z.block(f.Stmts, inner)
}

// isLocalFunction tells whether a local statement binds one name to a function
// (local function f, or local f = function): the compiler registers the local
// before it compiles the function, so that the function sees itself.
func isLocalFunction(st *ast.LocalAssignStmt) bool {
	if len(st.Names) != 1 || len(st.Exprs) != 1 {
		return false
	}
	_, ok := st.Exprs[0].(*ast.FunctionExpr)
	return ok
}

func isRequireLuaop(e ast.Expr) bool {
	c, ok := e.(*ast.FuncCallExpr)
	if !ok || len(c.Args) != 1 {
		return false
	}
	id, ok := c.Func.(*ast.IdentExpr)
	s, isStr := c.Args[0].(*ast.StringExpr)
	return ok && id.Value == "require" && isStr && s.Value == "luaop"
}

// modulePath resolves luaop.on.create to "on.create" when the root is the module.
func modulePath(e ast.Expr, sc *scope) (string, bool) {
	var parts []string
	for {
		switch x := e.(type) {
		case *ast.AttrGetExpr:
			k, ok := x.Key.(*ast.StringExpr)
			if !ok {
				return "", false
			}
			parts = append([]string{k.Value}, parts...)
			e = x.Object
			continue
		case *ast.IdentExpr:
			b := sc.lookup(x.Value)
			if b == nil || !b.module || len(parts) == 0 {
				return "", false
			}
			return strings.Join(parts, "."), true
		case *ast.FuncCallExpr:
			if isRequireLuaop(x) && len(parts) > 0 {
				return strings.Join(parts, "."), true
			}
		}
		return "", false
	}
}

func (z *analyzer) expr(e ast.Expr, sc *scope) {
	switch e := e.(type) {
	case nil:
	case *ast.IdentExpr:
		z.global(e, sc)
	case *ast.AttrGetExpr:
		if id, ok := e.Object.(*ast.IdentExpr); ok && sc.lookup(id.Value) == nil && !z.defined[z.file][id.Value] {
			if fields, lib := z.globals[id.Value]; lib && fields != nil {
				if k, ok := e.Key.(*ast.StringExpr); ok && !contains(fields, k.Value) {
					z.problem(RuleSandbox, e.Line(), [2]int{}, "%s.%s is not available in luaop's sandbox (its %s has %s)", id.Value, k.Value, id.Value, strings.Join(fields, ", "))
					return
				}
			}
		}
		z.expr(e.Object, sc)
		z.expr(e.Key, sc)
	case *ast.FuncCallExpr:
		z.call(e, sc)
		z.exprs(sc, e.Func, e.Receiver)
		z.exprs(sc, e.Args...)
	case *ast.TableExpr:
		for _, f := range e.Fields {
			z.exprs(sc, f.Key, f.Value)
		}
	case *ast.FunctionExpr:
		z.function(e, sc, false)
	case *ast.LogicalOpExpr:
		z.exprs(sc, e.Lhs, e.Rhs)
	case *ast.RelationalOpExpr:
		z.exprs(sc, e.Lhs, e.Rhs)
	case *ast.ArithmeticOpExpr:
		z.exprs(sc, e.Lhs, e.Rhs)
	case *ast.StringConcatOpExpr:
		z.exprs(sc, e.Lhs, e.Rhs)
	case *ast.UnaryMinusOpExpr:
		z.expr(e.Expr, sc)
	case *ast.UnaryNotOpExpr:
		z.expr(e.Expr, sc)
	case *ast.UnaryLenOpExpr:
		z.expr(e.Expr, sc)
	}
}

// exprs walks each of es in order, in the scope sc.
func (z *analyzer) exprs(sc *scope, es ...ast.Expr) {
	for _, e := range es {
		z.expr(e, sc)
	}
}

var missingGlobals = map[string]string{
	"io":         "no file or console I/O: use print or ctx.logger for output",
	"debug":      "",
	"coroutine":  "use luaop.daemon for long-running work and luaop.sleep to wait",
	"dofile":     "use require of a module in the scripts folder",
	"loadfile":   "use require of a module in the scripts folder",
	"load":       "",
	"channel":    "",
	"bit32":      "",
	"utf8":       "",
	"loadstring": "",
	"package":    "require(\"name\") loads the modules of the scripts folder",
	"module":     "a module file returns its table (return M), which require gives every script",
}

func (z *analyzer) global(id *ast.IdentExpr, sc *scope) {
	name := id.Value
	if sc.lookup(name) != nil || z.defined[z.file][name] {
		return
	}
	if _, ok := z.globals[name]; ok {
		return
	}
	for _, other := range sortedKeys(z.defined) {
		if z.defined[other][name] {
			z.problem(RuleSeparateGlobals, id.Line(), [2]int{}, "%s is a global of %s, and each script has its own globals: share it through a module (return it from lib/name.lua, then local name = require(\"lib.name\"))", name, other)
			return
		}
	}
	hint := missingGlobals[name]
	if hint != "" {
		hint = "; " + hint
	}
	z.problem(RuleSandbox, id.Line(), [2]int{}, "%s is not available in luaop's sandbox (Lua 5.1 without io, debug, coroutine, dofile, loadfile, package, module)%s", name, hint)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
