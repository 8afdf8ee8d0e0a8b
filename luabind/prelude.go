package luabind

import (
	_ "embed"

	lua "github.com/luaop/luaop/third_party/gopher-lua"

	"github.com/luaop/luaop/luabind/internal/luavalue"
)

// prelude.lua defines the object helpers (owner references, adopt, label) in Lua:
// they only shuffle tables, which is clearer there than through the Go API.
//
//go:embed prelude.lua
var preludeSource string

func (s *shard) runPrelude(mod *lua.LTable) {
	L := s.L
	fn, err := L.LoadString(preludeSource)
	if err != nil {
		panic("luabind: the embedded prelude does not compile: " + err.Error())
	}
	current := L.NewFunction(func(L *lua.LState) int {
		cs := s.callOf(L)
		if cs == nil {
			return 0
		}
		body := cs.body()
		if body == nil {
			return 0
		}
		L.Push(luavalue.NewProxy(L, body))
		return 1
	})
	L.Push(fn)
	L.Push(mod)
	L.Push(current)
	if err := L.PCall(2, 0, nil); err != nil {
		panic("luabind: the embedded prelude fails: " + err.Error())
	}
}
