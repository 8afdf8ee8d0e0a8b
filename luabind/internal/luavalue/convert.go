package luavalue

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"

	lua "github.com/luaop/luaop/third_party/gopher-lua"
)

// Conversion between Kubernetes JSON values and Lua.
//
// Go side: the values client-go's unstructured decoding produces (map[string]any, []any,
// string, bool, int64, float64, nil); ToLua also accepts the other Go integer and float
// types, json.Number, and (through reflection or a JSON round trip) other maps, slices
// and structs.
//
// Lua side:
//   - objects are tables with string keys; an EMPTY object carries the object marker
//     metatable so that it stays an object when it comes back;
//   - lists are tables with keys 1..n and always carry the array marker metatable, so an
//     empty list stays a list and a list emptied by a handler stays a list;
//   - JSON null is luaop.null, a per-state userdata (tostring gives "null"). It is truthy
//     in Lua: test it with luaop.is_null(v) or v == luaop.null;
//   - numbers are lua.LNumber (float64). On the way back an integral number with
//     |x| <= 2^53 becomes int64, anything else float64; so an int64 beyond ±2^53 does
//     not survive a trip through Lua exactly (it comes back as the nearest float64).
//
// FromLua, for tables without a marker: keys exactly 1..n (n > 0) make a list, string
// keys make an object, and an EMPTY plain table is an OBJECT ({}): a handler that wants
// an empty list writes luaop.array() (or luaop.array(t) to mark an existing table).
// List indices in error paths are Lua's (1-based): "spec.items[3]" is items[3] in Lua.

// maxDepth bounds the nesting of values converted from Lua (and of Go values copied
// out of proxies), so a self-similar or absurdly deep value fails instead of exhausting
// the stack.
const maxDepth = 100

// maxSafeInt is 2^53: every integer up to it is exactly representable as float64.
const maxSafeInt = 1 << 53

// Keys of the marker metatables. Their value says which marker it is. Forging them from
// Lua (setmetatable(t, {__luaop_json = "array"})) is harmless: it is what luaop.array does.
const (
	markerKey   = "__luaop_json"
	markArray   = lua.LString("array")
	markObject  = lua.LString("object")
	registryKey = "luaop.luavalue.state"
)

// nullValue is the Go value held by every state's null sentinel. It is a zero-size,
// immutable type: recognising the sentinel needs no state.
type nullValue struct{}

// state holds the per-LState objects of conversion: marker metatables, the null
// sentinel, and the shared functions of proxies. It lives in the state's registry
// (L.G.Registry), which coroutines (NewThread) share, and is made on first use; like
// every Lua value of the state, it is used only by whoever holds the state.
type state struct {
	null     *lua.LUserData
	arrayMT  *lua.LTable
	objectMT *lua.LTable

	// proxies (proxy.go)
	index    *lua.LFunction
	newIndex *lua.LFunction
	length   *lua.LFunction
	pairs    *lua.LFunction
	ipairs   *lua.LFunction
	toString *lua.LFunction
	mapNext  *lua.LFunction
	listNext *lua.LFunction
}

// stateOf returns L's conversion state, creating it on first use.
func stateOf(L *lua.LState) *state {
	reg := L.G.Registry
	if ud, ok := reg.RawGetString(registryKey).(*lua.LUserData); ok {
		if c, ok := ud.Value.(*state); ok {
			return c
		}
	}
	c := newState(L)
	reg.RawSetString(registryKey, &lua.LUserData{Value: c, Metatable: lua.LNil})
	return c
}

