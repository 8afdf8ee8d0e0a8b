// Package scripttest runs test cases of luaop handlers without a cluster (luaop
// test): each case gives an object (and optionally its old version), the handler id
// or the cause to run, objects for an in-memory fake of the API, and the expected
// outcome: the patch, the resulting object, status, the error, the Events posted and
// the luaop.kube calls made. The format is documented in README.md ("Test your
// handlers").
//
// It owns the case format, the fake API (fake.go) and the comparison of outcomes. It
// is the core's rules on a fake API, not a second implementation: the cause each
// handler is given, where its result goes and how subhandlers see their parent's
// cause come from handling (the same code the processing core runs), and the Lua
// runtime is luabind's own. It must not decide any of these again; processing's
// TestLuaopTestRunsTheCoresRules holds it to that. It never talks to a cluster.
package scripttest
