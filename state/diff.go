package state

import (
	"fmt"
	"slices"
	"strings"
)

// DiffOp is the kind of one change in a Diff.
type DiffOp string

// The operations of a diff, named as kopf names them.
const (
	DiffAdd    DiffOp = "add"
	DiffChange DiffOp = "change"
	DiffRemove DiffOp = "remove"
)

// DiffItem is one change: the field at Path went from Old to New (nil when absent).
type DiffItem struct {
	Op   DiffOp
	Path []string
	Old  any
	New  any
}

// Diff is a list of changes as kopf computes them: maps are recursed into, while lists and
// scalars are compared as atoms, so a list with one element changed is a single "change".
type Diff []DiffItem

// Compare returns the changes from old to new, ordered by path (sorted keys) so that equal
// inputs give identical diffs. A key whose value is nil counts as absent, and numbers compare by
// value across numeric types.
func Compare(old, new any) Diff {
	var d Diff
	compareInto(&d, old, new, nil)
	return d
}

func compareInto(d *Diff, a, b any, path []string) {
	switch an, bn := isNull(a), isNull(b); {
	case an && bn:
		return
	case an:
		*d = append(*d, DiffItem{Op: DiffAdd, Path: slices.Clone(path), New: b})
		return
	case bn:
		*d = append(*d, DiffItem{Op: DiffRemove, Path: slices.Clone(path), Old: a})
		return
	}
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if aok && bok {
		keys := make([]string, 0, len(am)+len(bm))
		for k := range am {
			keys = append(keys, k)
		}
		for k := range bm {
			if _, dup := am[k]; !dup {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			compareInto(d, am[k], bm[k], append(path, k))
		}
		return
	}
	if !ValuesEqual(a, b) {
		*d = append(*d, DiffItem{Op: DiffChange, Path: slices.Clone(path), Old: a, New: b})
	}
}

// Reduce narrows a diff to one field path, with paths made relative to it (kopf's reduce), for
// the field handlers that only care about one field. Items below path are kept with the prefix
// stripped; an item at or above path (e.g. the whole "spec" map added) is resolved into the
// sub-values at path and re-compared, so Reduce of {add [spec] {a:1}} to [spec a] gives
// {add [] nil->1}. Unrelated items are dropped. An empty path returns the diff unchanged.
func (d Diff) Reduce(path []string) Diff {
	if len(path) == 0 {
		return d
	}
	var out Diff
	for _, item := range d {
		switch {
		case hasPrefix(item.Path, path):
			out = append(out, DiffItem{Op: item.Op, Path: slices.Clone(item.Path[len(path):]), Old: item.Old, New: item.New})
		case hasPrefix(path, item.Path):
			rest := path[len(item.Path):]
			oldTail, _ := Resolve(item.Old, rest)
			newTail, _ := Resolve(item.New, rest)
			compareInto(&out, oldTail, newTail, nil)
		}
	}
	return out
}

func hasPrefix(s, prefix []string) bool {
	return len(s) >= len(prefix) && slices.Equal(s[:len(prefix)], prefix)
}

// Resolve returns the value at path inside obj; ok is false when some step is missing or not a
// map. An empty path resolves to obj itself.
func Resolve(obj any, path []string) (any, bool) {
	cur := obj
	for _, key := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[key]; !ok {
			return nil, false
		}
	}
	return cur, true
}

// ParsePath splits a dotted field path: "spec.size" -> ["spec", "size"]; "" -> nil.
func ParsePath(dotted string) []string {
	if dotted == "" {
		return nil
	}
	return strings.Split(dotted, ".")
}

// String renders the item for logs, e.g. "change spec.size: 1 -> 2", "add spec.size: 2",
// "remove spec.size: 1". The root path is shown as ".".
func (i DiffItem) String() string {
	path := strings.Join(i.Path, ".")
	if path == "" {
		path = "."
	}
	switch i.Op {
	case DiffAdd:
		return fmt.Sprintf("add %s: %s", path, render(i.New))
	case DiffRemove:
		return fmt.Sprintf("remove %s: %s", path, render(i.Old))
	default:
		return fmt.Sprintf("%s %s: %s -> %s", i.Op, path, render(i.Old), render(i.New))
	}
}

func render(v any) string {
	if s, err := encodeJSON(v); err == nil {
		return s
	}
	return fmt.Sprintf("%v", v)
}
