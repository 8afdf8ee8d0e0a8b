package luabind

import (
	_ "embed"
	"encoding/json"
	"fmt"
)

// luaop_meta.lua documents the `luaop` module for the Lua Language Server: every
// function of the module, the handler options and the fields of ctx. stubs_test.go
// fails when the module, ctxField or knownOptions gain a name it does not document.
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
