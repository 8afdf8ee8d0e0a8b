package admission

import (
	"encoding/json"
	"strings"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"

	"github.com/luaop/luaop/state"
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
	// The operations are state.Compare's items, the diff every handler sees: objects
	// key by key, lists and scalars whole, numbers by value.
	var ops []patchOp
	for _, item := range state.Compare(a, b) {
		var pointer strings.Builder
		for _, k := range item.Path {
			pointer.WriteString("/" + state.EscapePointerToken(k))
		}
		switch item.Op {
		case state.DiffAdd:
			ops = append(ops, patchOp{Op: "add", Path: pointer.String(), Value: item.New})
		case state.DiffChange:
			ops = append(ops, patchOp{Op: "replace", Path: pointer.String(), Value: item.New})
		case state.DiffRemove:
			ops = append(ops, patchOp{Op: "remove", Path: pointer.String()})
		}
	}
	return ops, nil
}
