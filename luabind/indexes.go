package luabind

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	lua "github.com/luaop/luaop/third_party/gopher-lua"

	"github.com/luaop/luaop/luabind/internal/luavalue"
	"github.com/luaop/luaop/processing/causes"
)

// Index keys. kopf's index functions return a dict whose keys may be any hashable
// value, tuples included ({(namespace, name): ...}), compared by value. A Lua table
// used as a key is compared by identity, so such keys are encoded by value: a key
// that is not a string (a table of scalars and tables, a number, a boolean) is kept
// as indexKeyMark followed by its canonical JSON (object keys sorted), and decoded
// back into a fresh table (or number, boolean) when ctx.indexes is iterated. So
// ctx.indexes.is_running[{ns, name}] finds what an index function returned under
// {[{ns, name}] = ...}, and string keys stay what they are (the processing core
// stores every key as a string and never looks inside).
const indexKeyMark = "\x00luaop.key:"

// encodeIndexKey is the stored form of a key of an index function's result.
func encodeIndexKey(k lua.LValue) (string, error) {
	return encodeIndexKeyWithin(k, luavalue.NewBudget(luavalue.Limits{}))
}

// encodeIndexKeyWithin is encodeIndexKey counting the key against budget.
func encodeIndexKeyWithin(k lua.LValue, budget *luavalue.Budget) (string, error) {
	if s, ok := k.(lua.LString); ok {
		_, err := budget.FromLua(s) // counts its bytes
		return string(s), err
	}
	v, err := budget.FromLua(k)
	if err != nil {
		return "", err
	}
	switch v.(type) {
	case nil:
		return "", fmt.Errorf("a key cannot be nil or luaop.null")
	}
	data, err := json.Marshal(v) // maps marshal with sorted keys: one encoding per value
	if err != nil {
		return "", err
	}
	return indexKeyMark + string(data), nil
}

// decodeIndexKey is the Lua value of a stored key.
func decodeIndexKey(L *lua.LState, key string) lua.LValue {
	rest, ok := strings.CutPrefix(key, indexKeyMark)
	if !ok {
		return lua.LString(key)
	}
	var v any
	dec := json.NewDecoder(strings.NewReader(rest))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return lua.LString(key)
	}
	return luavalue.ToLua(L, numbersOf(v))
}

// numbersOf turns the json.Numbers of a decoded key into int64 or float64, as the
// rest of luaop sees numbers.
func numbersOf(v any) any {
	switch x := v.(type) {
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i
		}
		f, _ := x.Float64()
		return f
	case []any:
		for i := range x {
			x[i] = numbersOf(x[i])
		}
	case map[string]any:
		for k := range x {
			x[k] = numbersOf(x[k])
		}
	}
	return v
}

