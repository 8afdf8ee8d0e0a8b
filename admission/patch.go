package admission

import (
	"encoding/json"
	"fmt"

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
// ctx.patch) into the JSON patch the API server takes: state.MergePatchOps's
// operations on the original object, less those that change nothing (objects
// merged key by key, lists and scalars replaced whole, numbers compared by value).
func jsonPatch(original []byte, merge map[string]any) ([]patchOp, error) {
	decoded, err := decodeJSON(original)
	if err != nil {
		return nil, err
	}
	object, ok := decoded.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("the admitted object is not a JSON object")
	}
	var ops []patchOp
	for _, op := range state.MergePatchOps(object, merge) {
		switch {
		case op.Remove:
			ops = append(ops, patchOp{Op: "remove", Path: op.Path})
		case op.Unchanged:
		case op.Existed:
			ops = append(ops, patchOp{Op: "replace", Path: op.Path, Value: op.Value})
		default:
			ops = append(ops, patchOp{Op: "add", Path: op.Path, Value: op.Value})
		}
	}
	return ops, nil
}