func newState(L *lua.LState) *state {
	c := &state{}

	nullMT := L.CreateTable(0, 4)
	nullMT.RawSetString("__tostring", L.NewFunction(func(L *lua.LState) int {
		L.Push(lua.LString("null"))
		return 1
	}))
	nullMT.RawSetString("__index", L.NewFunction(func(L *lua.LState) int {
		L.RaiseError("attempt to index luaop.null (JSON null) with key '%s'", L.Get(2).String())
		return 0
	}))
	nullMT.RawSetString("__newindex", L.NewFunction(func(L *lua.LState) int {
		L.RaiseError("attempt to write into luaop.null (JSON null)")
		return 0
	}))
	nullMT.RawSetString("__metatable", lua.LString("null"))
	c.null = &lua.LUserData{Value: nullValue{}, Metatable: nullMT}

	c.arrayMT = L.CreateTable(0, 1)
	c.arrayMT.RawSetString(markerKey, markArray)
	c.objectMT = L.CreateTable(0, 1)
	c.objectMT.RawSetString(markerKey, markObject)
	// Shared by every marked table of the state: protected, so that no script changes
	// them for the others (the shards' setmetatable may still replace them on a table).
	c.arrayMT.RawSetString("__metatable", lua.LFalse)
	c.objectMT.RawSetString("__metatable", lua.LFalse)

	c.initProxy(L)
	return c
}

// Null returns the state's JSON null sentinel (luaop.null).
func Null(L *lua.LState) *lua.LUserData { return stateOf(L).null }

// IsNull tells whether v is a JSON null sentinel (of any state).
func IsNull(v lua.LValue) bool {
	ud, ok := v.(*lua.LUserData)
	if !ok {
		return false
	}
	_, ok = ud.Value.(nullValue)
	return ok
}

// Markers returns the state's marker metatables: the one luaop.array sets (a JSON
// list) and the one luaop.object sets (a JSON object). They are shared by the state's
// marked tables and protected (the conversion rules are at the top of convert.go).
func Markers(L *lua.LState) (list, object *lua.LTable) {
	c := stateOf(L)
	return c.arrayMT, c.objectMT
}

// ToLua converts a Go JSON value into a fresh Lua value (an eager deep copy).
func ToLua(L *lua.LState, v any) lua.LValue {
	return stateOf(L).toLua(L, v, 0)
}

func (c *state) toLua(L *lua.LState, v any, depth int) lua.LValue {
	switch x := v.(type) {
	case nil:
		return c.null
	case string:
		return lua.LString(x)
	case bool:
		return lua.LBool(x)
	case int64:
		return lua.LNumber(x)
	case float64:
		return lua.LNumber(x)
	case map[string]any:
		if x == nil {
			return c.null // as encoding/json: a nil map is null
		}
		t := L.CreateTable(0, len(x))
		if len(x) == 0 {
			t.Metatable = c.objectMT
			return t
		}
		for k, e := range x {
			t.RawSetString(k, c.toLua(L, e, depth+1))
		}
		return t
	case []any:
		if x == nil {
			return c.null // as encoding/json: a nil slice is null
		}
		t := L.CreateTable(len(x), 0)
		for i, e := range x {
			t.RawSetInt(i+1, c.toLua(L, e, depth+1))
		}
		t.Metatable = c.arrayMT
		return t
	case int:
		return lua.LNumber(x)
	case int32:
		return lua.LNumber(x)
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return lua.LNumber(i)
		}
		if f, err := x.Float64(); err == nil {
			return lua.LNumber(f)
		}
		return lua.LString(x.String())
	case lua.LValue:
		return x
	}
	return c.toLuaReflect(L, v, depth)
}

