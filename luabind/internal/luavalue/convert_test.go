package luavalue

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	lua "github.com/luaop/luaop/third_party/gopher-lua"

	"github.com/luaop/luaop/luabind/internal/luatest"
)

// newTestState returns a sandboxed state with a global `luaop` holding the markers
// and a global `userdata()` making a plain userdata.
func newTestState(t testing.TB) *lua.LState {
	t.Helper()
	L := lua.NewState()
	t.Cleanup(L.Close)
	InstallIteration(L)
	mod := L.NewTable()
	InstallMarkers(L, mod)
	L.SetGlobal("luaop", mod)
	L.SetGlobal("userdata", L.NewFunction(func(L *lua.LState) int {
		L.Push(L.NewUserData())
		return 1
	}))
	return L
}

// ---- conversion tests ----

func TestConvertRoundTrip(t *testing.T) {
	cases := []struct {
		name string
		json string
		file string
	}{
		{name: "deployment", file: "deployment.json"},
		{name: "crd instance", file: "crd-instance.json"},
		{name: "empty object", json: `{}`},
		{name: "empty list", json: `[]`},
		{name: "empties at depth", json: `{"a":{},"b":[],"c":{"d":{},"e":[[],{}],"f":[{"g":[]}]}}`},
		{name: "list of empties", json: `[[],{},[[]],[{}]]`},
		{name: "top null", json: `null`},
		{name: "null values", json: `{"x":null,"y":[null,1,null],"z":{"w":null}}`},
		{name: "int", json: `{"replicas":3}`},
		{name: "float", json: `{"ratio":2.5}`},
		{name: "2^53", json: `{"big":9007199254740992,"neg":-9007199254740992}`},
		{name: "integral float", json: `{"f":60.0}`},
		{name: "small float", json: `{"f":1e-7,"g":-0.5}`},
		{name: "large float", json: `{"f":6.02e23}`},
		{name: "unicode", json: `{"s":"Ünïcödé ✓ 中文 🎉","k\u00e9y":"\u0000nul"}`},
		{name: "bools", json: `[true,false]`},
		{name: "string", json: `"just a string"`},
	}
	L := newTestState(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var orig any
			if tc.file != "" {
				orig = luatest.LoadFile(t, tc.file)
			} else {
				orig = luatest.Decode(t, []byte(tc.json))
			}
			// Directly, and through a Lua function that returns its argument.
			got, err := FromLua(ToLua(L, orig))
			if err != nil {
				t.Fatal(err)
			}
			if err := luatest.SameJSON(orig, got, "$"); err != nil {
				t.Fatal(err)
			}
			lv := luatest.MustCall(t, L, "local v = ... ; return v", ToLua(L, orig))
			got, err = FromLua(lv)
			if err != nil {
				t.Fatal(err)
			}
			if err := luatest.SameJSON(orig, got, "$"); err != nil {
				t.Fatal(err)
			}
			// JSON text is stable too.
			a, _ := json.Marshal(orig)
			b, _ := json.Marshal(got)
			if tc.name != "integral float" && string(a) != string(b) {
				t.Fatalf("JSON differs:\n%s\n%s", a, b)
			}
		})
	}
}

func TestConvertIntegersStayIntegers(t *testing.T) {
	L := newTestState(t)
	obj := luatest.LoadFile(t, "deployment.json")
	got, err := FromLua(luatest.MustCall(t, L, `
		local d = ...
		d.spec.replicas = d.spec.replicas + 1
		d.spec.ratio = d.spec.replicas / 8
		return d`, ToLua(L, obj)))
	if err != nil {
		t.Fatal(err)
	}
	spec := got.(map[string]any)["spec"].(map[string]any)
	if r, ok := spec["replicas"].(int64); !ok || r != 4 {
		t.Fatalf("replicas = %#v, want int64 4", spec["replicas"])
	}
	if r, ok := spec["ratio"].(float64); !ok || r != 0.5 {
		t.Fatalf("ratio = %#v, want float64 0.5", spec["ratio"])
	}
	data, _ := json.Marshal(spec)
	if !strings.Contains(string(data), `"replicas":4`) {
		t.Fatalf("JSON: %s", data)
	}
}

func TestConvertNumbers(t *testing.T) {
	cases := []struct {
		lua  string
		want any
	}{
		{"3", int64(3)},
		{"-3", int64(-3)},
		{"2.5", 2.5},
		{"2^53", int64(1 << 53)},
		{"-2^53", int64(-(1 << 53))},
		{"2^53 + 2", float64(1<<53 + 2)},
		{"1e300", 1e300},
		{"-0.0", int64(0)},
		{"10 / 2", int64(5)},
		{"1 / 3", 1.0 / 3},
	}
	L := newTestState(t)
	for _, tc := range cases {
		t.Run(tc.lua, func(t *testing.T) {
			got, err := FromLua(luatest.MustCall(t, L, "return "+tc.lua))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %T %v, want %T %v", got, got, tc.want, tc.want)
			}
		})
	}
}

