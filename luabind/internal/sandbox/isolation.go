package sandbox

import (
	"fmt"
	"sort"
	"strings"

	lua "github.com/luaop/luaop/third_party/gopher-lua"
)

// Isolation between scripts.
//
// Every file of the scripts folder (handler files and modules alike) runs in a global
// environment of its own, made at each load: a table whose metatable (envMT, shared,
// protected) reads through to the shard's base globals. So `x = 1`, `rawset(_G, "x",
// 1)` or `_G.print = nil` in one file change that file's globals only; files share
// values through modules (require returns one value per load to every file). One
// difference from Lua's own globals: setting a base global to nil (print = nil) in a
// script's environment reads through to the base again.
//
// What every script reaches is read-only or its own:
//   - the libraries (string, table, math, os) and the luaop module, with their
//     sub-tables, are read-only views: userdata whose metatable (protected) reads the
//     library's functions, refuses writes with an error naming the field, and lists
//     the fields to pairs(). Being userdata, no raw write (rawset, table.insert,
//     luaop.array) can reach them. Their functions are the real ones.
//   - getmetatable("") is a read-only view of {__index = string}; the string
//     metatable itself is protected (setmetatable cannot replace it).
//   - the metatables the binding shares (ctx, ctx.patch, ctx.logger, proxies, markers,
//     luaop.null, raised errors, the JSON markers) are protected by __metatable.
//   - setmetatable accepts tables only (Lua 5.1; gopher-lua's also set the metatable
//     shared by all strings, numbers, functions or booleans of the state), and may
//     replace a JSON marker metatable (luaop.array's) though it is protected.
//   - getfenv never returns the state's own globals (where the real libraries live):
//     for a Go function, a luaop helper or level 0 it returns the calling script's
//     environment; setfenv refuses those functions and level 0; load and loadstring
//     compile into the calling script's environment (gopher-lua's use the state's).
//   - package and module (Lua 5.1's module system, which writes into the state's
//     globals and package.loaded) are not there: require is the scripts folder's.
//
// The state's real globals (L.G.Global) keep the real libraries; only Go code and the
// prelude's helpers (luaop.adopt, ...) run with them.

// roView is the Go value of a read-only view: its name ("string", "luaop.kube") for
// messages and the table its reads go to.
type roView struct {
	name   string
	fields *lua.LTable
}

// Isolation holds what a state needs to give each script its own globals.
type Isolation struct {
	// base holds the globals every script reads: the sandbox's functions, the
	// libraries as read-only views, and the safe getfenv, setfenv, load,
	// loadstring and setmetatable. No script reaches base itself.
	base *lua.LTable
	// envMT is the metatable of every script environment: __index = base,
	// protected (getmetatable(_G) is false).
	envMT *lua.LTable
	// module is the read-only view of the luaop module (require("luaop")).
	module *lua.LUserData
	// replaceable are the metatables setmetatable may replace though they are
	// protected: the JSON markers (a list from luaop.kube.list made an object of a
	// script's class).
	replaceable map[*lua.LTable]bool
}

// maxViewDepth bounds the nesting of read-only views (the luaop module has two levels).
const maxViewDepth = 4

// NewIsolation builds the base globals of a state whose libraries are open
// (NewState) and the read-only view of module (may be nil). setmetatable may replace
// the replaceable metatables on a table though they are protected (luabind passes the
// JSON markers).
func NewIsolation(L *lua.LState, module *lua.LTable, replaceable ...*lua.LTable) *Isolation {
	iso := &Isolation{replaceable: make(map[*lua.LTable]bool, len(replaceable))}
	for _, mt := range replaceable {
		iso.replaceable[mt] = true
	}
	g := L.G.Global

	strView := lua.LValue(lua.LNil)
	if str, ok := g.RawGetString("string").(*lua.LTable); ok {
		strView = iso.view(L, "string", str, 0)
	}
	if smt, ok := L.GetMetatable(lua.LString("")).(*lua.LTable); ok {
		mtView := L.CreateTable(0, 1)
		mtView.RawSetString("__index", strView)
		smt.RawSetString("__metatable", iso.view(L, `getmetatable("")`, mtView, 0))
	}

	iso.base = L.CreateTable(0, 48)
	g.ForEach(func(k, v lua.LValue) {
		name, ok := k.(lua.LString)
		if !ok {
			return
		}
		switch name {
		case "_G", "package", "module", "require":
			return
		case "string":
			v = strView
		default:
			if t, ok := v.(*lua.LTable); ok {
				v = iso.view(L, string(name), t, 0)
			}
		}
		iso.base.RawSet(k, v)
	})
	iso.base.RawSetString("getfenv", L.NewFunction(iso.getfenv))
	iso.base.RawSetString("setfenv", L.NewFunction(iso.setfenv))
	iso.base.RawSetString("loadstring", L.NewFunction(iso.loadstring))
	iso.base.RawSetString("load", L.NewFunction(iso.load))
	iso.base.RawSetString("setmetatable", L.NewFunction(iso.setmetatable))

	iso.envMT = L.CreateTable(0, 2)
	iso.envMT.RawSetString("__index", iso.base)
	iso.envMT.RawSetString("__metatable", lua.LFalse)
	if module != nil {
		iso.module = iso.view(L, "luaop", module, 0)
	}
	return iso
}

