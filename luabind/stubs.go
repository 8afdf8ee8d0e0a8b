package luabind

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/luaop/luaop/luabind/internal/sandbox"
)

// luaop_meta.lua documents the `luaop` module for the Lua Language Server: every
// function of the module, the handler options and the fields of ctx. stubs_test.go
// fails when the module, ctxField or scriptapi's table gain a name it does not
// document, or the table a function it does not declare.
//
//go:embed luaop_meta.lua
var stubsSource string

// Stubs returns the Lua Language Server definitions file (---@meta luaop) of the
// `luaop` module. Saved as luaop.lua in a folder of the editor's
// Lua.workspace.library, it gives scripts that do `local luaop = require("luaop")`
// completion, hover documentation and type checks of handlers, options and ctx.
func Stubs() string { return stubsSource }

// sandboxOS declares the part of os the sandbox has, for a Lua Language Server whose
// os library is disabled (Luarc): os.getenv or os.execute are then flagged as
// undefined fields, as luaop check flags them.
const sandboxOS = `
-- The os of luaop's sandbox: only time, date and clock.
---@class luaop.sandbox.os
os = {}

---Seconds since the epoch, of now or of the date in t.
---@param t? table
---@return integer
function os.time(t) end

---The date of time (default now) formatted as format (strftime's; "*t" and "!*t" give a table).
---@param format? string
---@param time? integer
---@return string|table
function os.date(format, time) end

---CPU seconds used by the process.
---@return number
function os.clock() end
`

// StubsWithSandbox is Stubs with the declarations of the sandbox's partial
// libraries (os), for an editor configured by Luarc.
func StubsWithSandbox() string { return stubsSource + sandboxOS }

// Luarc is a .luarc.json for the Lua Language Server that makes it see the scripts
// as luaop runs them: Lua 5.1 (not LuaLS's default 5.4: `//`, `utf8`, integer
// division are flagged), the libraries the sandbox lacks disabled (io, debug,
// coroutine, package, the full os; os is declared by the stubs with its three
// functions), and library, the folder of the stubs (luaop stubs -o), as its
// workspace library. Lua 5.1 mode also flags goto, which gopher-lua accepts.
func Luarc(library string) string {
	lib := ""
	if library != "" {
		q, _ := json.Marshal(library)
		lib = fmt.Sprintf(",\n  \"workspace.library\": [%s]", q)
	}
	return `{
  "$schema": "https://raw.githubusercontent.com/LuaLS/vscode-lua/master/setting/schema.json",
  "runtime.version": "Lua 5.1",
  "runtime.builtin": {
    "basic": "enable",
    "string": "enable",
    "table": "enable",
    "math": "enable",
    "os": "disable",
    "io": "disable",
    "debug": "disable",
    "coroutine": "disable",
    "package": "disable",
    "utf8": "disable",
    "bit32": "disable",
    "bit": "disable",
    "jit": "disable",
    "ffi": "disable",
    "table.new": "disable",
    "table.clear": "disable",
    "string.buffer": "disable"
  },
  "diagnostics.globals": [],
  "workspace.checkThirdParty": false` + lib + `
}
`
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
