package state

import (
	"encoding/json"
	"testing"
)

// obj builds a JSON-like map from a JSON literal, decoded the way client-go decodes objects.
func obj(t testing.TB, s string) map[string]any {
	t.Helper()
	m, err := decodeJSONObject(s)
	if err != nil {
		t.Fatalf("bad test JSON %s: %v", s, err)
	}
	return m
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	s, err := encodeJSON(v)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func ptr[T any](v T) *T { return &v }

func TestPatchSetGet(t *testing.T) {
	tests := []struct {
		name  string
		start string
		path  []string
		value any
		want  string
	}{
		{"top level", `{}`, []string{"a"}, int64(1), `{"a":1}`},
		{"creates intermediates", `{}`, []string{"a", "b", "c"}, "x", `{"a":{"b":{"c":"x"}}}`},
		{"keeps siblings", `{"a":{"z":1}}`, []string{"a", "b"}, "x", `{"a":{"b":"x","z":1}}`},
		{"overwrites scalar intermediate", `{"a":5}`, []string{"a", "b"}, "x", `{"a":{"b":"x"}}`},
		{"overwrites null intermediate", `{"a":null}`, []string{"a", "b"}, "x", `{"a":{"b":"x"}}`},
		{"null is kept as deletion", `{"a":1}`, []string{"a"}, nil, `{"a":null}`},
		{"list value", `{}`, []string{"l"}, []any{int64(1)}, `{"l":[1]}`},
		{"empty path with map replaces", `{"a":1}`, nil, map[string]any{"b": int64(2)}, `{"b":2}`},
		{"empty path with scalar ignored", `{"a":1}`, nil, int64(3), `{"a":1}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := NewPatch()
			p.Merge(obj(t, tt.start))
			p.Set(tt.path, tt.value)
			if got := mustJSON(t, p.Map()); got != tt.want {
				t.Fatalf("got %s, want %s", got, tt.want)
			}
			if len(tt.path) > 0 {
				if v, ok := p.Get(tt.path); !ok || !ValuesEqual(v, tt.value) {
					t.Fatalf("Get = %v, %v; want %v", v, ok, tt.value)
				}
			}
		})
	}
}

func TestPatchGetMissing(t *testing.T) {
	p := NewPatch()
	p.Set([]string{"a", "b"}, int64(1))
	tests := []struct {
		name string
		path []string
		ok   bool
	}{
		{"present", []string{"a", "b"}, true},
		{"parent", []string{"a"}, true},
		{"absent leaf", []string{"a", "c"}, false},
		{"through scalar", []string{"a", "b", "c"}, false},
		{"absent top", []string{"x"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, ok := p.Get(tt.path); ok != tt.ok {
				t.Fatalf("ok = %v, want %v", ok, tt.ok)
			}
		})
	}
}

func TestPatchZeroAndNil(t *testing.T) {
	var zero Patch
	if !zero.IsEmpty() || zero.Map() == nil {
		t.Fatal("zero patch must be empty with a non-nil map")
	}
	zero.Set([]string{"a"}, int64(1))
	if zero.IsEmpty() {
		t.Fatal("zero patch must accept writes")
	}
	var nilPatch *Patch
	if !nilPatch.IsEmpty() || nilPatch.Map() == nil {
		t.Fatal("nil patch must be empty with a non-nil map")
	}
	if _, ok := nilPatch.Get([]string{"a"}); ok {
		t.Fatal("nil patch has nothing")
	}
	if m, s := nilPatch.Split(); m != nil || s != nil {
		t.Fatal("nil patch splits into nothing")
	}
	p := NewPatch()
	p.Map()["x"] = int64(1) // Map is the live map
	if v, ok := p.Get([]string{"x"}); !ok || v != int64(1) {
		t.Fatal("Map must return the underlying map")
	}
}

func TestPatchUnset(t *testing.T) {
	tests := []struct {
		name    string
		path    []string
		removed bool
		want    string
	}{
		{"leaf", []string{"a", "b"}, true, `{"a":{"c":null}}`},
		{"null leaf", []string{"a", "c"}, true, `{"a":{"b":1}}`},
		{"absent", []string{"a", "x"}, false, `{"a":{"b":1,"c":null}}`},
		{"through scalar", []string{"a", "b", "x"}, false, `{"a":{"b":1,"c":null}}`},
		{"empty path", nil, false, `{"a":{"b":1,"c":null}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := NewPatch()
			p.Merge(obj(t, `{"a":{"b":1,"c":null}}`))
			if got := p.Unset(tt.path); got != tt.removed {
				t.Fatalf("Unset = %v, want %v", got, tt.removed)
			}
			if got := mustJSON(t, p.Map()); got != tt.want {
				t.Fatalf("got %s, want %s", got, tt.want)
			}
		})
	}
}

func TestPatchMerge(t *testing.T) {
	tests := []struct {
		name       string
		start, add string
		want       string
	}{
		{"into empty", `{}`, `{"a":{"b":1}}`, `{"a":{"b":1}}`},
		{"maps recurse", `{"a":{"b":1}}`, `{"a":{"c":2}}`, `{"a":{"b":1,"c":2}}`},
		{"scalar replaces", `{"a":{"b":1}}`, `{"a":{"b":2}}`, `{"a":{"b":2}}`},
		{"list replaces", `{"l":[1,2,3]}`, `{"l":[4]}`, `{"l":[4]}`},
		{"null replaces map", `{"a":{"b":1}}`, `{"a":null}`, `{"a":null}`},
		{"map replaces null", `{"a":null}`, `{"a":{"b":1}}`, `{"a":{"b":1}}`},
		{"map replaces scalar", `{"a":1}`, `{"a":{"b":1}}`, `{"a":{"b":1}}`},
		{"nested null kept", `{"a":{"b":1}}`, `{"a":{"b":null}}`, `{"a":{"b":null}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := NewPatch()
			p.Merge(obj(t, tt.start))
			other := obj(t, tt.add)
			p.Merge(other)
			if got := mustJSON(t, p.Map()); got != tt.want {
				t.Fatalf("got %s, want %s", got, tt.want)
			}
			// Merged values are copies: editing the source later must not leak in.
			if a, ok := other["a"].(map[string]any); ok {
				a["leak"] = true
				if got := mustJSON(t, p.Map()); got != tt.want {
					t.Fatalf("source edit leaked into the patch: %s", got)
				}
			}
		})
	}
}

func TestPatchSetAnnotation(t *testing.T) {
	tests := []struct {
		name  string
		value *string
		want  string
	}{
		{"set", ptr("v"), `{"metadata":{"annotations":{"k/x":"v"}}}`},
		{"delete", nil, `{"metadata":{"annotations":{"k/x":null}}}`},
		{"empty string is a value", ptr(""), `{"metadata":{"annotations":{"k/x":""}}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := NewPatch()
			p.SetAnnotation("k/x", tt.value)
			if got := mustJSON(t, p.Map()); got != tt.want {
				t.Fatalf("got %s, want %s", got, tt.want)
			}
		})
	}
}

func TestPatchSplit(t *testing.T) {
	tests := []struct {
		name         string
		patch        string
		main, status string // "null" when nil
		wantEmpty    bool
	}{
		{"empty", `{}`, "null", "null", true},
		{"main only", `{"spec":{"a":1}}`, `{"spec":{"a":1}}`, "null", false},
		{"status only", `{"status":{"x":1}}`, "null", `{"status":{"x":1}}`, false},
		{"both", `{"metadata":{"labels":{"a":"b"}},"status":{"x":null}}`,
			`{"metadata":{"labels":{"a":"b"}}}`, `{"status":{"x":null}}`, false},
		{"status deleted", `{"status":null}`, "null", `{"status":null}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := NewPatch()
			p.Merge(obj(t, tt.patch))
			if p.IsEmpty() != tt.wantEmpty {
				t.Fatalf("IsEmpty = %v", p.IsEmpty())
			}
			main, status := p.Split()
			if got := mustJSON(t, main); got != tt.main {
				t.Errorf("main = %s, want %s", got, tt.main)
			}
			if got := mustJSON(t, status); got != tt.status {
				t.Errorf("status = %s, want %s", got, tt.status)
			}
		})
	}
}

func TestMergePatchSemantics(t *testing.T) {
	tests := []struct {
		name             string
		obj, patch, want string
	}{
		// The RFC 7386 appendix examples that fit an object target.
		{"rfc replace", `{"a":"b"}`, `{"a":"c"}`, `{"a":"c"}`},
		{"rfc add", `{"a":"b"}`, `{"b":"c"}`, `{"a":"b","b":"c"}`},
		{"rfc delete", `{"a":"b"}`, `{"a":null}`, `{}`},
		{"rfc delete one of two", `{"a":"b","b":"c"}`, `{"a":null}`, `{"b":"c"}`},
		{"rfc list to scalar", `{"a":["b"]}`, `{"a":"c"}`, `{"a":"c"}`},
		{"rfc scalar to list", `{"a":"c"}`, `{"a":["b"]}`, `{"a":["b"]}`},
		{"rfc nested", `{"a":{"b":"c"}}`, `{"a":{"b":"d","c":null}}`, `{"a":{"b":"d"}}`},
		{"rfc list of maps replaces", `{"a":[{"b":"c"}]}`, `{"a":[1]}`, `{"a":[1]}`},
		{"rfc nulls in new map dropped", `{}`, `{"a":{"bb":{"ccc":null}}}`, `{"a":{"bb":{}}}`},
		{"rfc map onto scalar", `{"e":null,"a":1}`, `{"a":{"b":null,"c":2}}`, `{"a":{"c":2},"e":null}`},
		{"lists replace, not merge", `{"l":[1,2,3]}`, `{"l":[9]}`, `{"l":[9]}`},
		{"null in list kept", `{}`, `{"l":[null,1]}`, `{"l":[null,1]}`},
		{"delete absent is fine", `{"a":1}`, `{"b":null}`, `{"a":1}`},
		{"empty patch", `{"a":{"b":1}}`, `{}`, `{"a":{"b":1}}`},
		{"deep", `{"m":{"x":{"y":1,"z":2}}}`, `{"m":{"x":{"z":null,"w":[1]}}}`, `{"m":{"x":{"w":[1],"y":1}}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, p := obj(t, tt.obj), obj(t, tt.patch)
			before, pbefore := mustJSON(t, o), mustJSON(t, p)
			got := applyMergePatch(o, p)
			if s := mustJSON(t, got); s != tt.want {
				t.Fatalf("got %s, want %s", s, tt.want)
			}
			if mustJSON(t, o) != before || mustJSON(t, p) != pbefore {
				t.Fatal("inputs were modified")
			}
			// The result shares nothing with the inputs.
			mutateAll(got)
			if mustJSON(t, o) != before || mustJSON(t, p) != pbefore {
				t.Fatal("result shares state with the inputs")
			}
		})
	}
	if got := applyMergePatch(nil, map[string]any{"a": int64(1)}); mustJSON(t, got) != `{"a":1}` {
		t.Fatalf("nil object: %v", got)
	}
}

// mutateAll writes into every map and list of v.
func mutateAll(v any) {
	switch x := v.(type) {
	case map[string]any:
		for _, e := range x {
			mutateAll(e)
		}
		x["mutated"] = true
	case []any:
		for i, e := range x {
			mutateAll(e)
			x[i] = "mutated"
		}
	}
}

func TestDeepCopyValue(t *testing.T) {
	tests := []struct {
		name string
		v    any
	}{
		{"nil", nil},
		{"scalar", "s"},
		{"number", json.Number("1.5")},
		{"nested", map[string]any{"a": []any{map[string]any{"b": int64(1)}}, "c": nil}},
		{"typed", map[string]any{"s": []string{"a"}, "m": map[string]string{"k": "v"}}},
		{"nil map", map[string]any(nil)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DeepCopyValue(tt.v)
			if !ValuesEqual(c, tt.v) {
				t.Fatalf("copy %v differs from %v", c, tt.v)
			}
			if m, ok := c.(map[string]any); ok && m != nil {
				before := mustJSON(t, tt.v)
				mutateAll(c)
				if s, ok := m["s"].([]string); ok {
					s[0] = "changed"
				}
				if mm, ok := m["m"].(map[string]string); ok {
					mm["k"] = "changed"
				}
				if mustJSON(t, tt.v) != before {
					t.Fatal("copy shares state with the original")
				}
			}
		})
	}
}