func TestConvertGoTypes(t *testing.T) {
	type small struct {
		Name string `json:"name"`
		N    int    `json:"n"`
	}
	cases := []struct {
		name string
		in   any
		want any
	}{
		{"int", 7, int64(7)},
		{"int32", int32(-7), int64(-7)},
		{"uint8", uint8(200), int64(200)},
		{"float32", float32(1.5), 1.5},
		{"json.Number int", json.Number("12"), int64(12)},
		{"json.Number float", json.Number("1.25"), 1.25},
		{"[]string", []string{"a", "b"}, []any{"a", "b"}},
		{"empty []string", []string{}, []any{}},
		{"map[string]string", map[string]string{"a": "b"}, map[string]any{"a": "b"}},
		{"empty map[string]int", map[string]int{}, map[string]any{}},
		{"struct", small{"x", 2}, map[string]any{"name": "x", "n": int64(2)}},
		{"pointer", &small{"y", 3}, map[string]any{"name": "y", "n": int64(3)}},
		{"nil slice", []any(nil), nil},
		{"nil map", map[string]any(nil), nil},
		{"nested json.Number", map[string]any{"a": []any{json.Number("5")}}, map[string]any{"a": []any{int64(5)}}},
	}
	L := newTestState(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FromLua(ToLua(L, tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %#v, want %#v", got, tc.want)
			}
		})
	}
}

func TestConvertShapes(t *testing.T) {
	cases := []struct {
		name string
		lua  string
		want string // JSON
	}{
		{"empty plain table is an object", `return {}`, `{}`},
		{"luaop.array()", `return luaop.array()`, `[]`},
		{"luaop.object()", `return luaop.object()`, `{}`},
		{"luaop.array(t)", `return luaop.array({1, 2})`, `[1,2]`},
		{"list", `return {1, "a", true}`, `[1,"a",true]`},
		{"object", `return {a = 1, b = {c = "d"}}`, `{"a":1,"b":{"c":"d"}}`},
		{"emptied list stays a list", `local l = luaop.array({1}); l[1] = nil; return {l = l}`, `{"l":[]}`},
		{"emptied object stays an object", `local o = {a = 1}; o.a = nil; return o`, `{}`},
		{"converted empty list stays a list", `local v = ...; return v.items`, `[]`},
		{"converted empty object stays an object", `local v = ...; return v.labels`, `{}`},
		{"list from Go grows", `local v = ...; table.insert(v.list, 3); return v.list`, `[1,2,3]`},
		{"null in object", `return {x = luaop.null}`, `{"x":null}`},
		{"null in list", `return {1, luaop.null, 3}`, `[1,null,3]`},
		{"top nil", `return nil`, `null`},
		{"string keys that look like numbers", `return {["1"] = "a", ["2"] = "b"}`, `{"1":"a","2":"b"}`},
		{"proxy inside a table", `local v = ...; return {copy = v}`, `{"copy":{"items":[],"labels":{},"list":[1,2]}}`},
	}
	L := newTestState(t)
	arg := map[string]any{"items": []any{}, "labels": map[string]any{}, "list": []any{int64(1), int64(2)}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var in lua.LValue = ToLua(L, arg)
			if strings.Contains(tc.name, "proxy") {
				in = NewProxy(L, arg)
			}
			got, err := FromLua(luatest.MustCall(t, L, tc.lua, in))
			if err != nil {
				t.Fatal(err)
			}
			data, _ := json.Marshal(got)
			if string(data) != tc.want {
				t.Fatalf("got %s, want %s", data, tc.want)
			}
		})
	}
}

