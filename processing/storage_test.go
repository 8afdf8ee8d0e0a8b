package processing

import "testing"

// What the server keeps of status.luaop_dev, by schema: auto storage takes status
// only where everything luaop writes there survives.
func TestSchemaKeepsTheStatusField(t *testing.T) {
	open := map[string]any{"x-kubernetes-preserve-unknown-fields": true}
	closed := map[string]any{"type": "object"}
	props := func(m map[string]any) map[string]any { return map[string]any{"type": "object", "properties": m} }
	withOpen := func(m map[string]any, keep bool) map[string]any {
		m["x-kubernetes-preserve-unknown-fields"] = keep
		return m
	}
	path := []string{"status", "luaop_dev"}
	for _, tt := range []struct {
		name   string
		schema map[string]any
		want   bool
	}{
		{"status keeps unknown fields", props(map[string]any{"status": open}), true},
		{"status closed", props(map[string]any{"status": closed}), false},
		{"no status declared, the root closed", props(map[string]any{"spec": open}), false},
		{"no status declared, the root keeps unknown fields", withOpen(props(map[string]any{}), true), true},
		{"the field declared and open", props(map[string]any{"status": props(map[string]any{"luaop_dev": open})}), true},
		{"the field declared and closed", props(map[string]any{"status": props(map[string]any{"luaop_dev": closed})}), false},
		{"the field declared closed under a status that keeps unknown fields",
			props(map[string]any{"status": withOpen(props(map[string]any{"luaop_dev": closed}), true)}), false},
		{"other fields declared under a status that keeps unknown fields",
			props(map[string]any{"status": withOpen(props(map[string]any{"phase": closed}), true)}), true},
	} {
		if got := schemaKeeps(tt.schema, path); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

// A schema may keep a map and prune what is inside it: the fallback looks at every
// depth of what was sent, removals aside.
func TestKeptAllLooksAtEveryDepth(t *testing.T) {
	sent := map[string]any{"progress": map[string]any{"create_fn": map[string]any{"success": true}, "gone": nil},
		"last-handled-configuration": "{}"}
	for _, tt := range []struct {
		name string
		got  any
		want bool
	}{
		{"all kept", map[string]any{"progress": map[string]any{"create_fn": map[string]any{"success": true}},
			"last-handled-configuration": "{}"}, true},
		{"the field gone", nil, false},
		{"progress kept empty", map[string]any{"progress": map[string]any{}, "last-handled-configuration": "{}"}, false},
		{"the record kept empty", map[string]any{"progress": map[string]any{"create_fn": map[string]any{}},
			"last-handled-configuration": "{}"}, false},
		{"the diff-base gone", map[string]any{"progress": map[string]any{"create_fn": map[string]any{"success": true}}}, false},
	} {
		if got := keptAll(sent, tt.got); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
	if !keptAll(map[string]any{"progress": nil, "last-handled-configuration": nil}, nil) {
		t.Errorf("only removals sent, nothing came back: reported pruned")
	}
}
