package luavalue

import (
	"encoding/json"
	"sort"
	"strings"
	"testing"

	lua "github.com/luaop/luaop/third_party/gopher-lua"

	"github.com/luaop/luaop/luabind/internal/luatest"
)

func proxyDataFor(t *testing.T, lv lua.LValue) *proxyData {
	t.Helper()
	tb, ok := lv.(*lua.LTable)
	if !ok {
		t.Fatalf("not a table: %v", lv.Type())
	}
	pd := proxyDataOf(tb)
	if pd == nil {
		t.Fatal("not a proxy")
	}
	return pd
}

func cacheKeys(pd *proxyData) []string {
	var keys []string
	for k := range pd.cache {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func TestProxyLazy(t *testing.T) {
	L := newTestState(t)
	obj := luatest.LoadFile(t, "deployment.json")
	p := NewProxy(L, obj)
	root := proxyDataFor(t, p)
	if len(root.cache) != 0 {
		t.Fatal("conversion before access")
	}
	got := luatest.MustCall(t, L, `local o = ...; return o.metadata.name .. "/" .. o.spec.replicas`, p)
	if got.String() != "web-frontend/3" {
		t.Fatalf("got %q", got)
	}
	if k := strings.Join(cacheKeys(root), ","); k != "metadata,spec" {
		t.Fatalf("root converted %q, want metadata,spec", k)
	}
	spec := proxyDataFor(t, root.cache["spec"])
	if k := strings.Join(cacheKeys(spec), ","); k != "replicas" {
		t.Fatalf("spec converted %q, want replicas", k)
	}
	meta := proxyDataFor(t, root.cache["metadata"])
	if k := strings.Join(cacheKeys(meta), ","); k != "name" {
		t.Fatalf("metadata converted %q, want name", k)
	}

	// A second access returns the cached child (same table).
	same := luatest.MustCall(t, L, `local o = ...; return tostring(rawequal(o.spec, o.spec))`, p)
	if same.String() != "true" {
		t.Fatal("children are not cached")
	}

	// Lists convert element by element.
	luatest.MustCall(t, L, `local o = ...; return o.spec.template.spec.containers[2].name`, p)
	containers := proxyDataFor(t, proxyDataFor(t, proxyDataFor(t, spec.cache["template"]).cache["spec"]).cache["containers"])
	if containers.lcache[0] != nil || containers.lcache[1] == nil {
		t.Fatalf("list cache: %v", containers.lcache)
	}
}

func TestProxyAccess(t *testing.T) {
	cases := []struct {
		name string
		lua  string
		want string
	}{
		{"scalar", `return o.spec.replicas`, "3"},
		{"missing field", `return tostring(o.spec.nope)`, "nil"},
		{"missing nested guarded", `return tostring(o.spec.nope and o.spec.nope.x)`, "nil"},
		{"list index", `return o.spec.template.spec.containers[1].name`, "web"},
		{"list index out of range", `return tostring(o.spec.template.spec.containers[3])`, "nil"},
		{"list string key", `return tostring(o.spec.template.spec.containers.name)`, "nil"},
		{"object number key", `return tostring(o.spec[1])`, "nil"},
		{"quoted key", `return o.metadata.labels["app.kubernetes.io/name"]`, "web-frontend"},
		{"null", `return tostring(o.spec.template.metadata.creationTimestamp == luaop.null)`, "true"},
		{"type", `return type(o.spec)`, "table"},
		{"len list", `return #o.spec.template.spec.containers`, "2"},
		{"len empty list", `return #o.spec.template.spec.tolerations`, "0"},
		{"len object", `return #o.spec`, "0"},
		{"unicode", `return o.metadata.annotations["example.com/description"]`, "Storefront UI — serves the catalogue pages (日本語, émojis 🚀)"},
		{"pairs sorted", `local ks = {}; for k, v in pairs(o.metadata.labels) do ks[#ks+1] = k .. "=" .. v end; return table.concat(ks, ",")`,
			"app.kubernetes.io/name=web-frontend,app.kubernetes.io/part-of=shop,app.kubernetes.io/version=2.14.1,tier=frontend"},
		{"pairs list", `local s = ""; for i, c in pairs(o.spec.template.spec.containers) do s = s .. i .. c.name end; return s`, "1web2log-shipper"},
		{"ipairs list", `local s = ""; for i, c in ipairs(o.spec.template.spec.containers) do s = s .. i .. c.name end; return s`, "1web2log-shipper"},
		{"ipairs object", `local n = 0; for i in ipairs(o.spec) do n = n + 1 end; return n`, "0"},
		{"pairs sees nulls", `local n = 0; for k, v in pairs(o.spec.template.metadata) do n = n + 1 end; return n`, "3"},
		{"pairs empty", `local n = 0; for k in pairs(o.spec.template.spec.tolerations) do n = n + 1 end; return n`, "0"},
		{"next sees nothing", `return tostring(next(o.spec))`, "nil"},
		{"getmetatable protected", `return tostring(getmetatable(o))`, "false"},
		{"setmetatable refused", `local ok, e = pcall(setmetatable, o, nil); return e`, "handler.lua:1: cannot change a protected metatable"},
		{"tostring JSON", `return tostring(o.spec.selector)`, `{"matchLabels":{"app.kubernetes.io/name":"web-frontend"}}`},
		{"array(proxy) copies", `local c = luaop.array(o.spec.template.spec.containers); c[3] = "x"; return #c .. type(c[1].name)`, "3string"},
		{"object(list proxy) refused", `local ok, e = pcall(luaop.object, o.spec.template.spec.containers); return tostring(ok)`, "false"},
	}
	L := newTestState(t)
	obj := luatest.LoadFile(t, "deployment.json")
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := luatest.MustCall(t, L, "local o = ...; "+tc.lua, NewProxy(L, obj))
			if got.String() != tc.want {
				t.Fatalf("got %q, want %q", got.String(), tc.want)
			}
		})
	}
}

