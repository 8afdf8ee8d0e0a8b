package luavalue

import (
	"sort"
	"strings"

	lua "github.com/luaop/luaop/third_party/gopher-lua"
)

// Lazy read-only views of Go JSON values.
//
// A proxy is an empty Lua table (type() says "table"). Reading a field converts that
// one child on first access and caches it in the proxy's proxyData (a Go-side cache, so
// the proxy table itself stays empty); children that are objects or lists become
// proxies too. A handler that reads two fields of a large object converts two fields.
//
// All proxies of one tree (one NewProxy call and the children reached from it) share
// two metatables (objects, lists) holding the tree; the tree maps each proxy table to
// its proxyData. gopher-lua tables are costly to fill (every string key allocates), so
// a child proxy costs two small allocations and a map entry instead of a metatable of
// its own. The tree lives exactly as long as any of its proxies: the map only holds
// tables that the parents' caches hold anyway.
//
// What works on a proxy:
//   - p.field, p[i], nested access, with JSON null read as luaop.null;
//   - #p for lists (gopher-lua's # operator honours __len for tables);
//   - pairs(p) and ipairs(p), once InstallIteration has replaced the global pairs and
//     ipairs (gopher-lua follows Lua 5.1, whose pairs/ipairs ignore __pairs/__ipairs).
//     Objects iterate in sorted key order; lists in index order;
//   - tostring(p) renders the value as JSON;
//   - FromLua(p) (and any proxy nested in a table given to FromLua) gives a deep copy of
//     the Go value behind it.
//
// What does not: writes raise "<path> is read-only: write to ctx.patch instead";
// next(p), rawget, rawlen-like table.getn, unpack, table.concat, table.sort, table.insert
// and other raw accessors see an empty table (they bypass metamethods in Lua 5.1);
// rawset(p, k, v) and table.insert(p, v) bypass the read-only guard: they write into
// the (otherwise empty) proxy table, never into the Go value; such a raw entry then
// shadows the field of the same key when read, and fromLua ignores it. luaop.array(p)
// and luaop.object(p) return a plain, writable copy.
//
// getmetatable(p) returns false (the metatable is protected), so it cannot be removed.

// proxyTree is shared by the proxies of one tree.
type proxyTree struct {
	pds    map[*lua.LTable]*proxyData
	objMT  *lua.LTable // metatable of the tree's object proxies, made on first use
	listMT *lua.LTable // metatable of the tree's list proxies, made on first use
	self   *lua.LUserData
	root   string // name of the root in messages ("" or e.g. "body")
}

// treeKey is the metatable field holding the tree (a userdata). getmetatable is
// protected, so scripts cannot reach it.
const treeKey = "__luaop_tree"

// proxyData is the Go side of one proxy.
type proxyData struct {
	tree *proxyTree
	v    any            // map[string]any or []any, never modified
	obj  map[string]any // v when it is an object (never nil then)
	list []any          // v when it is a list

	cache  map[string]lua.LValue // converted children of an object
	lcache []lua.LValue          // converted children of a list (nil: not yet)
	keys   []string              // sorted keys of an object, built by the first pairs

	// The path, built only for messages.
	parent *proxyData
	step   pathStep
}

func (pd *proxyData) isList() bool { return pd.obj == nil }

// path renders the proxy's path, with root as its first element when set.
func (pd *proxyData) path(extra *pathStep) string {
	var steps []pathStep
	for p := pd; p.parent != nil; p = p.parent {
		steps = append(steps, p.step)
	}
	var b strings.Builder
	b.WriteString(pd.tree.root)
	for i := len(steps) - 1; i >= 0; i-- {
		appendStep(&b, steps[i])
	}
	if extra != nil {
		appendStep(&b, *extra)
	}
	return b.String()
}

func (pd *proxyData) sortedKeys() []string {
	if pd.keys == nil {
		keys := make([]string, 0, len(pd.obj))
		for k := range pd.obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		pd.keys = keys
	}
	return pd.keys
}

// NewProxy returns a lazy read-only view of v when v is a map[string]any or []any, and
// ToLua(v) for anything else (scalars convert directly).
func NewProxy(L *lua.LState, v any) lua.LValue {
	return NewProxyNamed(L, v, "")
}

