package luavalue

import lua "github.com/luaop/luaop/third_party/gopher-lua"

// iterationKey marks, in a state's registry, that InstallIteration ran.
const iterationKey = "luaop.luavalue.iteration"

// InstallIteration replaces the global pairs and ipairs with versions that honour a
// __pairs / __ipairs metamethod (Lua 5.2 style: called with the value, its first three
// results are returned) and otherwise behave exactly like the originals: they return
// the original iterator function (the same Go function the base library uses), the
// table and the initial key, and fail the same way on non-tables. Installing twice is a
// no-op.
//
// sandbox.NewState installs them (they are here for the proxies, which need them);
// other callers are tests of bare states.
func InstallIteration(L *lua.LState) {
	if L.G.Registry.RawGetString(iterationKey) != lua.LNil {
		return
	}
	L.G.Registry.RawSetString(iterationKey, lua.LTrue)
	pairsAux := originalIterator(L, "pairs")
	if pairsAux == nil {
		pairsAux = L.NewFunction(nextAux)
	}
	ipairsAux := originalIterator(L, "ipairs")
	if ipairsAux == nil {
		ipairsAux = L.NewFunction(indexAux)
	}
	L.SetGlobal("pairs", iterator(L, "__pairs", pairsAux, lua.LNil))
	L.SetGlobal("ipairs", iterator(L, "__ipairs", ipairsAux, lua.LNumber(0)))
}

// iterator builds pairs or ipairs: the metamethod's three results when the value has
// it, else (aux, table, initial) as the base library returns.
func iterator(L *lua.LState, metamethod string, aux *lua.LFunction, initial lua.LValue) *lua.LFunction {
	return L.NewClosure(func(L *lua.LState) int {
		v := L.Get(1)
		if mm := L.GetMetaField(v, metamethod); mm != lua.LNil {
			L.Push(mm)
			L.Push(v)
			L.Call(1, 3)
			return 3
		}
		tb := L.CheckTable(1)
		L.Push(L.Get(lua.UpvalueIndex(1)))
		L.Push(tb)
		L.Push(initial)
		return 3
	}, aux)
}

// originalIterator returns the iterator function the base library's pairs or ipairs
// returns, by calling it once on an empty table.
func originalIterator(L *lua.LState, name string) *lua.LFunction {
	fn, ok := L.GetGlobal(name).(*lua.LFunction)
	if !ok {
		return nil
	}
	if err := L.CallByParam(lua.P{Fn: fn, NRet: 1, Protect: true}, L.NewTable()); err != nil {
		return nil
	}
	aux, _ := L.Get(-1).(*lua.LFunction)
	L.Pop(1)
	return aux
}

// nextAux and indexAux stand in for the base library's iterators when the base
// library was not opened.
func nextAux(L *lua.LState) int {
	tb := L.CheckTable(1)
	k, v := tb.Next(L.Get(2))
	if k == lua.LNil {
		return 0
	}
	L.Push(k)
	L.Push(v)
	return 2
}

func indexAux(L *lua.LState) int {
	tb := L.CheckTable(1)
	i := L.CheckInt(2) + 1
	v := tb.RawGetInt(i)
	if v == lua.LNil {
		return 0
	}
	L.Push(lua.LNumber(i))
	L.Push(v)
	return 2
}
