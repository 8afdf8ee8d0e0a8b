package luabind

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/luaop/luaop/third_party/gopher-lua/ast"

	"github.com/luaop/luaop/luabind/internal/sandbox"
)

// Problem is one finding of Check, at a file and line of the scripts.
type Problem struct {
	File    string
	Line    int // 0: the file as a whole
	Message string
	// span is the first and last line of the registration call a problem was found
	// in: a load error inside it is the same problem, reported once.
	span [2]int
}

func (p Problem) String() string {
	if p.Line <= 0 {
		return p.File + ": " + p.Message
	}
	return fmt.Sprintf("%s:%d: %s", p.File, p.Line, p.Message)
}

// CheckReport is what Check found.
type CheckReport struct {
	Problems []Problem
	// Handlers are the handlers the scripts register when they load (none when
	// they do not load).
	Handlers []string
	Files    int
}

// Check loads the scripts the way the operator does (the same sandbox, option
// validation and duplicate-id checks; no cluster: luaop.kube calls made while
// loading fail with an error value) and analyses their source for what would fail
// only at run time: syntax of Lua 5.2 and later, globals the sandbox lacks, options
// that do not apply to a handler's kind, resource strings that do not parse. Every
// compile error is reported (each file on its own), and the errors raised while
// the scripts run: the load's, as the operator would see it, and each handler
// script's loaded on its own.
//
// opts are the operator's options the check must hold to: HandlerTimeout (each
// file's compilation and the load run under it, as in the operator), MaxStringSize
// and MemoryBudget; zero fields take their defaults, the others are the check's.
func Check(ctx context.Context, scripts []Script, opts Options) CheckReport {
	rep := CheckReport{Files: len(scripts)}
	if len(scripts) == 0 {
		rep.Problems = append(rep.Problems, Problem{File: ".", Message: "no *.lua files"})
		return rep
	}
	opts = checkOptions(opts)
	a := analyze(ctx, scripts, opts.HandlerTimeout)
	rep.Problems = append(rep.Problems, a.Problems...)
	if !a.syntaxErrors {
		rt := New(opts)
		defer rt.Close()
		report, err := rt.Load(ctx, scripts)
		if err != nil {
			for _, p := range loadProblems(ctx, scripts, err, opts) {
				if !a.covers(p) && !slices.ContainsFunc(rep.Problems, func(q Problem) bool { return q.String() == p.String() }) {
					rep.Problems = append(rep.Problems, p)
				}
			}
		} else {
			for _, h := range report.Handlers {
				rep.Handlers = append(rep.Handlers, h.ID)
			}
		}
	}
	sortProblems(rep.Problems)
	return rep
}

// loadProblems are the problems of a load that failed with err: err's, and those
// of each handler script loaded on its own with the modules (a load stops at its
// first error, which would hide the others' problems), each under opts (the
// check's options, as the whole load).
func loadProblems(ctx context.Context, scripts []Script, err error, opts Options) []Problem {
	out := []Problem{problemOf(err)}
	var modules, handlers []Script
	for _, s := range scripts {
		if strings.Contains(s.Name, "/") {
			modules = append(modules, s)
		} else {
			handlers = append(handlers, s)
		}
	}
	if len(handlers) < 2 {
		return out
	}
	for _, h := range handlers {
		rt := New(opts)
		_, err := rt.Load(ctx, append([]Script{h}, modules...))
		rt.Close()
		if err != nil {
			out = append(out, problemOf(err))
		}
	}
	return out
}

// CheckLoad loads the scripts in a throwaway runtime, the way the operator would
// (the same sandbox, option validation, duplicate ids, modules), without a cluster
// (luaop.kube calls made while loading fail with an error value), and returns the
// load's error with its file:line, or nil when they load. No other runtime is
// touched. The admission webhook guarding the operator's own scripts ConfigMap uses
// it.
// opts as for Check.
func CheckLoad(ctx context.Context, scripts []Script, opts Options) error {
	if len(scripts) == 0 {
		return errors.New("no *.lua files")
	}
	rt := New(checkOptions(opts))
	defer rt.Close()
	_, err := rt.Load(ctx, scripts)
	return err
}

