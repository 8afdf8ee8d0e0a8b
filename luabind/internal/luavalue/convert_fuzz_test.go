package luavalue

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	lua "github.com/luaop/luaop/third_party/gopher-lua"
	kjson "k8s.io/apimachinery/pkg/util/json"

	"github.com/luaop/luaop/luabind/internal/luatest"
)

// FuzzRoundTrip feeds JSON documents through toLua -> fromLua and newProxy -> fromLua:
// what comes back must equal what went in (numbers by value; integral values within
// ±2^53 as int64). Run with: go test -run '^$' -fuzz FuzzRoundTrip ./luabind/
func FuzzRoundTrip(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join(luatest.TestdataDir(), "*.json"))
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{
		`{}`, `[]`, `null`, `0`, `-0`, `3`, `2.5`, `1e300`, `-1e-300`, `9007199254740993`,
		`9223372036854775807`, `-9223372036854775808`, `18446744073709551616`,
		`"ü\u0000\ud83d\ude80"`, `[[],[[]],{},{"":{}}]`, `{"a":null,"b":[null]}`,
		`{"1":1,"2":2}`, `[1,"1",true,null,{"x":[]}]`,
	} {
		f.Add([]byte(s))
	}
	L := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer L.Close()
	f.Fuzz(func(t *testing.T, data []byte) {
		var orig any
		if err := kjson.Unmarshal(data, &orig); err != nil {
			return
		}
		deep := depthOf(orig) > maxDepth
		for _, way := range []struct {
			name string
			lv   lua.LValue
		}{{"toLua", ToLua(L, orig)}, {"newProxy", NewProxy(L, orig)}} {
			got, err := FromLua(way.lv)
			if deep {
				if err == nil {
					t.Fatalf("%s: no error for a value deeper than %d", way.name, maxDepth)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s: %v", way.name, err)
			}
			if _, isProxy := ProxyValue(way.lv); isProxy {
				// A proxy gives back a copy of the very Go value.
				if !reflect.DeepEqual(orig, got) {
					t.Fatalf("%s: got %#v\ninput: %s", way.name, got, data)
				}
				continue
			}
			if err := luatest.SameJSON(orig, got, "$"); err != nil {
				t.Fatalf("%s: %v\ninput: %s", way.name, err, data)
			}
		}
	})
}

// depthOf is the nesting depth of containers (a scalar is 0, {} is 1).
func depthOf(v any) int {
	d := 0
	switch x := v.(type) {
	case map[string]any:
		for _, e := range x {
			d = max(d, depthOf(e))
		}
		return d + 1
	case []any:
		for _, e := range x {
			d = max(d, depthOf(e))
		}
		return d + 1
	}
	return 0
}