// toLuaReflect handles the Go values that client-go never produces but Go callers may
// pass: other numeric types, typed maps and slices, pointers, structs (through JSON).
func (c *state) toLuaReflect(L *lua.LState, v any, depth int) lua.LValue {
	if depth > maxDepth {
		return c.null
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return lua.LNumber(rv.Int())
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return lua.LNumber(rv.Uint())
	case reflect.Float32, reflect.Float64:
		return lua.LNumber(rv.Float())
	case reflect.String:
		return lua.LString(rv.String())
	case reflect.Bool:
		return lua.LBool(rv.Bool())
	case reflect.Pointer, reflect.Interface:
		if rv.IsNil() {
			return c.null
		}
		if rv.Kind() == reflect.Interface || rv.Elem().Kind() != reflect.Struct {
			return c.toLua(L, rv.Elem().Interface(), depth+1)
		}
	case reflect.Map:
		if rv.IsNil() {
			return c.null
		}
		if rv.Type().Key().Kind() == reflect.String {
			t := L.CreateTable(0, rv.Len())
			if rv.Len() == 0 {
				t.Metatable = c.objectMT
			}
			it := rv.MapRange()
			for it.Next() {
				t.RawSetString(it.Key().String(), c.toLua(L, it.Value().Interface(), depth+1))
			}
			return t
		}
	case reflect.Slice, reflect.Array:
		if rv.Kind() == reflect.Slice && rv.IsNil() {
			return c.null
		}
		if rv.Type().Elem().Kind() != reflect.Uint8 { // []byte goes through JSON (base64)
			t := L.CreateTable(rv.Len(), 0)
			for i := 0; i < rv.Len(); i++ {
				t.RawSetInt(i+1, c.toLua(L, rv.Index(i).Interface(), depth+1))
			}
			t.Metatable = c.arrayMT
			return t
		}
	}
	// Structs, []byte, maps with non-string keys and the like: as JSON would see them.
	data, err := json.Marshal(v)
	if err != nil {
		return lua.LString(fmt.Sprint(v))
	}
	var out any
	if err := unmarshal(data, &out); err != nil {
		return lua.LString(fmt.Sprint(v))
	}
	return c.toLua(L, out, depth+1)
}

// unmarshal decodes JSON like client-go does: integers as int64, other numbers float64.
func unmarshal(data []byte, out *any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(out); err != nil {
		return err
	}
	v, err := normalize(*out, 0)
	*out = v
	return err
}

// walker keeps the path and the tables being visited (for cycle detection): the
// table at stack[i] is at path[:i].
type walker struct {
	path     []pathStep
	stack    []*lua.LTable
	count    *counter
	root     string      // Limits.Root
	vivified *lua.LTable // Limits.Vivified
}

// pathStep is one step of a path: a key of an object, or a 1-based index of a list.
type pathStep struct {
	key   string
	index int
	isKey bool
}

func (w *walker) errorf(format string, args ...any) error {
	return fmt.Errorf("%s: %s", w.where(len(w.path)), fmt.Sprintf(format, args...))
}

// wrap is errorf of an error kept for errors.Is.
func (w *walker) wrap(err error) error {
	return fmt.Errorf("%s: %w", w.where(len(w.path)), err)
}

// where renders the first n steps of the path, after the root when there is one
// ("value" for an empty path without a root).
func (w *walker) where(n int) string {
	if p := formatPath(w.root, w.path[:n]); p != "" {
		return p
	}
	return "value"
}

// formatPath renders steps as `spec.items[3]["app.kubernetes.io/name"]`, after
// root when it is not empty (`ctx.patch.x`).
func formatPath(root string, steps []pathStep) string {
	var b strings.Builder
	b.WriteString(root)
	for _, s := range steps {
		appendStep(&b, s)
	}
	return b.String()
}

func appendStep(b *strings.Builder, s pathStep) {
	if !s.isKey {
		b.WriteByte('[')
		b.WriteString(strconv.Itoa(s.index))
		b.WriteByte(']')
		return
	}
	if IsIdent(s.key) {
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(s.key)
		return
	}
	b.WriteByte('[')
	b.WriteString(strconv.Quote(s.key))
	b.WriteByte(']')
}

func IsIdent(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (i > 0 && c >= '0' && c <= '9') {
			continue
		}
		return false
	}
	return true
}

