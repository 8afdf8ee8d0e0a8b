package handling

import (
	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// StoresResult tells whether what a handler of kind returns is stored on the
// object: change handlers (and their subhandlers), timers and raw event handlers
// store it (kopf); daemons, indexes (whose result is the index's entries), hooks
// and admission handlers do not.
func StoresResult(kind causes.Kind) bool {
	return kind == causes.KindChange || kind == causes.KindTimer || kind == causes.KindEvent
}

// StoreResult writes what a handler returned into patch, at status.<handler id>,
// when its kind stores results and it returned something.
func StoreResult(patch *state.Patch, spec causes.Spec, value any) {
	if value != nil && StoresResult(spec.Kind) {
		patch.Set(ResultPath(spec.ID), value)
	}
}

// ResultPath is where the result of handler id goes: status.<id> (a subhandler's id
// is "<parent id>/<child id>", one key).
func ResultPath(id string) []string { return []string{"status", id} }