func TestFromLuaErrors(t *testing.T) {
	cases := []struct {
		name string
		lua  string
		want string
	}{
		{"function in list", `return {spec = {items = {1, 2, function() end}}}`, `spec.items[3]: cannot convert a function to JSON`},
		{"quoted key", `return {metadata = {annotations = {["example.com/x"] = print}}}`, `metadata.annotations["example.com/x"]: cannot convert a function to JSON`},
		{"mixed keys", `return {spec = {1, 2, x = 3}}`, `spec: table mixes list indices and string keys (index 1 and key "x")`},
		{"sparse", `return {spec = {items = {[1] = 1, [3] = 3}}}`, `spec.items: table is a sparse list: hole at index 2`},
		{"boolean key", `return {s = {[true] = 1}}`, `s: table has a key (boolean) that is neither a string nor a list index 1..n`},
		{"fractional key", `return {s = {[1.5] = 1}}`, `s: table has a key 1.5`},
		{"zero key", `return {s = {[0] = 1}}`, `s: table has a key 0`},
		{"cycle", `local t = {a = {}}; t.a.b = t; return t`, `cycle at a.b: it refers back to the whole value`},
		{"depth", `local t = {}; local c = t; for i = 1, 150 do c.x = {}; c = c.x end; return t`, `nested deeper than 100 levels`},
		{"userdata", `return {u = newproxy()}`, `u: cannot convert a userdata to JSON`},
		{"NaN", `return {x = 0/0}`, `x: number NaN cannot be represented in JSON`},
		{"Inf", `return {list = {1, 1/0}}`, `list[2]: number +Inf cannot be represented in JSON`},
		{"array with string key", `local a = luaop.array({1, 2}); a.x = 1; return {a = a}`, `a: list has a string key "x"`},
		{"array with hole", `local a = luaop.array({1, 2, 3}); a[2] = nil; return {a = a}`, `a: list has a hole at index 2`},
		{"object with number key", `return {o = luaop.object({1})}`, `o: object has a non-string key 1`},
		{"top level", `return print`, `value: cannot convert a function to JSON`},
		{"error userdata", `return {e = userdata()}`, `e: cannot convert a userdata to JSON`},
		{"deterministic first error", `return {b = print, a = print, c = print}`, `a: cannot convert a function to JSON`},
	}
	L := newTestState(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := FromLua(luatest.MustCall(t, L, tc.lua))
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
		})
	}
	t.Run("coroutine", func(t *testing.T) {
		th, _ := L.NewThread()
		tb := L.NewTable()
		tb.RawSetString("co", th)
		_, err := FromLua(tb)
		if err == nil || err.Error() != "co: cannot convert a coroutine to JSON" {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("depth 100 is fine", func(t *testing.T) {
		_, err := FromLua(luatest.MustCall(t, L, `local t = {}; local c = t; for i = 1, 99 do c.x = {}; c = c.x end; return t`))
		if err != nil {
			t.Fatal(err)
		}
	})
	t.Run("shared table is not a cycle", func(t *testing.T) {
		got, err := FromLua(luatest.MustCall(t, L, `local s = {1}; return {a = s, b = s}`))
		if err != nil {
			t.Fatal(err)
		}
		data, _ := json.Marshal(got)
		if string(data) != `{"a":[1],"b":[1]}` {
			t.Fatal(string(data))
		}
	})
}

func TestMarkers(t *testing.T) {
	cases := []struct {
		name string
		lua  string
		want string
	}{
		{"tostring(null)", `return tostring(luaop.null)`, "null"},
		{"is_null(null)", `return tostring(luaop.is_null(luaop.null))`, "true"},
		{"is_null(nil)", `return tostring(luaop.is_null(nil))`, "false"},
		{"is_null(false)", `return tostring(luaop.is_null(false))`, "false"},
		{"null from Go", `local v = ...; return tostring(v.x == luaop.null)`, "true"},
		{"null is truthy", `local v = ...; if v.x then return "truthy" end return "falsy"`, "truthy"},
		{"type(null)", `return type(luaop.null)`, "userdata"},
		{"index null", `local ok, e = pcall(function() return luaop.null.x end); return e`, "handler.lua:1: attempt to index luaop.null (JSON null) with key 'x'"},
		{"array returns its argument", `local t = {}; return tostring(luaop.array(t) == t)`, "true"},
		{"array of a non-table", `local ok, e = pcall(luaop.array, 3); return e`, "handler.lua:1: bad argument #1 to (anonymous) (table or nil expected, got number)"},
	}
	L := newTestState(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := luatest.MustCall(t, L, tc.lua, ToLua(L, map[string]any{"x": nil}))
			if !strings.HasSuffix(got.String(), tc.want) {
				t.Fatalf("got %q, want %q", got.String(), tc.want)
			}
		})
	}
}

func TestStatePerLState(t *testing.T) {
	L1, L2 := newTestState(t), newTestState(t)
	if stateOf(L1) == stateOf(L2) || stateOf(L1).null == stateOf(L2).null {
		t.Fatal("states share their state")
	}
	if first, again := stateOf(L1), stateOf(L1); first != again {
		t.Fatal("stateOf is not stable")
	}
	// Coroutines share their parent's registry, hence its null.
	th, _ := L1.NewThread()
	if stateOf(th) != stateOf(L1) {
		t.Fatal("a coroutine has its own state")
	}
	// A null from another state still converts (FromLua needs no state).
	v, err := FromLua(stateOf(L2).null)
	if err != nil || v != nil {
		t.Fatalf("got %v, %v", v, err)
	}
}

func BenchmarkToLuaDeployment(b *testing.B) {
	L := newTestState(b)
	obj := luatest.LoadFile(b, "deployment.json")
	b.ReportAllocs()
	for b.Loop() {
		ToLua(L, obj)
	}
}

func BenchmarkFromLua(b *testing.B) {
	L := newTestState(b)
	lv := ToLua(L, luatest.LoadFile(b, "deployment.json"))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := FromLua(lv); err != nil {
			b.Fatal(err)
		}
	}
}
