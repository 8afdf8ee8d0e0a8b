package luabind

import (
	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

type metaMode int

const (
	metaEquals metaMode = iota
	metaPresent
	metaAbsent
)

type metaFilter struct {
	key   string
	mode  metaMode
	value string
}

// dataFilters are the filters of a handler that need no Lua: they are checked in Go
// before any state is locked.
type dataFilters struct {
	labels, annotations []metaFilter
	field               []string
	value, old, new     any
	hasValue            bool
	hasOld, hasNew      bool
	hasCallbacks        bool
}

func (f *dataFilters) empty() bool {
	return len(f.labels) == 0 && len(f.annotations) == 0 && !f.hasValue && !f.hasOld && !f.hasNew && !f.hasCallbacks
}

func (f *dataFilters) matchData(cause causes.Cause) bool {
	meta, _ := cause.Body["metadata"].(map[string]any)
	if !matchMeta(f.labels, meta["labels"]) || !matchMeta(f.annotations, meta["annotations"]) {
		return false
	}
	if f.hasValue {
		got, _ := state.Resolve(cause.Body, f.field)
		if !state.ValuesEqual(got, f.value) {
			return false
		}
	}
	// old/new compare the values the handler receives (the field's, for field handlers).
	if f.hasOld && !state.ValuesEqual(cause.Old, f.old) {
		return false
	}
	if f.hasNew && !state.ValuesEqual(cause.New, f.new) {
		return false
	}
	return true
}

func matchMeta(filters []metaFilter, raw any) bool {
	m, _ := raw.(map[string]any)
	for _, f := range filters {
		v, ok := m[f.key]
		switch f.mode {
		case metaPresent:
			if !ok {
				return false
			}
		case metaAbsent:
			if ok {
				return false
			}
		case metaEquals:
			if s, _ := v.(string); !ok || s != f.value {
				return false
			}
		}
	}
	return true
}
