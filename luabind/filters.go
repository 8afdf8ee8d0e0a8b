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

// valueMode is how a value, old or new filter matches.
type valueMode int

const (
	valueNone     valueMode = iota // no filter
	valueEquals                    // equal to v
	valuePresent                   // luaop.PRESENT
	valueAbsent                    // luaop.ABSENT
	valueCallback                  // a Lua function(value, ctx), run by the shard
)

type valueFilter struct {
	mode valueMode
	v    any
}

// check tests one value against a static filter; callbacks are not checked here.
func (vf valueFilter) check(fv fieldValue) bool {
	switch vf.mode {
	case valuePresent:
		return fv.present
	case valueAbsent:
		return !fv.present
	case valueEquals:
		return fv.present && state.ValuesEqual(fv.v, vf.v)
	}
	return true
}

// dataFilters are the filters of a handler that need no Lua: they are checked in Go
// before any state is locked. Filters that are Lua functions are flagged by
// hasCallbacks and run by the shard (shard.matchCallbacks).
type dataFilters struct {
	labels, annotations []metaFilter
	// field is the field of the value filter, or of the presence filter when no value
	// is given (kopf: `field` alone requires the field to be present).
	field []string
	// change: a change handler. Its field values are the cause's Old and New: the
	// processing core reduces them to the handler's field (as ctx.old/ctx.new), and
	// kopf matches value when the old or the new value equals it. Other handlers
	// (daemons, timers, event handlers, indexes) match the field in the body.
	change          bool
	value, old, new valueFilter
	hasCallbacks    bool
}

type fieldValue struct {
	v       any
	present bool
}

func (f *dataFilters) empty() bool {
	return len(f.labels) == 0 && len(f.annotations) == 0 && f.field == nil &&
		f.value.mode == valueNone && f.old.mode == valueNone && f.new.mode == valueNone && !f.hasCallbacks
}

// fieldValues are the values the value filter (or the presence filter) tests: new
// then old for change handlers, the body's for the others.
func (f *dataFilters) fieldValues(cause causes.Cause) []fieldValue {
	if f.change {
		return []fieldValue{{cause.New, cause.New != nil}, {cause.Old, cause.Old != nil}}
	}
	v, ok := state.Resolve(cause.Body, f.field)
	return []fieldValue{{v, ok}}
}

// oldNew are the values the old and new filters test (change handlers only).
func (f *dataFilters) oldNew(cause causes.Cause) (old, new fieldValue) {
	return fieldValue{cause.Old, cause.Old != nil}, fieldValue{cause.New, cause.New != nil}
}

// matchData checks every filter that needs no Lua.
func (f *dataFilters) matchData(cause causes.Cause) bool {
	meta, _ := cause.Body["metadata"].(map[string]any)
	if !matchMeta(f.labels, meta["labels"]) || !matchMeta(f.annotations, meta["annotations"]) {
		return false
	}
	if f.field != nil && f.value.mode != valueCallback {
		vf := f.value
		if vf.mode == valueNone {
			vf.mode = valuePresent // field alone: a presence filter
		}
		matched := false
		for _, fv := range f.fieldValues(cause) {
			if vf.check(fv) {
				matched = true
				break
			}
		}
		if !matched {
			return false
		}
	}
	if f.change && !cause.Prematch {
		old, new := f.oldNew(cause)
		if !f.old.check(old) || !f.new.check(new) {
			return false
		}
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