// NewProxyNamed is NewProxy with a name for the root in error messages: with root
// "body", writing to body.spec.replicas says "body.spec.replicas is read-only: ...".
func NewProxyNamed(L *lua.LState, v any, root string) lua.LValue {
	c := stateOf(L)
	switch x := v.(type) {
	case map[string]any:
		if x != nil {
			tree := &proxyTree{pds: make(map[*lua.LTable]*proxyData, 4), root: root}
			return c.newProxy(L, &proxyData{tree: tree, v: x, obj: x})
		}
	case []any:
		if x != nil {
			tree := &proxyTree{pds: make(map[*lua.LTable]*proxyData, 4), root: root}
			return c.newProxy(L, &proxyData{tree: tree, v: x, list: x})
		}
	}
	return c.toLua(L, v, 0)
}

func (c *state) newProxy(L *lua.LState, pd *proxyData) *lua.LTable {
	t := L.CreateTable(0, 0)
	t.Metatable = c.treeMT(L, pd.tree, pd.isList())
	pd.tree.pds[t] = pd
	return t
}

// treeMT returns the tree's metatable for objects or lists, making it on first use.
func (c *state) treeMT(L *lua.LState, tree *proxyTree, list bool) *lua.LTable {
	if list && tree.listMT != nil {
		return tree.listMT
	}
	if !list && tree.objMT != nil {
		return tree.objMT
	}
	if tree.self == nil {
		tree.self = &lua.LUserData{Value: tree, Metatable: lua.LNil}
	}
	mt := L.CreateTable(0, 8)
	mt.RawSetString("__index", c.index)
	mt.RawSetString("__newindex", c.newIndex)
	mt.RawSetString("__pairs", c.pairs)
	mt.RawSetString("__tostring", c.toString)
	mt.RawSetString("__metatable", lua.LFalse)
	mt.RawSetString(treeKey, tree.self)
	if list {
		mt.RawSetString("__len", c.length)
		mt.RawSetString("__ipairs", c.ipairs)
		tree.listMT = mt
	} else {
		// No __len and no __ipairs: # and ipairs of an empty table give 0 and nothing.
		tree.objMT = mt
	}
	return mt
}

// proxyDataOf returns the proxyData behind a proxy table, or nil.
func proxyDataOf(t *lua.LTable) *proxyData {
	mt, ok := t.Metatable.(*lua.LTable)
	if !ok {
		return nil
	}
	ud, ok := mt.RawGetString(treeKey).(*lua.LUserData)
	if !ok {
		return nil
	}
	tree, ok := ud.Value.(*proxyTree)
	if !ok {
		return nil
	}
	return tree.pds[t]
}

// ProxyValue returns the Go value behind a proxy (not a copy: do not modify it); ok is
// false when lv is not a proxy.
func ProxyValue(lv lua.LValue) (v any, ok bool) {
	t, ok := lv.(*lua.LTable)
	if !ok {
		return nil, false
	}
	pd := proxyDataOf(t)
	if pd == nil {
		return nil, false
	}
	return pd.v, true
}

// child returns the converted child at key (objects) or index (lists), converting and
// caching it on first access. ok is false when there is no such child.
func (c *state) child(L *lua.LState, pd *proxyData, key lua.LValue) (lua.LValue, bool) {
	if pd.isList() {
		n, ok := key.(lua.LNumber)
		if !ok {
			return lua.LNil, false
		}
		i := int(n)
		if lua.LNumber(i) != n || i < 1 || i > len(pd.list) {
			return lua.LNil, false
		}
		if pd.lcache == nil {
			pd.lcache = make([]lua.LValue, len(pd.list))
		} else if lv := pd.lcache[i-1]; lv != nil {
			return lv, true
		}
		lv := c.convertChild(L, pd, pathStep{index: i}, pd.list[i-1])
		pd.lcache[i-1] = lv
		return lv, true
	}
	s, ok := key.(lua.LString)
	if !ok {
		return lua.LNil, false
	}
	k := string(s)
	if lv, ok := pd.cache[k]; ok {
		return lv, true
	}
	v, ok := pd.obj[k]
	if !ok {
		return lua.LNil, false
	}
	lv := c.convertChild(L, pd, pathStep{key: k, isKey: true}, v)
	if pd.cache == nil {
		pd.cache = make(map[string]lua.LValue, 4)
	}
	pd.cache[k] = lv
	return lv, true
}

func (c *state) convertChild(L *lua.LState, parent *proxyData, step pathStep, v any) lua.LValue {
	switch x := v.(type) {
	case map[string]any:
		if x != nil {
			return c.newProxy(L, &proxyData{tree: parent.tree, v: x, obj: x, parent: parent, step: step})
		}
	case []any:
		if x != nil {
			return c.newProxy(L, &proxyData{tree: parent.tree, v: x, list: x, parent: parent, step: step})
		}
	}
	return c.toLua(L, v, 0)
}