func (w *walker) from(lv lua.LValue, depth int) (any, error) {
	if err := w.count.add(luaJSONSize(lv)); err != nil {
		return nil, w.wrap(err)
	}
	switch x := lv.(type) {
	case *lua.LNilType:
		return nil, nil
	case lua.LBool:
		return bool(x), nil
	case lua.LString:
		return string(x), nil
	case lua.LNumber:
		return jsonNumber(float64(x), w)
	case *lua.LTable:
		if depth >= maxDepth {
			return nil, w.errorf("value nested deeper than %d levels", maxDepth)
		}
		if pd := proxyDataOf(x); pd != nil {
			v, err := normalizeCounted(pd.v, depth, w.count)
			if err != nil {
				return nil, w.wrap(err)
			}
			return v, nil
		}
		for i, t := range w.stack {
			if t == x {
				back := w.where(i)
				if i == 0 && w.root == "" {
					back = "the whole value"
				}
				return nil, fmt.Errorf("cycle at %s: it refers back to %s (a table that contains itself cannot be converted)", w.where(len(w.path)), back)
			}
		}
		w.stack = append(w.stack, x)
		v, err := w.table(x, depth)
		w.stack = w.stack[:len(w.stack)-1]
		return v, err
	case *lua.LUserData:
		if _, ok := x.Value.(nullValue); ok {
			return nil, nil
		}
		return nil, w.errorf("cannot convert a userdata to JSON")
	case *lua.LFunction:
		return nil, w.errorf("cannot convert a function to JSON")
	case *lua.LState:
		return nil, w.errorf("cannot convert a coroutine to JSON")
	case nil:
		return nil, nil
	default:
		return nil, w.errorf("cannot convert a %s to JSON", lv.Type().String())
	}
}

// luaJSONSize is what lv adds to the JSON size by itself: a string or number as
// written, a table its brackets, every value its separator.
func luaJSONSize(lv lua.LValue) int {
	switch x := lv.(type) {
	case lua.LString:
		return jsonStringSize(string(x)) + 1
	case lua.LNumber:
		return jsonNumberSize(float64(x)) + 1
	}
	return 5 // null, false, {}, [] and a separator
}

// goJSONSize is luaJSONSize of a Go JSON value.
func goJSONSize(v any) int {
	switch x := v.(type) {
	case string:
		return jsonStringSize(x) + 1
	case float64:
		return jsonNumberSize(x) + 1
	case int64:
		return jsonNumberSize(float64(x)) + 1
	}
	return 5
}

// isEmptyVivified tells whether v, converted to gv, is a table made on first read
// (its metatable is vivified) that stayed an empty object.
func isEmptyVivified(v lua.LValue, gv any, vivified *lua.LTable) bool {
	t, ok := v.(*lua.LTable)
	if !ok || t.Metatable != vivified {
		return false
	}
	m, ok := gv.(map[string]any)
	return ok && len(m) == 0
}

// jsonNumber applies the number rule: integral and |x| <= 2^53 -> int64, else float64.
func jsonNumber(f float64, w *walker) (any, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return nil, w.errorf("number %v cannot be represented in JSON", f)
	}
	if f == math.Trunc(f) && f >= -maxSafeInt && f <= maxSafeInt {
		return int64(f), nil
	}
	return f, nil
}

func markerOf(t *lua.LTable) lua.LValue {
	mt, ok := t.Metatable.(*lua.LTable)
	if !ok {
		return lua.LNil
	}
	return mt.RawGetString(markerKey)
}

