package yaml12

import (
	"math"
	"reflect"
	"strings"
	"testing"
)

// The values YAML 1.1 (sigs.k8s.io/yaml, yaml.v2) got wrong for hand-written files,
// and the core schema's forms, as the 1.2 spec (10.3.2) resolves them.
func TestCoreSchema(t *testing.T) {
	doc := `
n: 2
y: 3
country: NO
switch: on
off: yes
oct: 014
oct2: 0o14
hex: 0x1F
underscore: 1_000
binary: 0b101
date: 2001-12-14
sexagesimal: 1:20
float: 1e3
neg: -2.5
dot: .5
inf: -.inf
bools: [true, True, TRUE, false, False, FALSE]
nulls: [~, null, Null, NULL]
quoted: ["true", '014', "null"]
tagged: [!!str 12, !!int "12", !!float 3, !!bool "true"]
big: 123456789012345678901234567890
1: one
true: yes
`
	got, err := Unmarshal([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	m := got.(map[string]any)
	want := map[string]any{
		"n": int64(2), "y": int64(3), "country": "NO", "switch": "on", "off": "yes",
		"oct": int64(14), "oct2": int64(12), "hex": int64(31), "underscore": "1_000", "binary": "0b101",
		"date": "2001-12-14", "sexagesimal": "1:20", "float": 1000.0, "neg": -2.5, "dot": 0.5,
		"bools": []any{true, true, true, false, false, false}, "nulls": []any{nil, nil, nil, nil},
		"quoted": []any{"true", "014", "null"}, "tagged": []any{"12", int64(12), 3.0, true},
		"big": 123456789012345678901234567890.0, "1": "one", "true": "yes",
	}
	if !math.IsInf(m["inf"].(float64), -1) {
		t.Errorf("-.inf: %v", m["inf"])
	}
	delete(m, "inf")
	for k, w := range want {
		if !reflect.DeepEqual(m[k], w) {
			t.Errorf("%s: %#v, want %#v", k, m[k], w)
		}
	}
	if len(m) != len(want) {
		t.Errorf("keys: %d, want %d: %v", len(m), len(want), m)
	}
}

func TestAliasesMergesAndErrors(t *testing.T) {
	got, err := Unmarshal([]byte("base: &b {a: 1, b: 2}\nderived:\n  <<: *b\n  b: 3\nlist: [*b]\n"))
	if err != nil {
		t.Fatal(err)
	}
	m := got.(map[string]any)
	if d := m["derived"].(map[string]any); d["a"] != int64(1) || d["b"] != int64(3) {
		t.Errorf("merge: %v", d)
	}
	if l := m["list"].([]any); !reflect.DeepEqual(l[0], map[string]any{"a": int64(1), "b": int64(2)}) {
		t.Errorf("alias: %v", l)
	}
	// A billion laughs stops at the budget, with a line.
	var b strings.Builder
	b.WriteString("a: &a [x, x, x, x, x, x, x, x, x, x]\n")
	prev := "a"
	for i := 0; i < 9; i++ {
		name := string(rune('b' + i))
		b.WriteString(name + ": &" + name + " [*" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + "]\n")
		prev = name
	}
	if _, err := Unmarshal([]byte(b.String())); err == nil || !strings.Contains(err.Error(), "too many values") {
		t.Errorf("billion laughs: %v", err)
	}
	if _, err := Unmarshal([]byte("a: !!int nope\n")); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("bad tagged int: %v", err)
	}
	if v, err := Unmarshal([]byte("")); v != nil || err != nil {
		t.Errorf("empty: %v %v", v, err)
	}
}