// proxyArg returns the proxyData of argument 1 of a metamethod: the proxy table.
func proxyArg(L *lua.LState) *proxyData {
	if t, ok := L.Get(1).(*lua.LTable); ok {
		if pd := proxyDataOf(t); pd != nil {
			return pd
		}
	}
	L.ArgError(1, "luaop read-only view expected")
	return nil
}

// initProxy makes the metamethods the proxies of L share, once per state: Lua
// functions of the state, like every value of it.
func (c *state) initProxy(L *lua.LState) {
	c.index = L.NewFunction(c.proxyIndex)
	c.newIndex = L.NewFunction(c.proxyNewIndex)
	c.length = L.NewFunction(c.proxyLen)
	c.listNext = L.NewFunction(c.proxyListNext)
	c.mapNext = L.NewFunction(c.proxyMapNext)
	c.pairs = L.NewFunction(c.proxyPairs)
	c.ipairs = L.NewFunction(c.proxyIPairs)
	c.toString = L.NewFunction(c.proxyToString)
}

// proxyIndex is __index: the child at a key, converted on first read (child).
func (c *state) proxyIndex(L *lua.LState) int {
	pd := proxyArg(L)
	lv, _ := c.child(L, pd, L.Get(2))
	L.Push(lv)
	return 1
}

// proxyNewIndex is __newindex: proxies are read-only; the error names the path written.
func (c *state) proxyNewIndex(L *lua.LState) int {
	pd := proxyArg(L)
	var step pathStep
	switch k := L.Get(2).(type) {
	case lua.LNumber:
		step = pathStep{index: int(k)}
	default:
		step = pathStep{key: lua.LVAsString(k), isKey: true}
		if _, ok := k.(lua.LString); !ok {
			step.key = k.String()
		}
	}
	L.RaiseError("%s is read-only: write to ctx.patch instead", pd.path(&step))
	return 0
}

// proxyLen is __len: the length of a list, 0 for an object.
func (c *state) proxyLen(L *lua.LState) int {
	pd := proxyArg(L)
	if pd.isList() {
		L.Push(lua.LNumber(len(pd.list)))
	} else {
		L.Push(lua.LNumber(0))
	}
	return 1
}

// proxyListNext is the iterator of a list's pairs and ipairs.
func (c *state) proxyListNext(L *lua.LState) int {
	pd := proxyArg(L)
	if !pd.isList() {
		return 0 // ipairs over an object: like a plain table, nothing
	}
	i := L.CheckInt(2) + 1
	if i < 1 || i > len(pd.list) {
		return 0
	}
	lv, _ := c.child(L, pd, lua.LNumber(i))
	L.Push(lua.LNumber(i))
	L.Push(lv)
	return 2
}

// proxyMapNext is the iterator of an object's pairs: its keys in sorted order (next's contract: a key not in the object is an error).
func (c *state) proxyMapNext(L *lua.LState) int {
	pd := proxyArg(L)
	keys := pd.sortedKeys()
	i := 0
	if k := L.Get(2); k != lua.LNil {
		ks, ok := k.(lua.LString)
		if !ok {
			L.RaiseError("invalid key to 'next'")
		}
		i = sort.SearchStrings(keys, string(ks))
		if i == len(keys) || keys[i] != string(ks) {
			L.RaiseError("invalid key to 'next'")
		}
		i++
	}
	if i >= len(keys) {
		return 0
	}
	key := lua.LString(keys[i])
	lv, _ := c.child(L, pd, key)
	L.Push(key)
	L.Push(lv)
	return 2
}

// proxyPairs is __pairs: listNext for a list, mapNext for an object.
func (c *state) proxyPairs(L *lua.LState) int {
	if proxyArg(L).isList() {
		return c.pushListIteration(L)
	}
	L.Push(c.mapNext)
	L.Push(L.Get(1))
	L.Push(lua.LNil)
	return 3
}

// proxyIPairs is __ipairs: listNext (nothing for an object).
func (c *state) proxyIPairs(L *lua.LState) int {
	proxyArg(L)
	return c.pushListIteration(L)
}

// pushListIteration pushes what a for loop over a list's elements starts from:
// listNext, the proxy, index 0.
func (c *state) pushListIteration(L *lua.LState) int {
	L.Push(c.listNext)
	L.Push(L.Get(1))
	L.Push(lua.LNumber(0))
	return 3
}

// proxyToString is __tostring: the JSON of the value.
func (c *state) proxyToString(L *lua.LState) int {
	proxyArg(L)
	data, err := NewBudget(Limits{}).EncodeJSON(L.Get(1))
	if err != nil {
		L.RaiseError("tostring of a read-only view: %s", err)
	}
	L.Push(lua.LString(data))
	return 1
}
