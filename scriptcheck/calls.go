package scriptcheck

import (
	"fmt"
	"strings"

	"github.com/luaop/luaop/third_party/gopher-lua/ast"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/scriptapi"
)

// optionApplies tells whether an option has an effect on the registrations of fn
// and, when it has not, which ones it has an effect on; known is false for an option
// this table does not know (a test holds it to scriptapi.HandlerOptions).
func optionApplies(opt string, fn scriptapi.Function) (applies bool, where string, known bool) {
	kind := fn.Registers
	switch opt {
	case "id", "param":
		return true, "", true
	case "timeout":
		return kind != scriptapi.Event && kind != scriptapi.Index && kind != scriptapi.Probe,
			"change handlers, daemons, timers, admission handlers, on.startup and on.cleanup", true
	case "operations", "side_effects", "failure_policy", "subresource":
		return kind == scriptapi.Admission, "admission handlers (on.validate, on.mutate)", true
	case "retries", "backoff", "errors":
		return kind == scriptapi.Change || kind == scriptapi.Field || kind == scriptapi.Daemon || kind == scriptapi.Timer || kind == scriptapi.Hook,
			"change handlers, daemons, timers, on.startup and on.cleanup", true
	case "labels", "annotations", "field", "value", "when":
		return kind != scriptapi.Hook && kind != scriptapi.Probe, "handlers of a resource", true
	case "old", "new":
		return kind == scriptapi.Change || kind == scriptapi.Field, "change handlers (on.create, on.update, on.delete, on.resume, on.field)", true
	case "optional":
		return fn.Name == "on.delete", "on.delete", true
	case "deleted":
		return fn.Name == "on.resume", "on.resume", true
	case "interval", "sharp", "idle":
		return kind == scriptapi.Timer, "timers", true
	case "initial_delay":
		return kind == scriptapi.Timer || kind == scriptapi.Daemon, "timers and daemons", true
	case "cancellation_timeout", "cancellation_backoff":
		return kind == scriptapi.Daemon, "daemons", true
	}
	return true, "", false
}

// call checks registrations and records luaop.kube calls: the functions of the
// module are those of scriptapi.
func (z *analyzer) call(c *ast.FuncCallExpr, sc *scope) {
	if c.Receiver != nil || z.quiet {
		return
	}
	path, ok := modulePath(c.Func, sc)
	if !ok {
		return
	}
	fn, ok := scriptapi.Lookup(path)
	switch {
	case !ok:
	case fn.Access.Target == scriptapi.ByKind || fn.Access.Target == scriptapi.ByObject:
		z.kubeCall(c, sc, fn)
	case fn.Registers != "":
		z.registration(c, sc, fn)
	}
}

// kubeCall records a call of a function that names its object by kind or by
// value, with the apiVersion and kind when they evaluate.
func (z *analyzer) kubeCall(c *ast.FuncCallExpr, sc *scope, fn scriptapi.Function) {
	verb := strings.TrimPrefix(fn.Name, "kube.")
	kc := KubeCall{File: z.file, Line: c.Line(), Verb: verb}
	switch fn.Access.Target {
	case scriptapi.ByKind:
		if len(c.Args) >= 2 {
			av, ok1 := z.str(c.Args[0], sc, 0)
			k, ok2 := z.str(c.Args[1], sc, 0)
			kc.APIVersion, kc.Kind, kc.Resolved = av, k, ok1 && ok2
		}
	case scriptapi.ByObject:
		if len(c.Args) >= 1 {
			if f := z.object(c.Args[0], sc, 0); f != nil {
				kc.APIVersion, kc.Kind = f["apiVersion"], f["kind"]
				kc.Resolved = kc.APIVersion != "" && kc.Kind != ""
			}
		}
	}
	z.a.KubeCalls = append(z.a.KubeCalls, kc)
}

// registration checks a handler registration: its resource string, its options
// (known, applying to its kind) and its literal id (not a duplicate).
func (z *analyzer) registration(c *ast.FuncCallExpr, sc *scope, fn scriptapi.Function) {
	path := fn.Name
	span := [2]int{c.Line(), max(c.LastLine(), c.Line())}
	reg := Registration{File: z.file, Line: c.Line(), Function: path}
	if resArg := fn.Param("resource"); resArg >= 0 && len(c.Args) > resArg {
		if res, ok := z.str(c.Args[resArg], sc, 0); ok {
			reg.Resource = res
			if _, err := luabind.ParseResource(res); err != nil {
				z.problem(RuleResource, c.Args[resArg].Line(), span, "luaop.%s: %s", path, err.Error())
			}
		}
	}
	z.a.Registrations = append(z.a.Registrations, reg)
	optArg := fn.Param("opts")
	if optArg < 0 || len(c.Args) <= optArg {
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
		if !scriptapi.IsHandlerOption(k.Value) {
			z.problem(RuleUnknownOption, line, span, "luaop.%s: unknown handler option %s", path, k.Value)
			continue
		}
		if applies, where, _ := optionApplies(k.Value, fn); !applies {
			z.problem(RuleIgnoredOption, line, span, "luaop.%s: option %s does not apply here (only to %s); it would be ignored", path, k.Value, where)
		}
		if k.Value == "id" {
			if id, ok := f.Value.(*ast.StringExpr); ok {
				z.handlerID(id.Value, line, span, c, sc, fn)
			}
		}
	}
}

// handlerID records a literal handler id and reports a duplicate.
func (z *analyzer) handlerID(id string, line int, span [2]int, c *ast.FuncCallExpr, sc *scope, fn scriptapi.Function) {
	change := fn.Registers == scriptapi.Change
	this := literalID{where: fmt.Sprintf("%s:%d", z.file, c.Line()), change: change}
	if fnArg := fn.Param("fn"); change && fnArg >= 0 && fnArg < len(c.Args) {
		if local, ok := c.Args[fnArg].(*ast.IdentExpr); ok {
			this.fn = sc.lookup(local.Value)
		}
	}
	if prev, dup := z.ids[id]; !dup {
		z.ids[id] = this
	} else if !prev.change || !this.change || prev.fn == nil || prev.fn != this.fn {
		// The same local function for another cause under one id is one
		// handler (kopf's two decorators); the load checks the options.
		z.problem(RuleDuplicateID, line, span, "duplicate handler id %q (first registered at %s); give one of them another id = \"...\"", id, prev.where)
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
			if fn, ok := scriptapi.Lookup(path); ok && fn.ReturnsObject && len(e.Args) > 0 {
				return z.object(e.Args[0], sc, depth+1)
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