func TestProxyReadOnly(t *testing.T) {
	cases := []struct {
		name string
		root string
		lua  string
		want string
	}{
		{"field", "", `o.spec.replicas = 5`, "handler.lua:1: spec.replicas is read-only: write to ctx.patch instead"},
		{"new field", "", `o.spec.paused = true`, "spec.paused is read-only"},
		{"top field", "", `o.kind = "x"`, "handler.lua:1: kind is read-only"},
		{"named root", "body", `o.spec.replicas = 5`, "body.spec.replicas is read-only: write to ctx.patch instead"},
		{"list element", "body", `o.spec.template.spec.containers[1] = {}`, "body.spec.template.spec.containers[1] is read-only"},
		{"in list element", "body", `o.spec.template.spec.containers[2].image = "x"`, `body.spec.template.spec.containers[2].image is read-only`},
		{"quoted key", "body", `o.metadata.labels["app.kubernetes.io/name"] = "x"`, `body.metadata.labels["app.kubernetes.io/name"] is read-only`},
		{"table.insert bypasses nothing visible", "", `table.insert(o.spec.template.spec.containers, 1); return`, ""},
	}
	obj := luatest.LoadFile(t, "deployment.json")
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			L := newTestState(t)
			_, err := luatest.Call(t, L, "local o = ...; "+tc.lua, NewProxyNamed(L, obj, tc.root))
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("write succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
		})
	}
	// The Go value never changes.
	spec := obj.(map[string]any)["spec"].(map[string]any)
	if spec["replicas"] != int64(3) || len(spec["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)) != 2 {
		t.Fatal("the Go value changed")
	}
}

