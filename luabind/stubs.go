package luabind

import _ "embed"

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