// table converts a plain or marked table.
func (w *walker) table(t *lua.LTable, depth int) (any, error) {
	marker := markerOf(t)

	// Classify the keys in one pass.
	var (
		nInt, maxInt, nStr int
		badKey             lua.LValue = lua.LNil
	)
	t.ForEach(func(k, _ lua.LValue) {
		switch kk := k.(type) {
		case lua.LString:
			nStr++
		case lua.LNumber:
			f := float64(kk)
			if f >= 1 && f == math.Trunc(f) && f <= math.MaxInt32 {
				nInt++
				if int(f) > maxInt {
					maxInt = int(f)
				}
				return
			}
			if badKey == lua.LNil {
				badKey = k
			}
		default:
			if badKey == lua.LNil {
				badKey = k
			}
		}
	})

	switch {
	case marker == markArray:
		if nStr > 0 {
			return nil, w.errorf("list has a string key %s (a list takes only indices 1..n)", strconv.Quote(w.smallestStringKey(t)))
		}
		if badKey != lua.LNil {
			return nil, w.errorf("list has an invalid key %s (a list takes only indices 1..n)", keyString(badKey))
		}
		if nInt != maxInt {
			return nil, w.errorf("list has a hole at index %d (a list takes indices 1..n without gaps; use luaop.null for JSON null)", firstHole(t, maxInt))
		}
		return w.list(t, maxInt, depth)
	case marker == markObject:
		if badKey != lua.LNil || nInt > 0 {
			k := badKey
			if k == lua.LNil {
				k = lua.LNumber(w.smallestIntKey(t))
			}
			return nil, w.errorf("object has a non-string key %s (object keys must be strings)", keyString(k))
		}
		return w.object(t, nStr, depth)
	}

	switch {
	case badKey != lua.LNil:
		return nil, w.errorf("table has a key %s that is neither a string nor a list index 1..n", keyString(badKey))
	case nInt > 0 && nStr > 0:
		return nil, w.errorf("table mixes list indices and string keys (index %d and key %s); use either 1..n or string keys", w.smallestIntKey(t), strconv.Quote(w.smallestStringKey(t)))
	case nInt > 0:
		if nInt != maxInt {
			return nil, w.errorf("table is a sparse list: hole at index %d (a list takes indices 1..n without gaps; use luaop.null for JSON null)", firstHole(t, maxInt))
		}
		return w.list(t, maxInt, depth)
	default:
		// String keys, or an empty plain table: an object.
		return w.object(t, nStr, depth)
	}
}

func (w *walker) list(t *lua.LTable, n int, depth int) (any, error) {
	out := make([]any, n)
	for i := 1; i <= n; i++ {
		w.path = append(w.path, pathStep{index: i})
		v, err := w.from(t.RawGetInt(i), depth+1)
		w.path = w.path[:len(w.path)-1]
		if err != nil {
			return nil, err
		}
		out[i-1] = v
	}
	return out, nil
}

func (w *walker) object(t *lua.LTable, n int, depth int) (any, error) {
	out := make(map[string]any, n)
	var firstErr error
	var errKey string
	t.ForEach(func(k, v lua.LValue) {
		ks := string(k.(lua.LString))
		if firstErr != nil && ks > errKey {
			return
		}
		w.count.addBytes(jsonStringSize(ks) + 1)
		w.path = append(w.path, pathStep{key: ks, isKey: true})
		gv, err := w.from(v, depth+1)
		w.path = w.path[:len(w.path)-1]
		if err == nil && w.vivified != nil && isEmptyVivified(v, gv, w.vivified) {
			return // a table of ctx.patch only read through
		}
		if err != nil {
			// Report the error under the smallest key, so messages are deterministic.
			if firstErr == nil || ks < errKey {
				firstErr, errKey = err, ks
			}
			return
		}
		out[ks] = gv
	})
	if firstErr != nil {
		return nil, firstErr
	}
	return out, nil
}

func (w *walker) smallestStringKey(t *lua.LTable) string {
	var keys []string
	t.ForEach(func(k, _ lua.LValue) {
		if s, ok := k.(lua.LString); ok {
			keys = append(keys, string(s))
		}
	})
	sort.Strings(keys)
	if len(keys) == 0 {
		return ""
	}
	return keys[0]
}

func (w *walker) smallestIntKey(t *lua.LTable) int {
	best := 0
	t.ForEach(func(k, _ lua.LValue) {
		if n, ok := k.(lua.LNumber); ok && float64(n) >= 1 && float64(n) == math.Trunc(float64(n)) {
			if best == 0 || int(n) < best {
				best = int(n)
			}
		}
	})
	return best
}

func firstHole(t *lua.LTable, n int) int {
	for i := 1; i <= n; i++ {
		if t.RawGetInt(i) == lua.LNil {
			return i
		}
	}
	return n + 1
}

func keyString(k lua.LValue) string {
	switch kk := k.(type) {
	case lua.LString:
		return strconv.Quote(string(kk))
	case lua.LNumber:
		return kk.String()
	default:
		return "(" + k.Type().String() + ")"
	}
}

