// Package adversary holds the adversarial scripts of issue 34: scripts of a few
// lines that, before luaop's budgets, killed the operator (Go stack overflow,
// out of memory) or held a Lua state far past its deadline. The tests of luabind
// (in-process) and of cmd/luaop (a real `luaop test`, `luaop check`, `luaop run`
// process whose peak RSS is measured) run every case: each must fail within a second
// of its deadline, or at once at a limit, with file:line and a clear reason, while
// other objects keep being handled.
//
// It owns the cases only (Lua source, the handler id, the error wanted): it is
// data for the suites of luabind, scriptcheck and cmd/luaop, and must import nothing
// of luaop's, so that every suite can run the same attacks without depending on
// another's package.
package adversary
