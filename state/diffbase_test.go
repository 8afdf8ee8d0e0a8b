package state

import (
	"reflect"
	"testing"
)

func TestDiffBaseStoragesRoundTrip(t *testing.T) {
	obj := map[string]any{
		"metadata": map[string]any{"name": "x", "labels": map[string]any{"a": "b"}},
		"spec":     map[string]any{"size": int64(3), "list": []any{"x"}},
	}
	essence := Essence(obj, "luaop.dev")
	tests := []struct {
		name    string
		storage DiffBaseStorage
		inside  []string
	}{
		{"annotations", NewAnnotationsDiffBase("luaop.dev"), []string{"metadata", "annotations", "luaop.dev/last-handled-configuration"}},
		{"status", NewStatusDiffBase("luaop"), []string{"status", "luaop", "last-handled-configuration"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, found, err := tt.storage.Fetch(obj); found || err != nil {
				t.Fatalf("a new object has no diff-base: found=%v err=%v", found, err)
			}
			p := NewPatch()
			if err := tt.storage.Store(obj, p, essence); err != nil {
				t.Fatal(err)
			}
			if _, ok := p.Get(tt.inside); !ok {
				t.Fatalf("patch %v does not write %v", p.Map(), tt.inside)
			}
			after := applyMergePatch(obj, p.Map())
			got, found, err := tt.storage.Fetch(after)
			if err != nil || !found || !reflect.DeepEqual(got, essence) {
				t.Fatalf("round trip: %v %v %v, want %v", got, found, err, essence)
			}
			// Storing the diff-base is never an essential change itself.
			if d := Compare(essence, Essence(after, "luaop.dev")); len(d) != 0 {
				t.Errorf("the stored diff-base changed the essence: %v", d)
			}
		})
	}
	if _, found, err := NewStatusDiffBase("luaop").Fetch(map[string]any{"status": map[string]any{"luaop": map[string]any{"last-handled-configuration": "{bad"}}}); !found || err == nil {
		t.Errorf("a corrupt status diff-base must be reported")
	}
}