// applyMergePatch returns a new object = obj with the merge patch applied (RFC 7386). It is pure:
// neither argument is modified and the result shares no maps or slices with them, so it can
// serve as the next cycle's view of the object while the originals stay cached.
func applyMergePatch(obj map[string]any, patch map[string]any) map[string]any {
	out := copyMap(obj)
	if out == nil {
		out = map[string]any{}
	}
	applyInto(out, patch)
	return out
}

// applyInto applies patch to dst, which the caller already owns.
func applyInto(dst, patch map[string]any) {
	for k, v := range patch {
		if isNull(v) {
			delete(dst, k)
			continue
		}
		pv, ok := v.(map[string]any)
		if !ok {
			dst[k] = DeepCopyValue(v)
			continue
		}
		// RFC 7386: a patch object applied to a non-object starts from {}, which also drops the
		// nulls inside the patch value instead of storing them.
		target, ok := dst[k].(map[string]any)
		if !ok || target == nil {
			target = map[string]any{}
			dst[k] = target
		}
		applyInto(target, pv)
	}
}

func copyMap(m map[string]any) map[string]any {
	if m == nil {
		return nil
	}
	return DeepCopyValue(m).(map[string]any)
}

// A merge patch changes an object only where a value differs, a field it deletes
// exists, or a map it writes is missing (issue 45: a daemon's unchanged writes are not
// sent).
func TestPatchChanges(t *testing.T) {
	obj := map[string]any{
		"metadata": map[string]any{"name": "w"},
		"spec":     map[string]any{"size": int64(3), "tags": []any{"a"}},
		"status":   map[string]any{"phase": "Running", "checks": float64(2)},
	}
	for _, tt := range []struct {
		name  string
		patch map[string]any
		want  bool
	}{
		{"empty", map[string]any{}, false},
		{"the same value", map[string]any{"status": map[string]any{"phase": "Running"}}, false},
		{"a number as another type", map[string]any{"status": map[string]any{"checks": int64(2)}}, false},
		{"the same list", map[string]any{"spec": map[string]any{"tags": []any{"a"}}}, false},
		{"an existing map, empty", map[string]any{"status": map[string]any{}}, false},
		{"deleting what is absent", map[string]any{"status": map[string]any{"gone": nil}}, false},
		{"another value", map[string]any{"status": map[string]any{"phase": "Failed"}}, true},
		{"another number", map[string]any{"status": map[string]any{"checks": int64(3)}}, true},
		{"a new field", map[string]any{"status": map[string]any{"found": true}}, true},
		{"deleting a field", map[string]any{"status": map[string]any{"phase": nil}}, true},
		{"a missing map, empty", map[string]any{"data": map[string]any{}}, true},
		{"a map over a scalar", map[string]any{"spec": map[string]any{"size": map[string]any{"x": int64(1)}}}, true},
		{"another list", map[string]any{"spec": map[string]any{"tags": []any{"a", "b"}}}, true},
	} {
		if got := Changes(obj, tt.patch); got != tt.want {
			t.Errorf("%s: Changes = %v, want %v", tt.name, got, tt.want)
		}
	}
}