// NewEnv makes the global environment of one script: its _G, require, and reads
// through to base.
func (iso *Isolation) NewEnv(L *lua.LState, require lua.LValue) *lua.LTable {
	env := L.CreateTable(0, 4)
	env.Metatable = iso.envMT
	env.RawSetString("_G", env)
	if require != nil {
		env.RawSetString("require", require)
	}
	return env
}

// View returns a read-only view of t named name (e.g. "ctx.logger"): a userdata whose
// protected metatable reads t's fields, refuses writes with an error naming the field
// and lists the fields to pairs(). Sub-tables become views too.
func (iso *Isolation) View(L *lua.LState, name string, t *lua.LTable) *lua.LUserData {
	return iso.view(L, name, t, 0)
}

// Module returns the read-only view of the module NewIsolation was given (nil when
// none).
func (iso *Isolation) Module() *lua.LUserData { return iso.module }

// Base is the table of base globals every script environment reads through to:
// shared by the scripts, nobody's own (luabind measures what scripts hold without it).
func (iso *Isolation) Base() *lua.LTable { return iso.base }

// Globals lists the base globals a script reads, each with the sorted fields of its
// read-only view when it is a library table (string, table, math, os) and nil when it
// is not.
func (iso *Isolation) Globals() map[string][]string {
	out := map[string][]string{}
	iso.base.ForEach(func(k, v lua.LValue) {
		name, ok := k.(lua.LString)
		if !ok {
			return
		}
		var fields []string
		if ud, ok := v.(*lua.LUserData); ok {
			if view, ok := ud.Value.(*roView); ok {
				view.fields.ForEach(func(fk, _ lua.LValue) {
					if s, ok := fk.(lua.LString); ok {
						fields = append(fields, string(s))
					}
				})
				sort.Strings(fields)
				if fields == nil {
					fields = []string{}
				}
			}
		}
		out[string(name)] = fields
	})
	return out
}

// view returns a read-only view of t named name. Sub-tables become views too.
func (iso *Isolation) view(L *lua.LState, name string, t *lua.LTable, depth int) *lua.LUserData {
	fields := L.CreateTable(0, 16)
	t.ForEach(func(k, v lua.LValue) {
		if sub, ok := v.(*lua.LTable); ok {
			if depth >= maxViewDepth {
				return
			}
			v = iso.view(L, name+"."+k.String(), sub, depth+1)
		}
		fields.RawSet(k, v)
	})
	ud := &lua.LUserData{Value: &roView{name: name, fields: fields}}
	mt := L.CreateTable(0, 6)
	mt.RawSetString("__index", fields)
	mt.RawSetString("__newindex", L.NewFunction(func(L *lua.LState) int {
		L.RaiseError("cannot set %s.%s: %s is shared by every script and read-only (keep your own in a local: local f = %s.%s)",
			name, L.Get(2).String(), name, name, L.Get(2).String())
		return 0
	}))
	next := L.NewFunction(func(L *lua.LState) int {
		k, v := fields.Next(L.Get(2))
		if k == lua.LNil {
			return 0
		}
		L.Push(k)
		L.Push(v)
		return 2
	})
	mt.RawSetString("__pairs", L.NewFunction(func(L *lua.LState) int {
		L.Push(next)
		L.Push(L.Get(1))
		L.Push(lua.LNil)
		return 3
	}))
	mt.RawSetString("__tostring", L.NewFunction(func(L *lua.LState) int {
		L.Push(lua.LString(name + " (read-only)"))
		return 1
	}))
	mt.RawSetString("__metatable", lua.LFalse)
	ud.Metatable = mt
	return ud
}

