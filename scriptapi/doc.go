// Package scriptapi is the table of the `luaop` module's functions: for each one its
// name, its parameters as the stubs declare them, what it registers (a handler
// kind), the cluster access it needs (the RBAC verbs and how it names the resource),
// and whether it returns the object it is given. It also lists the handler options.
//
// Four parts read it, so that a function added to one is not forgotten by another:
//   - luabind (the runtime) installs luaop.kube, json, yaml and the event helpers
//     from it, and makes no state when those implementations and the table
//     disagree; its tests walk the module of a real state against the table (every
//     installed function listed, every listed one installed) and the stubs
//     (luaop_meta.lua) against it (the same functions, the same parameters);
//   - scriptcheck (luaop check's analyser) finds registrations, their option
//     arguments, luaop.kube calls and the object helpers by it;
//   - cmd/luaop's `luaop rbac` grants each luaop.kube call the verbs listed here.
//
// It owns data only: it imports nothing of luaop's and no Lua library, and must not
// (the runtime, the analyser and the RBAC generator all depend on it).
package scriptapi
