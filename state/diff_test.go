package state

import (
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"
)

// diffString renders a diff compactly for comparison in tests.
func diffString(d Diff) string {
	parts := make([]string, len(d))
	for i, item := range d {
		parts[i] = item.String()
	}
	return strings.Join(parts, "; ")
}

func TestCompare(t *testing.T) {
	tests := []struct {
		name     string
		old, new any
		want     string
	}{
		{"equal", map[string]any{"a": int64(1)}, map[string]any{"a": int64(1)}, ""},
		{"both nil", nil, nil, ""},
		{"add at root", nil, map[string]any{"a": int64(1)}, `add .: {"a":1}`},
		{"remove at root", map[string]any{"a": int64(1)}, nil, `remove .: {"a":1}`},
		{"typed nil map is null", map[string]any(nil), map[string]any{"a": int64(1)}, `add .: {"a":1}`},
		{"scalar change at root", int64(1), "x", `change .: 1 -> "x"`},
		{"add at depth", map[string]any{"spec": map[string]any{}}, map[string]any{"spec": map[string]any{"a": map[string]any{"b": int64(1)}}},
			`add spec.a: {"b":1}`},
		{"change at depth", map[string]any{"spec": map[string]any{"a": map[string]any{"b": int64(1)}}},
			map[string]any{"spec": map[string]any{"a": map[string]any{"b": int64(2)}}}, `change spec.a.b: 1 -> 2`},
		{"remove at depth", map[string]any{"spec": map[string]any{"a": int64(1), "b": int64(2)}},
			map[string]any{"spec": map[string]any{"b": int64(2)}}, `remove spec.a: 1`},
		{"sorted order", map[string]any{"c": int64(1), "a": int64(1)}, map[string]any{"b": int64(1), "d": int64(1)},
			`remove a: 1; add b: 1; remove c: 1; add d: 1`},
		{"lists are atoms", map[string]any{"l": []any{int64(1), int64(2)}}, map[string]any{"l": []any{int64(1), int64(3)}},
			`change l: [1,2] -> [1,3]`},
		{"list of maps is an atom", map[string]any{"l": []any{map[string]any{"a": int64(1)}}},
			map[string]any{"l": []any{map[string]any{"a": int64(2)}}}, `change l: [{"a":1}] -> [{"a":2}]`},
		{"equal lists", map[string]any{"l": []any{int64(1)}}, map[string]any{"l": []any{float64(1)}}, ""},
		{"int64 vs float64", map[string]any{"a": int64(3)}, map[string]any{"a": 3.0}, ""},
		{"int vs json.Number", map[string]any{"a": 3}, map[string]any{"a": json.Number("3")}, ""},
		{"float vs json.Number", map[string]any{"a": 2.5}, map[string]any{"a": json.Number("2.5")}, ""},
		{"different numbers", map[string]any{"a": int64(3)}, map[string]any{"a": 3.5}, `change a: 3 -> 3.5`},
		{"number vs string", map[string]any{"a": int64(3)}, map[string]any{"a": "3"}, `change a: 3 -> "3"`},
		{"nil counts as absent", map[string]any{"a": nil}, map[string]any{}, ""},
		{"nil to value is add", map[string]any{"a": nil}, map[string]any{"a": int64(1)}, `add a: 1`},
		{"value to nil is remove", map[string]any{"a": int64(1)}, map[string]any{"a": nil}, `remove a: 1`},
		{"map to scalar is change", map[string]any{"a": map[string]any{"b": int64(1)}}, map[string]any{"a": int64(1)},
			`change a: {"b":1} -> 1`},
		{"empty map vs absent", map[string]any{}, map[string]any{"a": map[string]any{}}, `add a: {}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Compare(tt.old, tt.new)
			if got := diffString(d); got != tt.want {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
			if ValuesEqual(tt.old, tt.new) != (len(d) == 0) {
				t.Fatal("ValuesEqual disagrees with Compare")
			}
		})
	}
}

func TestComparePathsAreIndependent(t *testing.T) {
	old := map[string]any{"s": map[string]any{"a": int64(1), "b": int64(1), "c": int64(1), "d": int64(1), "e": int64(1)}}
	d := Compare(old, map[string]any{"s": map[string]any{}})
	for i, item := range d {
		want := []string{"s", string(rune('a' + i))}
		if !slices.Equal(item.Path, want) {
			t.Fatalf("item %d path %v, want %v", i, item.Path, want)
		}
	}
}

func TestValuesEqual(t *testing.T) {
	tests := []struct {
		name string
		a, b any
		want bool
	}{
		{"nil nil", nil, nil, true},
		{"nil vs typed nil map", nil, map[string]any(nil), true},
		{"nil vs empty map", nil, map[string]any{}, false},
		{"int64 float64", int64(3), 3.0, true},
		{"uint8 int64", uint8(7), int64(7), true},
		{"float32 float64", float32(0.5), 0.5, true},
		{"large ints stay exact", int64(1<<53 + 1), float64(1 << 53), false},
		{"max int64 vs 2^63", int64(math.MaxInt64), float64(1 << 63), false},
		{"huge uint vs float", uint64(math.MaxUint64), float64(math.MaxUint64), true},
		{"bad json.Number vs string", json.Number("x"), "x", false},
		{"strings", "a", "a", true},
		{"bools", true, false, false},
		{"bool vs string", true, "true", false},
		{"nested nil absent", map[string]any{"a": map[string]any{"b": nil}}, map[string]any{"a": map[string]any{}}, true},
		{"list lengths", []any{int64(1)}, []any{int64(1), int64(2)}, false},
		{"list vs map", []any{}, map[string]any{}, false},
		{"typed values fall back", []string{"a"}, []string{"a"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ValuesEqual(tt.a, tt.b); got != tt.want {
				t.Fatalf("ValuesEqual(%v, %v) = %v", tt.a, tt.b, got)
			}
			if got := ValuesEqual(tt.b, tt.a); got != tt.want {
				t.Fatalf("not symmetric")
			}
		})
	}
}

func TestReduce(t *testing.T) {
	spec := func(kv ...any) map[string]any {
		m := map[string]any{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return map[string]any{"spec": m}
	}
	tests := []struct {
		name     string
		old, new any
		path     string
		want     string
	}{
		{"below the path, prefix stripped", spec("a", map[string]any{"b": int64(1)}), spec("a", map[string]any{"b": int64(2)}),
			"spec.a", `change b: 1 -> 2`},
		{"at the path", spec("a", int64(1)), spec("a", int64(2)), "spec.a", `change .: 1 -> 2`},
		{"above the path: whole object added", nil, spec("a", int64(1)), "spec.a", `add .: 1`},
		{"above the path: spec added", map[string]any{}, spec("a", int64(1)), "spec.a", `add .: 1`},
		{"above the path: spec removed", spec("a", int64(1)), map[string]any{}, "spec.a", `remove .: 1`},
		{"above the path: field absent in both", map[string]any{}, spec("b", int64(1)), "spec.a", ``},
		{"above the path: resolved into a map", nil, spec("a", map[string]any{"x": int64(1), "y": int64(2)}), "spec.a",
			`add .: {"x":1,"y":2}`},
		{"above the path through a scalar", map[string]any{"spec": int64(1)}, spec("a", int64(1)), "spec.a", `add .: 1`},
		{"unrelated paths dropped", spec("a", int64(1), "b", int64(1)), spec("a", int64(1), "b", int64(2)), "spec.a", ``},
		{"sibling with common name prefix dropped", spec("ab", int64(1)), spec("ab", int64(2)), "spec.a", ``},
		{"empty path keeps all", spec("a", int64(1)), spec("a", int64(2)), "", `change spec.a: 1 -> 2`},
		{"several below", spec("a", map[string]any{"x": int64(1)}), spec("a", map[string]any{"y": int64(1)}), "spec.a",
			`remove x: 1; add y: 1`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Compare(tt.old, tt.new).Reduce(ParsePath(tt.path))
			if s := diffString(got); s != tt.want {
				t.Fatalf("got %q, want %q", s, tt.want)
			}
		})
	}
}

func TestReduceDoesNotAlias(t *testing.T) {
	d := Compare(map[string]any{"s": map[string]any{"a": map[string]any{"b": int64(1)}}},
		map[string]any{"s": map[string]any{"a": map[string]any{"b": int64(2)}}})
	r := d.Reduce([]string{"s"})
	r[0].Path[0] = "changed"
	if d[0].Path[1] != "a" {
		t.Fatal("Reduce shares paths with the original diff")
	}
}

func TestResolve(t *testing.T) {
	o := map[string]any{"a": map[string]any{"b": int64(1), "n": nil}, "s": "x"}
	tests := []struct {
		name   string
		path   []string
		want   any
		wantOK bool
	}{
		{"empty path", nil, o, true},
		{"leaf", []string{"a", "b"}, int64(1), true},
		{"nil leaf", []string{"a", "n"}, nil, true},
		{"missing", []string{"a", "c"}, nil, false},
		{"through scalar", []string{"s", "x"}, nil, false},
		{"through nil", []string{"a", "n", "x"}, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := Resolve(o, tt.path)
			if ok != tt.wantOK || !ValuesEqual(got, tt.want) {
				t.Fatalf("got %v, %v", got, ok)
			}
		})
	}
}

func TestParsePath(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"spec", []string{"spec"}},
		{"spec.size", []string{"spec", "size"}},
		{"a.b.c", []string{"a", "b", "c"}},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			if got := ParsePath(tt.in); !slices.Equal(got, tt.want) || (got == nil) != (tt.want == nil) {
				t.Fatalf("got %#v", got)
			}
		})
	}
}

func TestDiffItemString(t *testing.T) {
	tests := []struct {
		name string
		item DiffItem
		want string
	}{
		{"change", DiffItem{DiffChange, []string{"spec", "size"}, int64(1), int64(2)}, "change spec.size: 1 -> 2"},
		{"add", DiffItem{DiffAdd, []string{"spec", "size"}, nil, int64(2)}, "add spec.size: 2"},
		{"remove", DiffItem{DiffRemove, []string{"spec"}, map[string]any{"a": "<b>"}, nil}, `remove spec: {"a":"<b>"}`},
		{"root", DiffItem{DiffChange, nil, "a", "b"}, `change .: "a" -> "b"`},
		{"unencodable", DiffItem{DiffAdd, []string{"f"}, nil, math.NaN()}, "add f: NaN"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.item.String(); got != tt.want {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestMergePatch(t *testing.T) {
	tests := []struct {
		name     string
		old, new string
		diff     Diff // used instead of Compare(old, new) when set
		want     string
	}{
		{"no change", `{"a":1}`, `{"a":1}`, nil, `{}`},
		{"add, change, remove", `{"a":1,"b":{"c":2,"d":3}}`, `{"a":2,"b":{"c":2},"e":[1]}`, nil,
			`{"a":2,"b":{"d":null},"e":[1]}`},
		{"lists atomic", `{"l":[1,2]}`, `{"l":[1]}`, nil, `{"l":[1]}`},
		{"map replacing a map nulls old keys", `{"a":{"x":{"p":1},"y":1}}`, `{"a":{"x":{"q":2}}}`,
			Diff{{DiffChange, []string{"a"}, map[string]any{"x": map[string]any{"p": int64(1)}, "y": int64(1)},
				map[string]any{"x": map[string]any{"q": int64(2)}}}},
			`{"a":{"x":{"p":null,"q":2},"y":null}}`},
		{"root add", `{}`, `{"a":1}`, Diff{{DiffAdd, nil, nil, map[string]any{"a": int64(1)}}}, `{"a":1}`},
		{"root remove", `{"a":1}`, `{}`, Diff{{DiffRemove, nil, map[string]any{"a": int64(1)}, nil}}, `{"a":null}`},
		{"root scalar skipped", `{}`, `{}`, Diff{{DiffChange, nil, int64(1), int64(2)}}, `{}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, n := obj(t, tt.old), obj(t, tt.new)
			d := tt.diff
			if d == nil {
				d = Compare(o, n)
			}
			p := mergePatchOf(d)
			if got := mustJSON(t, p); got != tt.want {
				t.Fatalf("patch %s, want %s", got, tt.want)
			}
			if got := applyMergePatch(o, p); !ValuesEqual(got, n) {
				t.Fatalf("applied: %s, want %s", mustJSON(t, got), tt.new)
			}
		})
	}
}

