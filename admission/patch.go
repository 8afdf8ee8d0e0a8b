package admission

import (
	"encoding/json"
	"reflect"
	"slices"
	"sort"
	"strings"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
)

// patchOp is one RFC 6902 operation.
type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// MarshalJSON writes value for add and replace even when it is null.
func (p patchOp) MarshalJSON() ([]byte, error) {
	if p.Op == "remove" {
		return json.Marshal(struct {
			Op   string `json:"op"`
			Path string `json:"path"`
		}{p.Op, p.Path})
	}
	return json.Marshal(struct {
		Op    string `json:"op"`
		Path  string `json:"path"`
		Value any    `json:"value"`
	}{p.Op, p.Path, p.Value})
}

// jsonPatch turns a merge patch of the object (what a mutate handler wrote into
// ctx.patch) into the JSON patch the API server takes: the merge patch is applied
// to the original object, and the operations are the difference between the two
// (objects compared key by key, lists and scalars replaced whole).
func jsonPatch(original []byte, merge map[string]any) ([]patchOp, error) {
	mp, err := json.Marshal(merge)
	if err != nil {
		return nil, err
	}
	merged, err := jsonpatch.MergePatch(original, mp)
	if err != nil {
		return nil, err
	}
	a, err := decodeJSON(original)
	if err != nil {
		return nil, err
	}
	b, err := decodeJSON(merged)
	if err != nil {
		return nil, err
	}
	var ops []patchOp
	diffJSON("", a, b, &ops)
	return ops, nil
}

func diffJSON(path string, a, b any, ops *[]patchOp) {
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if !aok || !bok {
		if !reflect.DeepEqual(a, b) {
			*ops = append(*ops, patchOp{Op: "replace", Path: path, Value: b})
		}
		return
	}
	keys := make([]string, 0, len(am)+len(bm))
	for k := range am {
		keys = append(keys, k)
	}
	for k := range bm {
		if _, ok := am[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	keys = slices.Compact(keys)
	for _, k := range keys {
		p := path + "/" + escapePointer(k)
		av, inA := am[k]
		bv, inB := bm[k]
		switch {
		case inA && !inB:
			*ops = append(*ops, patchOp{Op: "remove", Path: p})
		case !inA && inB:
			*ops = append(*ops, patchOp{Op: "add", Path: p, Value: bv})
		default:
			diffJSON(p, av, bv, ops)
		}
	}
}

// escapePointer escapes a key for a JSON pointer (RFC 6901).
func escapePointer(k string) string {
	return strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1")
}
