package state

import "sort"

// JSONPatchOp is one RFC 6902 operation that does a part of a merge patch (RFC 7386)
// on an object the caller holds. Path is a JSON pointer with its tokens escaped.
type JSONPatchOp struct {
	Path string
	// Remove: the merge patch's null deletes a member the object has.
	Remove bool
	// Value is what an add sets (nulls inside its maps dropped, as a merge patch
	// never stores them).
	Value any
	// Existed: the object already has the member, so the add replaces it.
	Existed bool
	// Unchanged: the object already holds Value (numbers compared by value).
	Unchanged bool
}

// MergePatchOps spells a merge patch as JSON patch operations on current: maps the
// object already has are descended into (a merge, not a replacement), lists and
// scalars are set whole, and a null removes a member the object has (one it lacks,
// or holds as null, is skipped). Keys come in sorted order, so equal inputs give
// equal operations. The callers choose what to send of them: processing tests that
// an absent member is still absent before it adds it; admission leaves out what is
// unchanged.
func MergePatchOps(current, patch map[string]any) []JSONPatchOp {
	return appendMergePatchOps(nil, current, patch, "")
}

func appendMergePatchOps(ops []JSONPatchOp, current, patch map[string]any, prefix string) []JSONPatchOp {
	keys := make([]string, 0, len(patch))
	for k := range patch {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := patch[k]
		path := prefix + "/" + EscapePointerToken(k)
		existing := current[k]
		existed := !isNull(existing)
		patchMap, patchIsMap := v.(map[string]any)
		existingMap, existingIsMap := existing.(map[string]any)
		switch {
		case isNull(v):
			if existed {
				ops = append(ops, JSONPatchOp{Path: path, Remove: true})
			}
		case patchIsMap && existingIsMap && existed:
			ops = appendMergePatchOps(ops, existingMap, patchMap, path)
		default:
			value := withoutNullMembers(v)
			ops = append(ops, JSONPatchOp{Path: path, Value: value, Existed: existed,
				Unchanged: existed && ValuesEqual(existing, value)})
		}
	}
	return ops
}

// withoutNullMembers drops null members of maps, at every depth of maps.
func withoutNullMembers(v any) any {
	m, ok := v.(map[string]any)
	if !ok {
		return v
	}
	out := make(map[string]any, len(m))
	for k, x := range m {
		if !isNull(x) {
			out[k] = withoutNullMembers(x)
		}
	}
	return out
}
