package luabind

import lua "github.com/luaop/luaop/third_party/gopher-lua"

// LuaVMVersion names the Lua VM scripts run on, for `luaop version`: the gopher-lua
// release luaop's patched copy (third_party/gopher-lua) was taken from.
const LuaVMVersion = lua.UpstreamVersion + " (patched: third_party/gopher-lua)"