// The operator never needs a diff as a patch; tests use it to check that Compare loses nothing.
// mergePatchOf turns the diff d into a JSON merge patch that, applied to the old object, gives the
// new one (up to nil-valued keys, which a diff treats as absent). Removals become nil, lists are
// replaced whole, and values are copied. A root item is representable only when its new value
// is a map or absent (then every old key is deleted); other root items are skipped.
func mergePatchOf(d Diff) map[string]any {
	p := NewPatch()
	for _, item := range d {
		if len(item.Path) > 0 {
			p.Set(item.Path, replacement(item.Old, item.New))
			continue
		}
		newValue := item.New
		if isNull(newValue) {
			newValue = map[string]any{}
		}
		if m, ok := replacement(item.Old, newValue).(map[string]any); ok {
			p.Merge(m)
		}
	}
	return p.Map()
}

// replacement is the merge-patch value that turns old into new. Compare never yields a map
// replacing a map, but Reduce and hand-made diffs can, and merging a map into a map would keep
// the old keys, so those are nulled out recursively.
func replacement(old, new any) any {
	nm, ok := new.(map[string]any)
	if !ok || nm == nil {
		if isNull(new) {
			return nil
		}
		return DeepCopyValue(new)
	}
	om, _ := old.(map[string]any)
	out := make(map[string]any, len(nm))
	for k, v := range nm {
		if isNull(v) {
			if !isNull(om[k]) {
				out[k] = nil
			}
			continue
		}
		out[k] = replacement(om[k], v)
	}
	for k, v := range om {
		if _, in := nm[k]; !in && !isNull(v) {
			out[k] = nil
		}
	}
	return out
}