func TestProxyFromLua(t *testing.T) {
	L := newTestState(t)
	obj := luatest.LoadFile(t, "deployment.json")
	p := NewProxy(L, obj)
	got, err := FromLua(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := luatest.SameJSON(obj, got, "$"); err != nil {
		t.Fatal(err)
	}
	// A copy: changing it leaves the original alone.
	got.(map[string]any)["spec"].(map[string]any)["replicas"] = int64(9)
	if obj.(map[string]any)["spec"].(map[string]any)["replicas"] != int64(3) {
		t.Fatal("FromLua(proxy) shares the Go value")
	}
	// Partly read proxies and proxies nested in returned tables.
	lv := luatest.MustCall(t, L, `local o = ...; local _ = o.spec.replicas; return {sel = o.spec.selector, c = o.spec.template.spec.containers[1].ports, n = o.metadata.name}`, p)
	got, err = FromLua(lv)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(got)
	want := `{"c":[{"containerPort":8080,"name":"http","protocol":"TCP"},{"containerPort":9102,"name":"metrics","protocol":"TCP"}],"n":"web-frontend","sel":{"matchLabels":{"app.kubernetes.io/name":"web-frontend"}}}`
	if string(data) != want {
		t.Fatalf("got %s", data)
	}
	if v, ok := ProxyValue(p); !ok || v == nil {
		t.Fatal("proxyValue")
	}
	if _, ok := ProxyValue(L.NewTable()); ok {
		t.Fatal("proxyValue of a plain table")
	}
}

func TestProxyScalarsAndNil(t *testing.T) {
	L := newTestState(t)
	for _, v := range []any{"s", int64(3), 2.5, true, nil, map[string]any(nil), []any(nil)} {
		lv := NewProxy(L, v)
		if tb, ok := lv.(*lua.LTable); ok && proxyDataOf(tb) != nil {
			t.Fatalf("%#v became a proxy", v)
		}
		got, err := FromLua(lv)
		if err != nil {
			t.Fatal(err)
		}
		want := v
		switch v.(type) {
		case map[string]any, []any:
			want = nil
		}
		if got != want {
			t.Fatalf("%#v -> %#v", v, got)
		}
	}
	// Empty containers are proxies that convert back to their shape.
	for _, c := range []struct {
		v    any
		want string
	}{{map[string]any{}, "{}"}, {[]any{}, "[]"}} {
		got, err := FromLua(NewProxy(L, c.v))
		if err != nil {
			t.Fatal(err)
		}
		data, _ := json.Marshal(got)
		if string(data) != c.want {
			t.Fatalf("got %s want %s", data, c.want)
		}
	}
}

func TestInstallIterationIdempotent(t *testing.T) {
	L := newTestState(t)
	before := L.GetGlobal("pairs")
	InstallIteration(L)
	if L.GetGlobal("pairs") != before {
		t.Fatal("installIteration replaced pairs twice")
	}
	// Works without the base library too.
	bare := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer bare.Close()
	InstallIteration(bare)
	p := NewProxy(bare, map[string]any{"b": int64(2), "a": int64(1)})
	fn := luatest.Compile(t, bare, "x.lua", `local s = ""; for k, v in pairs(...) do s = s .. k .. v end; return s`)
	bare.Push(fn)
	bare.Push(p)
	if err := bare.PCall(1, 1, nil); err != nil {
		t.Fatal(err)
	}
	if got := bare.Get(-1).String(); got != "a1b2" {
		t.Fatalf("got %q", got)
	}
}

// BenchmarkProxyReadTwoFields: a handler call that gets a 5 KB object as a proxy and
// reads spec.replicas and metadata.name.
func BenchmarkProxyReadTwoFields(b *testing.B) {
	L := newTestState(b)
	obj := luatest.LoadFile(b, "deployment.json")
	fn := luatest.Compile(b, L, "handler.lua", `return function(o) return o.spec.replicas, o.metadata.name end`)
	L.Push(fn)
	L.Call(0, 1)
	handler := L.Get(-1).(*lua.LFunction)
	L.Pop(1)
	b.Run("lua", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			L.Push(handler)
			L.Push(NewProxy(L, obj))
			L.Call(1, 2)
			L.Pop(2)
		}
	})
	b.Run("go", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			p := NewProxy(L, obj)
			L.GetField(L.GetField(p, "spec"), "replicas")
			L.GetField(L.GetField(p, "metadata"), "name")
		}
	})
	b.Run("eager", func(b *testing.B) { // for comparison: toLua of the whole object
		b.ReportAllocs()
		for b.Loop() {
			L.Push(handler)
			L.Push(ToLua(L, obj))
			L.Call(1, 2)
			L.Pop(2)
		}
	})
}