// fenvTarget is the function getfenv or setfenv is about: a function argument, or
// the function running at the given level (1, the default, is the caller). Level 0
// gives nil.
func fenvTarget(L *lua.LState, what string) *lua.LFunction {
	var level int
	switch v := L.Get(1).(type) {
	case *lua.LFunction:
		return v
	case *lua.LNilType:
		level = 1
	case lua.LNumber:
		level = int(v)
	default:
		L.ArgError(1, what+": a function or a level expected, got "+v.Type().String())
	}
	if level < 0 {
		L.ArgError(1, what+": level must be non-negative")
	}
	if level == 0 {
		return nil
	}
	dbg, ok := L.GetStack(level)
	if !ok {
		L.ArgError(1, what+": invalid level")
	}
	fn, err := L.GetInfo("f", dbg, lua.LNil)
	if err != nil {
		L.ArgError(1, what+": "+err.Error())
	}
	f, _ := fn.(*lua.LFunction)
	return f
}

// scriptFunction tells whether fn is a function of a script (neither Go nor one of
// the prelude's helpers, which run with the state's own globals).
func scriptFunction(L *lua.LState, fn *lua.LFunction) bool {
	return fn != nil && !fn.IsG && fn.Env != L.G.Global
}

// callerEnv is the environment of the nearest script function on the call stack
// (nil when there is none: Go code called directly).
func (iso *Isolation) callerEnv(L *lua.LState) *lua.LTable {
	for level := 1; ; level++ {
		dbg, ok := L.GetStack(level)
		if !ok {
			return nil
		}
		v, err := L.GetInfo("f", dbg, lua.LNil)
		if err != nil {
			return nil
		}
		if fn, ok := v.(*lua.LFunction); ok && scriptFunction(L, fn) {
			return fn.Env
		}
	}
}

func (iso *Isolation) getfenv(L *lua.LState) int {
	fn := fenvTarget(L, "getfenv")
	if scriptFunction(L, fn) {
		L.Push(fn.Env)
		return 1
	}
	if env := iso.callerEnv(L); env != nil {
		L.Push(env)
		return 1
	}
	L.Push(lua.LNil)
	return 1
}

func (iso *Isolation) setfenv(L *lua.LState) int {
	fn := fenvTarget(L, "setfenv")
	env := L.CheckTable(2)
	if !scriptFunction(L, fn) {
		L.RaiseError("setfenv: only the environment of a script's own functions can change (not of level 0, Go functions or luaop's helpers)")
	}
	fn.Env = env
	L.Push(fn)
	return 1
}

// loadstring and load are the base library's, compiling into the calling script's
// environment.
func (iso *Isolation) loadstring(L *lua.LState) int {
	return iso.loaded(L, L.CheckString(1), L.OptString(2, "<string>"))
}

// load reads the chunk from its reader function, at most as many bytes as a
// string may hold (lua.Options.MaxStringSize): a reader returning 16 MiB pieces
// for ever is refused (nil and the reason, as Lua's load reports a failure) at
// once, not once the operator's memory is gone.
func (iso *Isolation) load(L *lua.LState) int {
	reader := L.CheckFunction(1)
	name := L.OptString(2, "=(load)")
	limit := L.Options.MaxStringSize
	if limit <= 0 {
		limit = defaultMaxString
	}
	var b strings.Builder
	for {
		L.Push(reader)
		L.Call(0, 1)
		v := L.Get(-1)
		L.Pop(1)
		if v == lua.LNil {
			break
		}
		if !lua.LVCanConvToString(v) {
			L.Push(lua.LNil)
			L.Push(lua.LString("reader function must return a string"))
			return 2
		}
		s := lua.LVAsString(v)
		if s == "" {
			break
		}
		if b.Len()+len(s) > limit {
			L.Push(lua.LNil)
			L.Push(lua.LString(fmt.Sprintf("load: chunk too large (more than %d bytes)", limit)))
			return 2
		}
		b.WriteString(s)
	}
	return iso.loaded(L, b.String(), name)
}

func (iso *Isolation) loaded(L *lua.LState, src, name string) int {
	fn, err := L.Load(strings.NewReader(src), name)
	if err != nil {
		L.Push(lua.LNil)
		L.Push(lua.LString(err.Error()))
		return 2
	}
	env := iso.callerEnv(L)
	if env == nil {
		env = iso.NewEnv(L, nil)
	}
	fn.Env = env
	L.Push(fn)
	return 1
}

// setmetatable is Lua 5.1's: tables only, protected metatables stay (the JSON markers
// aside).
func (iso *Isolation) setmetatable(L *lua.LState) int {
	t := L.CheckTable(1)
	mt := L.Get(2)
	if mt != lua.LNil && mt.Type() != lua.LTTable {
		L.ArgError(2, "nil or table expected")
	}
	if cur, ok := t.Metatable.(*lua.LTable); ok && !iso.replaceable[cur] && cur.RawGetString("__metatable") != lua.LNil {
		L.RaiseError("cannot change a protected metatable")
	}
	t.Metatable = mt
	L.SetTop(1)
	return 1
}
