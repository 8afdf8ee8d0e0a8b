package admission

import (
	"encoding/json"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
)

// The JSON patch a mutate handler's ctx.patch becomes does to the object exactly
// what the merge patch would (RFC 7386, as the library implements it), and holds no
// operation that changes nothing.
func TestJSONPatchDoesWhatTheMergePatchDoes(t *testing.T) {
	original := `{"metadata":{"name":"w","labels":{"keep":"k","a/b":"1"}},"spec":{"n":3,"list":[1,2],"deep":{"x":"1"}},"scalar":"s"}`
	for _, tc := range []struct {
		name    string
		merge   map[string]any
		wantOps int
	}{
		{"nothing", map[string]any{}, 0},
		{"unchanged values, numbers by value", map[string]any{"spec": map[string]any{"n": float64(3), "list": []any{int64(1), int64(2)}}}, 0},
		{"nested add and replace", map[string]any{"spec": map[string]any{"deep": map[string]any{"x": "2", "y": "3"}}}, 2},
		{"null removes, escaped key", map[string]any{"metadata": map[string]any{"labels": map[string]any{"a/b": nil, "absent": nil}}}, 1},
		{"map over a scalar, its nulls dropped", map[string]any{"scalar": map[string]any{"a": "1", "b": nil}}, 1},
		{"list replaced whole", map[string]any{"spec": map[string]any{"list": []any{"x"}}}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ops, err := jsonPatch([]byte(original), tc.merge)
			if err != nil {
				t.Fatal(err)
			}
			if len(ops) != tc.wantOps {
				t.Errorf("%d operations %+v, want %d", len(ops), ops, tc.wantOps)
			}
			rawOps, _ := json.Marshal(ops)
			if len(ops) == 0 {
				rawOps = []byte("[]")
			}
			decoded, err := jsonpatch.DecodePatch(rawOps)
			if err != nil {
				t.Fatal(err)
			}
			viaJSONPatch, err := decoded.Apply([]byte(original))
			if err != nil {
				t.Fatalf("applying %s: %v", rawOps, err)
			}
			rawMerge, _ := json.Marshal(tc.merge)
			viaMergePatch, err := jsonpatch.MergePatch([]byte(original), rawMerge)
			if err != nil {
				t.Fatal(err)
			}
			if !jsonpatch.Equal(viaJSONPatch, viaMergePatch) {
				t.Errorf("the JSON patch %s gives\n%s\nthe merge patch gives\n%s", rawOps, viaJSONPatch, viaMergePatch)
			}
		})
	}
}
