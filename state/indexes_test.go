package state

import (
	"reflect"
	"testing"
)

func TestIndexes(t *testing.T) {
	x := NewIndexes()
	x.Declare("empty")
	x.Set("by_app", "ns/b", map[string]any{"web": "b"})
	x.Set("by_app", "ns/a", map[string]any{"web": "a", "db": "a"})
	x.Set("by_app", "ns/c", map[string]any{"db": "c"})
	tests := []struct {
		name  string
		index string
		want  map[string][]any
		ok    bool
	}{
		{"values across objects, ordered by object", "by_app", map[string][]any{"web": {"a", "b"}, "db": {"a", "c"}}, true},
		{"declared but empty", "empty", map[string][]any{}, true},
		{"unknown", "nope", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := x.Lookup(tt.index)
			if ok != tt.ok || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Lookup(%q) = %v, %v; want %v, %v", tt.index, got, ok, tt.want, tt.ok)
			}
		})
	}
	x.Set("by_app", "ns/a", nil)
	x.Remove("ns/c")
	if got, _ := x.Lookup("by_app"); !reflect.DeepEqual(got, map[string][]any{"web": {"b"}}) {
		t.Errorf("after removals: %v", got)
	}
}
