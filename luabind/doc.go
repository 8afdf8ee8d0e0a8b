// Package luabind runs the operator's Lua scripts: it loads them, collects the
// handlers they register through the `luaop` module, and calls those handlers with a
// kopf-like context (body, spec, meta, status, patch, logger, memo, ...).
//
// # Ownership of Lua states
//
// A gopher-lua LState is not safe for concurrent use, and Lua values cannot move
// between states. The Runtime therefore keeps a fixed set of shards (by default one
// per CPU); each shard owns one LState behind a mutex, and every object is pinned to
// one shard by a hash of its UID. So:
//   - many objects run in parallel, one per shard at a time, on every core;
//   - an object's memo is an ordinary Lua table living in its shard's state, kept
//     across calls and across reloads, and never copied;
//   - a handler call never waits for a state to be created (about 180 us each).
//
// Scripts are compiled once per load (a FunctionProto is read-only and shared) and run
// in every shard, each shard getting its own closures. A load is atomic: all files
// must compile, run and register without error in every shard, or nothing changes.
//
// # Data
//
// Objects go to Lua as lazy read-only proxies: a handler that reads two fields of a
// large object converts two fields. Values coming back (the patch, the result) are
// converted by one function, fromLua, which keeps integers integral, empty objects
// objects, and marked empty lists lists; luaop.null writes JSON null.
package luabind