// checkOptions are the options of a throwaway runtime checking scripts: the
// caller's limits, one shard, no cluster, no log.
func checkOptions(opts Options) Options {
	out := Options{Shards: 1, Kube: noCluster{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		HandlerTimeout: opts.HandlerTimeout, MaxStringSize: opts.MaxStringSize, MemoryBudget: opts.MemoryBudget}
	out.setDefaults()
	return out
}

func sortProblems(ps []Problem) {
	sort.SliceStable(ps, func(i, j int) bool {
		if ps[i].File != ps[j].File {
			return ps[i].File < ps[j].File
		}
		return ps[i].Line < ps[j].Line
	})
}

var fileLine = regexp.MustCompile(`^([^\s:]+\.lua):(\d+): (?s)(.*)$`)

// problemOf turns a load error into a Problem with its file and line.
func problemOf(err error) Problem {
	var se *ScriptError
	if errors.As(err, &se) && se.File != "" {
		msg := se.Message
		// A message raised by a registration function carries the position again.
		if m := fileLine.FindStringSubmatch(msg); m != nil && m[1] == se.File {
			msg = m[3]
		}
		return Problem{File: se.File, Line: se.Line, Message: msg}
	}
	msg := err.Error()
	if m := fileLine.FindStringSubmatch(msg); m != nil {
		var line int
		fmt.Sscan(m[2], &line)
		return Problem{File: m[1], Line: line, Message: m[3]}
	}
	return Problem{File: ".", Message: msg}
}

// noCluster answers luaop.kube calls made while checking.
type noCluster struct{}

var errNoCluster = errors.New("no cluster: luaop check runs the scripts without one")

func (noCluster) Get(context.Context, string, string, string, string) (map[string]any, error) {
	return nil, errNoCluster
}
func (noCluster) List(context.Context, string, string, string, string) ([]map[string]any, error) {
	return nil, errNoCluster
}
func (noCluster) Create(context.Context, map[string]any) (map[string]any, error) {
	return nil, errNoCluster
}
func (noCluster) Patch(context.Context, string, string, string, string, any, string) (map[string]any, error) {
	return nil, errNoCluster
}
func (noCluster) Delete(context.Context, string, string, string, string) error { return errNoCluster }
func (noCluster) Apply(context.Context, map[string]any, bool) (map[string]any, error) {
	return nil, errNoCluster
}
func (noCluster) Event(context.Context, map[string]any, string, string, string) error {
	return errNoCluster
}

// SandboxGlobals lists the globals a script sees, with the fields of those that are
// library tables (string, table, math, os), from a real sandbox state.
func SandboxGlobals() map[string][]string {
	L := sandbox.NewState(sandbox.Options{})
	defer L.Close()
	out := sandbox.NewIsolation(L, nil).Globals()
	out["require"], out["_G"] = nil, nil
	return out
}

// Luacheckrc is a .luacheckrc that makes luacheck (Debian's lua-check) see the
// scripts as luaop runs them: Lua 5.1 with exactly the sandbox's globals (no io,
// debug, coroutine, os.getenv, ...).
func Luacheckrc() string {
	globals := SandboxGlobals()
	names := make([]string, 0, len(globals))
	for n := range globals {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("-- luacheck configuration for luaop scripts, written by `luaop stubs --luacheckrc`.\n")
	b.WriteString("-- The globals are those of luaop's sandbox (gopher-lua, Lua 5.1): no io, debug,\n")
	b.WriteString("-- coroutine, dofile or loadfile; os has only clock, date and time. The luaop module\n")
	b.WriteString("-- comes from require(\"luaop\"), not from a global.\n")
	b.WriteString("stds.luaop = {\n  read_globals = {\n")
	for _, n := range names {
		fields := globals[n]
		if fields == nil {
			fmt.Fprintf(&b, "    %q,\n", n)
			continue
		}
		fmt.Fprintf(&b, "    %s = { fields = {", n)
		for i, f := range fields {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, " %q", f)
		}
		b.WriteString(" } },\n")
	}
	b.WriteString("  },\n}\n")
	b.WriteString("std = \"luaop\"\n")
	b.WriteString("-- Each script has its own globals (files share values through require), so a\n-- global a file defines at its top level is that file's.\nallow_defined_top = true\n")
	b.WriteString("max_line_length = false\n")
	b.WriteString("-- Handlers receive ctx whether they use it or not.\nignore = { \"212/ctx\" }\n")
	return b.String()
}

// lua5Hints are constructs of Lua 5.2 and later that gopher-lua (Lua 5.1) rejects,
// looked for on the line of a syntax error.
var lua5Hints = []struct {
	re   *regexp.Regexp
	hint string
}{
	{regexp.MustCompile(`//`), "'//' (floor division, Lua 5.3) is not Lua 5.1: write math.floor(a / b)"},
	{regexp.MustCompile(`<<|>>`), "bit shifts (Lua 5.3) are not Lua 5.1, and luaop's sandbox has no bit library: use arithmetic (a * 2^n, math.floor(a / 2^n))"},
	{regexp.MustCompile(`<\s*(const|close)\s*>`), "local attributes <const>/<close> (Lua 5.4) are not Lua 5.1: drop them"},
	{regexp.MustCompile(`[^~=<>]~[^=]|&|\|`), "bitwise operators (&, |, ~: Lua 5.3) are not Lua 5.1, and luaop's sandbox has no bit library"},
}

// codeOfLine is the line without strings and comments (good enough for hints).
var stringsAndComments = regexp.MustCompile(`--.*$|"(\\.|[^"\\])*"|'(\\.|[^'\\])*'`)

func lua5Hint(src []byte, line int) string {
	lines := strings.Split(string(src), "\n")
	if line <= 0 || line > len(lines) {
		return ""
	}
	code := stringsAndComments.ReplaceAllString(lines[line-1], `""`)
	for _, h := range lua5Hints {
		if h.re.MatchString(code) {
			return h.hint
		}
	}
	return ""
}

// ---- static analysis -------------------------------------------------------------

// KubeCall is one luaop.kube call found in the source.
type KubeCall struct {
	File string
	Line int
	Verb string // get, list, create, patch, delete, apply
	// APIVersion and Kind, when Resolved: literals at the call (or locals, local
	// functions returning table constructors, luaop.adopt/label of those).
	APIVersion, Kind string
	Resolved         bool
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

// regKind groups the registering functions whose options and arguments are alike.
type regKind string

const (
	regChange    regKind = "change"    // on.create, on.update, on.delete, on.resume
	regField     regKind = "field"     // on.field: its options come after the field path
	regEvent     regKind = "event"     // on.event
	regDaemon    regKind = "daemon"    // daemon
	regTimer     regKind = "timer"     // timer
	regIndex     regKind = "index"     // index
	regHook      regKind = "hook"      // on.startup, on.cleanup: no resource
	regProbe     regKind = "probe"     // on.probe: no resource
	regAdmission regKind = "admission" // on.validate, on.mutate
)

// regKinds gives the kind of each registering function by its module path.
var regKinds = map[string]regKind{
	"on.create": regChange, "on.update": regChange, "on.delete": regChange, "on.resume": regChange,
	"on.field": regField, "on.event": regEvent, "daemon": regDaemon, "timer": regTimer, "index": regIndex,
	"on.startup": regHook, "on.cleanup": regHook, "on.probe": regProbe,
	"on.validate": regAdmission, "on.mutate": regAdmission,
}

// optionApplies tells for each option the registrations it has an effect on.
func optionApplies(opt, fn string) (bool, string) {
	kind := regKinds[fn]
	switch opt {
	case "id", "param":
		return true, ""
	case "timeout":
		return kind != regEvent && kind != regIndex && kind != regProbe,
			"change handlers, daemons, timers, admission handlers, on.startup and on.cleanup"
	case "operations", "side_effects", "failure_policy", "subresource":
		return kind == regAdmission, "admission handlers (on.validate, on.mutate)"
	case "retries", "backoff", "errors":
		return kind == regChange || kind == regField || kind == regDaemon || kind == regTimer || kind == regHook,
			"change handlers, daemons, timers, on.startup and on.cleanup"
	case "labels", "annotations", "field", "value", "when":
		return kind != regHook && kind != regProbe, "handlers of a resource"
	case "old", "new":
		return kind == regChange || kind == regField, "change handlers (on.create, on.update, on.delete, on.resume, on.field)"
	case "optional":
		return fn == "on.delete", "on.delete"
	case "deleted":
		return fn == "on.resume", "on.resume"
	case "interval", "sharp", "idle":
		return kind == regTimer, "timers"
	case "initial_delay":
		return kind == regTimer || kind == regDaemon, "timers and daemons"
	case "cancellation_timeout", "cancellation_backoff":
		return kind == regDaemon, "daemons"
	}
	return true, ""
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
func Analyze(scripts []Script) *Analysis {
	var o Options
	o.setDefaults()
	return analyze(context.Background(), scripts, o.HandlerTimeout)
}

// analyze is Analyze with each file's compilation under ctx and timeout (the load
// deadline of the operator).
func analyze(ctx context.Context, scripts []Script, timeout time.Duration) *Analysis {
	a := &Analysis{}
	chunks := map[string][]ast.Stmt{}
	for _, s := range scripts {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		_, chunk, err := compile(cctx, s)
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
	z := &analyzer{a: a, globals: SandboxGlobals(), defined: map[string]map[string]bool{}, ids: map[string]literalID{}, reported: map[string]bool{}}
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

func (z *analyzer) problem(line int, span [2]int, format string, args ...any) {
	if z.quiet {
		return
	}
	p := Problem{File: z.file, Line: line, Message: fmt.Sprintf(format, args...), span: span}
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
		for _, e := range st.Exprs {
			z.expr(e, sc)
		}
		// `local function f` is a local bound before its body: recursion sees it.
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
					z.problem(e.Line(), [2]int{}, "%s.%s is not available in luaop's sandbox (its %s has %s)", id.Value, k.Value, id.Value, strings.Join(fields, ", "))
					return
				}
			}
		}
		z.expr(e.Object, sc)
		z.expr(e.Key, sc)
	case *ast.FuncCallExpr:
		z.call(e, sc)
		z.expr(e.Func, sc)
		z.expr(e.Receiver, sc)
		for _, a := range e.Args {
			z.expr(a, sc)
		}
	case *ast.TableExpr:
		for _, f := range e.Fields {
			z.expr(f.Key, sc)
			z.expr(f.Value, sc)
		}
	case *ast.FunctionExpr:
		z.function(e, sc, false)
	case *ast.LogicalOpExpr:
		z.expr(e.Lhs, sc)
		z.expr(e.Rhs, sc)
	case *ast.RelationalOpExpr:
		z.expr(e.Lhs, sc)
		z.expr(e.Rhs, sc)
	case *ast.ArithmeticOpExpr:
		z.expr(e.Lhs, sc)
		z.expr(e.Rhs, sc)
	case *ast.StringConcatOpExpr:
		z.expr(e.Lhs, sc)
		z.expr(e.Rhs, sc)
	case *ast.UnaryMinusOpExpr:
		z.expr(e.Expr, sc)
	case *ast.UnaryNotOpExpr:
		z.expr(e.Expr, sc)
	case *ast.UnaryLenOpExpr:
		z.expr(e.Expr, sc)
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
			z.problem(id.Line(), [2]int{}, "%s is a global of %s, and each script has its own globals: share it through a module (return it from lib/name.lua, then local name = require(\"lib.name\"))", name, other)
			return
		}
	}
	hint := missingGlobals[name]
	if hint != "" {
		hint = "; " + hint
	}
	z.problem(id.Line(), [2]int{}, "%s is not available in luaop's sandbox (Lua 5.1 without io, debug, coroutine, dofile, loadfile, package, module)%s", name, hint)
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

// call checks registrations and records luaop.kube calls.
func (z *analyzer) call(c *ast.FuncCallExpr, sc *scope) {
	if c.Receiver != nil {
		return
	}
	path, ok := modulePath(c.Func, sc)
	if !ok {
		return
	}
	span := [2]int{c.Line(), max(c.LastLine(), c.Line())}
	if verb, isKube := strings.CutPrefix(path, "kube."); isKube {
		if z.quiet {
			return
		}
		kc := KubeCall{File: z.file, Line: c.Line(), Verb: verb}
		switch verb {
		case "get", "list", "patch", "delete":
			if len(c.Args) >= 2 {
				av, ok1 := z.str(c.Args[0], sc, 0)
				k, ok2 := z.str(c.Args[1], sc, 0)
				kc.APIVersion, kc.Kind, kc.Resolved = av, k, ok1 && ok2
			}
		case "create", "apply":
			if len(c.Args) >= 1 {
				if f := z.object(c.Args[0], sc, 0); f != nil {
					kc.APIVersion, kc.Kind = f["apiVersion"], f["kind"]
					kc.Resolved = kc.APIVersion != "" && kc.Kind != ""
				}
			}
		default:
			return
		}
		z.a.KubeCalls = append(z.a.KubeCalls, kc)
		return
	}
	kind, isReg := regKinds[path]
	if !isReg || z.quiet {
		return
	}
	reg := Registration{File: z.file, Line: c.Line(), Function: path}
	optArg := 2
	switch kind {
	case regField:
		optArg = 3
	case regHook, regProbe:
		optArg = 1
	}
	if kind != regHook && kind != regProbe && len(c.Args) > 0 {
		if res, ok := z.str(c.Args[0], sc, 0); ok {
			reg.Resource = res
			if _, err := parseResource(res); err != nil {
				z.problem(c.Args[0].Line(), span, "luaop.%s: %s", path, err.Error())
			}
		}
	}
	z.a.Registrations = append(z.a.Registrations, reg)
	if len(c.Args) <= optArg {
		return
	}
	opts, ok := c.Args[optArg].(*ast.TableExpr)
	if !ok {
		return
	}
	for _, f := range opts.Fields {
		k, ok := f.Key.(*ast.StringExpr)
		if !ok {
			continue
		}
		line := f.Value.Line()
		if !knownOptions[k.Value] {
			z.problem(line, span, "luaop.%s: unknown handler option %s", path, k.Value)
			continue
		}
		if applies, where := optionApplies(k.Value, path); !applies {
			z.problem(line, span, "luaop.%s: option %s does not apply here (only to %s); it would be ignored", path, k.Value, where)
		}
		if k.Value == "id" {
			if id, ok := f.Value.(*ast.StringExpr); ok {
				this := literalID{where: fmt.Sprintf("%s:%d", z.file, c.Line()), change: kind == regChange}
				if fn, ok := c.Args[optArg-1].(*ast.IdentExpr); ok && kind == regChange {
					this.fn = sc.lookup(fn.Value)
				}
				if prev, dup := z.ids[id.Value]; !dup {
					z.ids[id.Value] = this
				} else if !prev.change || !this.change || prev.fn == nil || prev.fn != this.fn {
					// The same local function for another cause under one id is one
					// handler (kopf's two decorators); the load checks the options.
					z.problem(line, span, "duplicate handler id %q (first registered at %s); give one of them another id = \"...\"", id.Value, prev.where)
				}
			}
		}
	}
}

// str evaluates a string constant: a literal, a local bound to one, a concatenation.
func (z *analyzer) str(e ast.Expr, sc *scope, depth int) (string, bool) {
	if depth > 8 {
		return "", false
	}
	switch e := e.(type) {
	case *ast.StringExpr:
		return e.Value, true
	case *ast.IdentExpr:
		if b := sc.lookup(e.Value); b != nil && b.init != nil {
			return z.str(b.init, b.scope, depth+1)
		}
	case *ast.StringConcatOpExpr:
		l, ok1 := z.str(e.Lhs, sc, depth+1)
		r, ok2 := z.str(e.Rhs, sc, depth+1)
		return l + r, ok1 && ok2
	}
	return "", false
}

// object evaluates the apiVersion and kind of an object expression: a table
// constructor, a local bound to one, luaop.adopt/label/append_owner_reference of
// one, or a call of a local function whose returns all evaluate the same way.
func (z *analyzer) object(e ast.Expr, sc *scope, depth int) map[string]string {
	if depth > 8 {
		return nil
	}
	switch e := e.(type) {
	case *ast.TableExpr:
		out := map[string]string{}
		for _, f := range e.Fields {
			if k, ok := f.Key.(*ast.StringExpr); ok && (k.Value == "apiVersion" || k.Value == "kind") {
				if v, ok := z.str(f.Value, sc, depth+1); ok {
					out[k.Value] = v
				}
			}
		}
		return out
	case *ast.IdentExpr:
		if b := sc.lookup(e.Value); b != nil && b.init != nil {
			return z.object(b.init, b.scope, depth+1)
		}
	case *ast.FuncCallExpr:
		if e.Receiver != nil {
			return nil
		}
		if path, ok := modulePath(e.Func, sc); ok {
			switch path {
			case "adopt", "label", "append_owner_reference", "remove_owner_reference":
				if len(e.Args) > 0 {
					return z.object(e.Args[0], sc, depth+1)
				}
			}
			return nil
		}
		id, ok := e.Func.(*ast.IdentExpr)
		if !ok {
			return nil
		}
		b := sc.lookup(id.Value)
		if b == nil || b.init == nil {
			return nil
		}
		fn, ok := b.init.(*ast.FunctionExpr)
		if !ok {
			return nil
		}
		return z.returns(fn, b.scope, depth+1)
	}
	return nil
}

// returns evaluates what a function returns: the objects of its return statements,
// when they all agree.
func (z *analyzer) returns(fn *ast.FunctionExpr, sc *scope, depth int) map[string]string {
	var result map[string]string
	agree := true
	quiet := z.quiet
	z.quiet = true
	defer func() { z.quiet = quiet }()
	var visit func(stmts []ast.Stmt, sc *scope)
	visit = func(stmts []ast.Stmt, sc *scope) {
		for _, st := range stmts {
			switch st := st.(type) {
			case *ast.ReturnStmt:
				if len(st.Exprs) == 0 {
					continue
				}
				o := z.object(st.Exprs[0], sc, depth)
				if o == nil {
					agree = false
				} else if result == nil {
					result = o
				} else if result["apiVersion"] != o["apiVersion"] || result["kind"] != o["kind"] {
					agree = false
				}
			case *ast.LocalAssignStmt:
				z.stmt(st, sc)
			case *ast.DoBlockStmt:
				visit(st.Stmts, sc.child())
			case *ast.IfStmt:
				visit(st.Then, sc.child())
				visit(st.Else, sc.child())
			case *ast.WhileStmt:
				visit(st.Stmts, sc.child())
			case *ast.RepeatStmt:
				visit(st.Stmts, sc.child())
			case *ast.NumberForStmt:
				visit(st.Stmts, sc.child())
			case *ast.GenericForStmt:
				visit(st.Stmts, sc.child())
			}
		}
	}
	inner := sc.child()
	if fn.ParList != nil {
		for _, n := range fn.ParList.Names {
			inner.names[n] = &binding{}
		}
	}
	visit(fn.Stmts, inner)
	if !agree {
		return nil
	}
	return result
}