// normalize deep-copies a Go JSON value, normalising numbers to int64/float64 as
// client-go does. It serves proxies (whose Go value FromLua must not share) and ToLua's
// JSON fallback.
func normalize(v any, depth int) (any, error) { return normalizeCounted(v, depth, nil) }

// normalizeCounted is normalize counting each value copied in c (nil: no limit).
func normalizeCounted(v any, depth int, c *counter) (any, error) {
	if err := c.add(goJSONSize(v)); err != nil {
		return nil, err
	}
	switch x := v.(type) {
	case nil, string, bool, int64, float64:
		return x, nil
	case map[string]any:
		if x == nil {
			return nil, nil
		}
		if depth >= maxDepth {
			return nil, fmt.Errorf("value nested deeper than %d levels", maxDepth)
		}
		out := make(map[string]any, len(x))
		for k, e := range x {
			c.addBytes(jsonStringSize(k) + 1)
			cv, err := normalizeCounted(e, depth+1, c)
			if err != nil {
				return nil, err
			}
			out[k] = cv
		}
		return out, nil
	case []any:
		if x == nil {
			return nil, nil
		}
		if depth >= maxDepth {
			return nil, fmt.Errorf("value nested deeper than %d levels", maxDepth)
		}
		out := make([]any, len(x))
		for i, e := range x {
			cv, err := normalizeCounted(e, depth+1, c)
			if err != nil {
				return nil, err
			}
			out[i] = cv
		}
		return out, nil
	case int:
		return int64(x), nil
	case int32:
		return int64(x), nil
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i, nil
		}
		f, err := x.Float64()
		if err != nil {
			return nil, fmt.Errorf("invalid number %q", x.String())
		}
		return f, nil
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return rv.Int(), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		u := rv.Uint()
		if u > math.MaxInt64 {
			return float64(u), nil
		}
		return int64(u), nil
	case reflect.Float32, reflect.Float64:
		return rv.Float(), nil
	case reflect.String:
		return rv.String(), nil
	case reflect.Bool:
		return rv.Bool(), nil
	}
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var out any
	if err := unmarshal(data, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// InstallMarkers sets, on the luaop module table:
//
//	mod.null        the JSON null sentinel of this state
//	mod.array(t?)   marks t (or a new table) as a JSON list and returns it
//	mod.object(t?)  marks t (or a new table) as a JSON object and returns it
//	mod.is_null(v)  true only for mod.null (not for nil)
//
// Marking a read-only proxy returns a marked plain copy of it (proxies cannot carry
// another metatable).
func InstallMarkers(L *lua.LState, mod *lua.LTable) {
	c := stateOf(L)
	mod.RawSetString("null", c.null)
	mark := func(mt *lua.LTable, wantList bool) *lua.LFunction {
		return L.NewFunction(func(L *lua.LState) int {
			var t *lua.LTable
			switch v := L.Get(1).(type) {
			case *lua.LNilType:
				t = L.NewTable()
			case *lua.LTable:
				t = v
				if pd := proxyDataOf(v); pd != nil {
					if _, isList := pd.v.([]any); isList != wantList {
						L.ArgError(1, "a read-only view of a "+kindName(isList)+" cannot become a "+kindName(wantList))
					}
					t = c.toLua(L, pd.v, 0).(*lua.LTable)
				}
			default:
				L.ArgError(1, "table or nil expected, got "+v.Type().String())
			}
			t.Metatable = mt
			L.Push(t)
			return 1
		})
	}
	mod.RawSetString("array", mark(c.arrayMT, true))
	mod.RawSetString("object", mark(c.objectMT, false))
	mod.RawSetString("is_null", L.NewFunction(func(L *lua.LState) int {
		ud, ok := L.Get(1).(*lua.LUserData)
		if ok {
			_, ok = ud.Value.(nullValue)
		}
		L.Push(lua.LBool(ok))
		return 1
	}))
}

func kindName(list bool) string {
	if list {
		return "list"
	}
	return "object"
}