// indexResult converts what an index function returned into its entries: a table
// of string keys (kept as they are) or of keys of other types (tables, numbers,
// booleans: encoded by value, encodeIndexKey), or any other value (a scalar; a list,
// keys 1..n alone), which the core keeps under the key "" (kopf keeps it under None).
// The whole result, its keys included, is bound by limits.
func indexResult(ret lua.LValue, limits luavalue.Limits) (any, error) {
	v, err := luavalue.FromLuaLimited(ret, limits)
	t, isTable := ret.(*lua.LTable)
	if err == nil || !isTable || errors.Is(err, luavalue.ErrTooLarge) {
		return v, err
	}
	// Not a JSON value: keys that are not strings, as kopf's tuple keys. The entries
	// are converted one by one, against one budget: what the failed conversion above
	// stopped at (the first key that is not a string) must not free the rest from it.
	budget, out := luavalue.NewBudget(limits), map[string]any{}
	err = nil
	t.ForEach(func(k, v lua.LValue) {
		if err != nil {
			return
		}
		key, kerr := encodeIndexKeyWithin(k, budget)
		if kerr != nil {
			err = fmt.Errorf("index key %s: %w", k.String(), kerr)
			return
		}
		val, verr := budget.FromLua(v)
		if verr != nil {
			err = fmt.Errorf("the value under index key %s: %w", k.String(), verr)
			return
		}
		out[key] = val
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// indexesTable is ctx.indexes: ctx.indexes.<name>[key] is the list of values the
// objects put under key (a table key is compared by value). Each index is read
// when first touched in the call; an index the scripts register that no object
// fed yet (a probe or a startup handler before the first listing) is empty.
func (s *shard) indexesTable(L *lua.LState, call *causes.Call) lua.LValue {
	t := L.NewTable()
	mt := L.NewTable()
	mt.RawSetString("__index", L.NewFunction(func(L *lua.LState) int {
		name := L.CheckString(2)
		registered := s.rt.indexRegistered(name)
		if call.Indexes == nil && !registered {
			L.RaiseError("index %q: no indexes are registered", name)
		}
		// The indexes belong to the processing core: read with the shard released
		// (no lock held while calling out of the package).
		var entries map[string][]any
		ok := false
		if call.Indexes != nil {
			s.blocking(L, func(context.Context) { entries, ok = call.Indexes.Lookup(name) })
		}
		if !ok && !registered {
			L.RaiseError("index %q is not registered (luaop.index(resource, fn, {id = %q}))", name, name)
		}
		view := s.indexView(L, name, entries)
		t.RawSetString(name, view) // one view per call and index
		L.Push(view)
		return 1
	}))
	mt.RawSetString("__metatable", lua.LFalse)
	L.SetMetatable(t, mt)
	return t
}

// indexRegistered tells whether the current scripts register an index of that id.
func (r *Runtime) indexRegistered(id string) bool {
	for _, spec := range r.gen.Load().specs {
		if spec.Kind == causes.KindIndex && spec.ID == id {
			return true
		}
	}
	return false
}

// indexView is the read-only view of one index: view[key] is the list of values
// under key (nil when none), pairs(view) gives every key (tables, numbers and
// booleans decoded back) with its list, in a stable order, and #view is the number
// of keys (kopf's len(index)).
func (s *shard) indexView(L *lua.LState, name string, entries map[string][]any) *lua.LTable {
	keys := make([]string, 0, len(entries))
	for k := range entries {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	lists := map[string]lua.LValue{}
	list := func(L *lua.LState, key string) lua.LValue {
		if v, ok := lists[key]; ok {
			return v
		}
		values := make([]any, len(entries[key]))
		copy(values, entries[key])
		v := luavalue.NewProxyNamed(L, values, "ctx.indexes."+name)
		lists[key] = v
		return v
	}
	view := L.NewTable()
	mt := L.NewTable()
	mt.RawSetString("__index", L.NewFunction(func(L *lua.LState) int {
		key, err := encodeIndexKey(L.Get(2))
		if _, found := entries[key]; err != nil || !found {
			return 0
		}
		L.Push(list(L, key))
		return 1
	}))
	mt.RawSetString("__newindex", L.NewFunction(func(L *lua.LState) int {
		L.RaiseError("ctx.indexes.%s is read-only: the index handlers build it", name)
		return 0
	}))
	mt.RawSetString("__len", L.NewFunction(func(L *lua.LState) int {
		L.Push(lua.LNumber(len(keys)))
		return 1
	}))
	mt.RawSetString("__pairs", L.NewFunction(func(L *lua.LState) int {
		i := 0
		L.Push(L.NewFunction(func(L *lua.LState) int {
			if i >= len(keys) {
				return 0
			}
			key := keys[i]
			i++
			L.Push(decodeIndexKey(L, key))
			L.Push(list(L, key))
			return 2
		}))
		L.Push(view)
		L.Push(lua.LNil)
		return 3
	}))
	mt.RawSetString("__metatable", lua.LFalse)
	L.SetMetatable(view, mt)
	return view
}

// IndexKeyText is how a stored index key reads as text (luaop test's results): a
// string key as it is, a key that was a table, a number or a boolean as its JSON
// (["default","p1"], 7, true).
func IndexKeyText(key string) string {
	if rest, ok := strings.CutPrefix(key, indexKeyMark); ok {
		return rest
	}
	return key
}

// IndexKeyFromText is IndexKeyText's inverse for what luaop test's cases give: a text
// that is a JSON array or object (["default","p1"]) stands for a table key; any other
// text is a string key.
func IndexKeyFromText(text string) string {
	t := strings.TrimSpace(text)
	if !strings.HasPrefix(t, "[") && !strings.HasPrefix(t, "{") {
		return text
	}
	var v any
	if json.Unmarshal([]byte(t), &v) != nil {
		return text
	}
	data, err := json.Marshal(v) // canonical: as encodeIndexKey writes it
	if err != nil {
		return text
	}
	return indexKeyMark + string(data)
}
