// Package luavalue converts values between Go (Kubernetes JSON as client-go decodes
// it) and Lua: eager deep copies both ways (ToLua, FromLua), lazy read-only proxies of
// objects (NewProxy: a handler that reads two fields converts two fields), and the JSON
// markers scripts use (luaop.null, luaop.array, luaop.object: InstallMarkers).
// Conversion and proxies share one room because each needs the other: FromLua copies
// the Go value behind a proxy, and a proxy converts its children with ToLua.
//
// Its per-state objects (the marker metatables, the null sentinel, the proxies' shared
// metamethods) live in the LState's registry, made on first use; like every Lua value,
// they belong to whoever holds the state (in luabind, the shard's lock).
package luavalue
