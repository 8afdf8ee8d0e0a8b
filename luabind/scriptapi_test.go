package luabind

import (
	"slices"
	"sort"
	"strings"
	"testing"

	lua "github.com/luaop/luaop/third_party/gopher-lua"

	"github.com/luaop/luaop/scriptapi"
)

// moduleFunctions walks the luaop module of a real shard and returns the path of
// every function in it ("kube.get").
func moduleFunctions(t *testing.T) []string {
	t.Helper()
	r := New(Options{Shards: 1})
	defer r.Close()
	var out []string
	var walk func(tbl *lua.LTable, prefix string)
	walk = func(tbl *lua.LTable, prefix string) {
		tbl.ForEach(func(k, v lua.LValue) {
			name := prefix + k.String()
			switch v := v.(type) {
			case *lua.LFunction:
				out = append(out, name)
			case *lua.LTable:
				walk(v, name+".")
			}
		})
	}
	walk(r.shards[0].Load().module, "")
	sort.Strings(out)
	return out
}

// The runtime installs exactly the functions of scriptapi's table, which luaop check,
// luaop rbac and the stubs read: a function added to the module and not to the table
// (luaop.kube.patch_status, say) fails here, before luaop rbac forgets its verb.
func TestRuntimeInstallsTheTableOfFunctions(t *testing.T) {
	installed := moduleFunctions(t)
	if len(installed) < 40 {
		t.Fatalf("found only %d functions in the module: the walk is broken", len(installed))
	}
	for _, name := range installed {
		if _, ok := scriptapi.Lookup(name); !ok {
			t.Errorf("the runtime installs luaop.%s, which scriptapi.Functions does not list: add it there (with its parameters, what it registers, its cluster access)", name)
		}
	}
	for _, f := range scriptapi.Functions {
		if !slices.Contains(installed, f.Name) {
			t.Errorf("scriptapi.Functions lists luaop.%s, which the runtime does not install", f.Name)
		}
	}
}

// The stubs declare exactly the functions of the table, with the table's parameters.
func TestStubsDeclareTheTableOfFunctions(t *testing.T) {
	d := parseStubs(t, Stubs())
	for _, f := range scriptapi.Functions {
		doc, ok := d.funcs["luaop."+f.Name]
		if !ok {
			t.Errorf("the stubs do not declare luaop.%s: add `function luaop.%s(%s) end` with its doc to luaop_meta.lua", f.Name, f.Name, strings.Join(f.Params, ", "))
			continue
		}
		if !slices.Equal(doc.params, f.Params) {
			t.Errorf("luaop.%s: the stubs declare (%s), scriptapi.Functions (%s)", f.Name, strings.Join(doc.params, ", "), strings.Join(f.Params, ", "))
		}
	}
	for name := range d.funcs {
		if _, ok := scriptapi.Lookup(strings.TrimPrefix(name, "luaop.")); !ok {
			t.Errorf("the stubs declare %s, which scriptapi.Functions does not list", name)
		}
	}
}

// A function whose implementation is not in the table, or a table entry without an
// implementation, stops the state from being made (installFunctions).
func TestInstallFunctionsRefusesADisagreement(t *testing.T) {
	r := New(Options{Shards: 1})
	defer r.Close()
	s := r.shards[0].Load()
	for name, impls := range map[string]map[string]goFunction{
		"an implementation the table lacks": {"kube.patch_status": (*shard).kubeGet},
		"a table entry without one":         {"kube.get": (*shard).kubeGet},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: installed without a complaint", name)
				}
			}()
			s.installFunctions(s.L.NewTable(), "kube", impls)
		}()
	}
}
