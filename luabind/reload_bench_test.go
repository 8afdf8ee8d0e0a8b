package luabind

import (
	"fmt"
	"testing"
)

// reloadScripts is a script set of n small top-level files, one handler each;
// version changes the first file only.
func reloadScripts(n, version int) []Script {
	scripts := make([]Script, n)
	for i := range scripts {
		v := 0
		if i == 0 {
			v = version
		}
		scripts[i] = Script{Name: fmt.Sprintf("s%04d.lua", i), Source: []byte(fmt.Sprintf(`local luaop = require("luaop")
-- file %d
local function helper(ctx)
  return ctx.name
end
luaop.on.create("example.com/v1/things%d", function(ctx) return helper(ctx), %d end, { id = "h%d_v%d" })
`, i, i, v, i, v))}
	}
	return scripts
}

// BenchmarkLoadOneChanged: Runtime.Load of n files of which one changed since the
// previous load (what a save in the scripts folder costs, without watch and debounce).
func BenchmarkLoadOneChanged(b *testing.B) {
	for _, n := range []int{1, 50, 500, 2000} {
		b.Run(fmt.Sprintf("files=%d", n), func(b *testing.B) {
			rt := New(Options{})
			defer rt.Close()
			ctx := b.Context()
			if _, err := rt.Load(ctx, reloadScripts(n, 0)); err != nil {
				b.Fatal(err)
			}
			v := 0
			for b.Loop() {
				v++
				if _, err := rt.Load(ctx, reloadScripts(n, v)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
