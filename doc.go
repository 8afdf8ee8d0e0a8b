// Package luaop is the module's root. It holds no code: its test (layout_test.go)
// keeps the rules of the layout that no compiler checks. Every package has a doc.go
// whose package comment says what the package owns and what it must not call, and
// no function outside tests, bench/ and third_party/ (gopher-lua as published, plus
// luaop's patches) is longer than 100 lines: a longer one is split into named steps.
//
// It imports nothing and nothing may import it.
package luaop
