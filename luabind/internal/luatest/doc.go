// Package luatest holds the helpers the tests of luabind and of its internal packages
// share: compiling and calling Lua code on a state the test made, decoding JSON as
// client-go does, the JSON documents of testdata, and comparing values that made a
// trip through Lua. It holds no state; only tests import it.
package luatest
