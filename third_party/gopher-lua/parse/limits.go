package parse

// luaop patch (see ../README.md): nesting limits.
//
// gopher-lua's compiler (and every walk of the AST) recurses once per level of
// nesting, so a chunk nested a million levels deep (`return {{{...}}}`,
// `not not ... true`, `#...#x`) overflowed the Go stack: a fatal error no recover
// catches, in whatever program compiled it. Lua stops at LUAI_MAXCCALLS (200)
// levels with "chunk has too many syntax levels"; so does this parser, counting as
// Lua's recursive-descent parser does (checkLevels), after two cheaper guards that
// keep the parse itself small: the parser's own stack (maxParserStack entries, in
// parser.go) and the AST's depth.

import (
	"github.com/luaop/luaop/third_party/gopher-lua/ast"
)

const (
	// MaxSyntaxLevels is Lua 5.1's LUAI_MAXCCALLS: how deep blocks and expressions
	// may nest, counted as Lua counts them (checkLevels).
	MaxSyntaxLevels = 200
	// maxTreeDepth bounds the depth of the AST, where chains that Lua parses in a
	// loop (a + b + c, a.b.c, f()(), elseif) nest too: the compiler recurses that
	// deep (Lua itself has no such limit; its parser loops there).
	maxTreeDepth = 5000
	// maxParserStack bounds the LALR parser's stack (256 bytes an entry): a few
	// entries per level of nesting, so far above what MaxSyntaxLevels allows.
	maxParserStack = 8 * MaxSyntaxLevels * 4
	// TooManyLevels is Lua's message.
	TooManyLevels = "chunk has too many syntax levels"
)

// levelError is raised (panic) by the walk and returned by checkLevels.
type levelError struct{ err *Error }

// checkLevels walks the chunk as Lua's parser would descend into it: a block
// (chunk, function body, loop, branch) and an expression each take a level, while
// what Lua parses in a loop at the level it is on does not (the left operand of a
// binary operator, the object of an index or call, an elseif). A chunk deeper than
// MaxSyntaxLevels, or whose tree is deeper than maxTreeDepth, is an error at the
// line where it went too deep.
func checkLevels(source string, chunk []ast.Stmt) (err error) {
	defer func() {
		if r := recover(); r != nil {
			le, ok := r.(levelError)
			if !ok {
				panic(r)
			}
			err = le.err
		}
	}()
	w := &levelWalker{source: source}
	w.block(chunk, 1, 1)
	return nil
}

type levelWalker struct{ source string }

func (w *levelWalker) check(node ast.PositionHolder, level, depth int) {
	if level > MaxSyntaxLevels || depth > maxTreeDepth {
		pos := ast.Position{Source: w.source}
		if node != nil {
			pos.Line = node.Line()
		}
		panic(levelError{&Error{Pos: pos, Message: TooManyLevels}})
	}
}

// block walks statements at level (the block's own level) and tree depth.
func (w *levelWalker) block(stmts []ast.Stmt, level, depth int) {
	for _, st := range stmts {
		w.stmt(st, level, depth+1)
	}
}

func (w *levelWalker) exprs(list []ast.Expr, level, depth int) {
	for _, e := range list {
		w.expr(e, level, depth)
	}
}

func (w *levelWalker) stmt(st ast.Stmt, level, depth int) {
	w.check(st, level, depth)
	e := level + 1 // the statement's expressions
	switch s := st.(type) {
	case *ast.AssignStmt:
		w.exprs(s.Lhs, e, depth+1)
		w.exprs(s.Rhs, e, depth+1)
	case *ast.LocalAssignStmt:
		w.exprs(s.Exprs, e, depth+1)
	case *ast.FuncCallStmt:
		w.expr(s.Expr, e, depth+1)
	case *ast.DoBlockStmt:
		w.block(s.Stmts, level+1, depth+1)
	case *ast.WhileStmt:
		w.expr(s.Condition, e, depth+1)
		w.block(s.Stmts, level+1, depth+1)
	case *ast.RepeatStmt:
		w.block(s.Stmts, level+1, depth+1)
		w.expr(s.Condition, level+2, depth+1) // the condition is inside the block
	case *ast.IfStmt:
		w.expr(s.Condition, e, depth+1)
		w.block(s.Then, level+1, depth+1)
		if len(s.Else) == 1 {
			if elseif, ok := s.Else[0].(*ast.IfStmt); ok && elseif.LastLine() == 0 {
				// elseif (the parser sets no last line on those, unlike `else if`):
				// a loop in Lua's parser
				w.stmt(elseif, level, depth+1)
				return
			}
		}
		w.block(s.Else, level+1, depth+1)
	case *ast.NumberForStmt:
		w.expr(s.Init, e, depth+1)
		w.expr(s.Limit, e, depth+1)
		if s.Step != nil {
			w.expr(s.Step, e, depth+1)
		}
		w.block(s.Stmts, level+1, depth+1)
	case *ast.GenericForStmt:
		w.exprs(s.Exprs, e, depth+1)
		w.block(s.Stmts, level+1, depth+1)
	case *ast.FuncDefStmt:
		if s.Name != nil && s.Name.Func != nil {
			w.expr(s.Name.Func, e, depth+1)
		}
		if s.Name != nil && s.Name.Receiver != nil {
			w.expr(s.Name.Receiver, e, depth+1)
		}
		w.expr(s.Func, e, depth+1)
	case *ast.ReturnStmt:
		w.exprs(s.Exprs, e, depth+1)
	}
}

// expr walks an expression whose own level is level.
func (w *levelWalker) expr(ex ast.Expr, level, depth int) {
	if ex == nil {
		return
	}
	w.check(ex, level, depth)
	d := depth + 1
	switch x := ex.(type) {
	case *ast.AttrGetExpr:
		w.expr(x.Object, level, d) // a.b.c: a loop in Lua's parser
		w.expr(x.Key, level+1, d)
	case *ast.TableExpr:
		for _, f := range x.Fields {
			w.expr(f.Key, level+1, d)
			w.expr(f.Value, level+1, d)
		}
	case *ast.FuncCallExpr:
		w.expr(x.Func, level, d) // f()(): a loop too
		w.expr(x.Receiver, level, d)
		w.exprs(x.Args, level+1, d)
	case *ast.LogicalOpExpr:
		w.expr(x.Lhs, level, d) // a or b or c: a loop for left-associative operators
		w.expr(x.Rhs, level+1, d)
	case *ast.RelationalOpExpr:
		w.expr(x.Lhs, level, d)
		w.expr(x.Rhs, level+1, d)
	case *ast.StringConcatOpExpr:
		w.expr(x.Lhs, level, d) // right-associative: each right operand nests
		w.expr(x.Rhs, level+1, d)
	case *ast.ArithmeticOpExpr:
		w.expr(x.Lhs, level, d)
		w.expr(x.Rhs, level+1, d)
	case *ast.UnaryMinusOpExpr:
		w.expr(x.Expr, level+1, d)
	case *ast.UnaryNotOpExpr:
		w.expr(x.Expr, level+1, d)
	case *ast.UnaryLenOpExpr:
		w.expr(x.Expr, level+1, d)
	case *ast.FunctionExpr:
		w.block(x.Stmts, level+1, d)
	}
}
