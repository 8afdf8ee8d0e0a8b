package processing

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/luaop/luaop/state"
)

// BenchmarkDetectChangeCause: cause detection of a realistic ~5 KB object whose
// diff-base is stored (essence, decoding the stored one, comparing): once per cycle.
func BenchmarkDetectChangeCause(b *testing.B) {
	raw, err := os.ReadFile("../luabind/internal/luatest/testdata/deployment.json")
	if err != nil {
		b.Fatal(err)
	}
	var body map[string]any
	if err := json.Unmarshal(raw, &body); err != nil {
		b.Fatal(err)
	}
	p := state.NewPatch()
	if err := state.StoreEssence(body, p, "luaop.dev", state.Essence(body, "luaop.dev")); err != nil {
		b.Fatal(err)
	}
	handled := mergePatched(body, p.Map())
	changed := mergePatched(handled, map[string]any{"spec": map[string]any{"replicas": 7}})
	for _, bc := range []struct {
		name string
		body map[string]any
	}{{"noop", handled}, {"update", changed}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				detectWithAnnotations(bc.body, "luaop.dev", "luaop.dev/finalizer", objectFacts{})
			}
		})
	}
}
