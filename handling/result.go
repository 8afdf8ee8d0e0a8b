package handling

import (
	"fmt"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// StoresResult tells whether what a handler of kind returns is stored on the
// object. kopf delivers the results of every handler that patches the object
// (kopf/_core/actions/progression.py, deliver_results): change handlers
// (reactor/processing.py, process_changing_cause) and their subhandlers
// (reactor/subhandling.py), raw event handlers (processing.py,
// process_watching_cause), daemons and timers (engines/daemons.py, _daemon and
// _timer, after each run). Indexes (whose result is the index's entries), hooks
// (kopf's activities, tied to no object) and admission handlers (whose result is
// the verdict) do not.
func StoresResult(kind causes.Kind) bool {
	switch kind {
	case causes.KindChange, causes.KindTimer, causes.KindEvent, causes.KindDaemon:
		return true
	}
	return false
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

// StatusPrunedMessage is what the operator says (an ERROR line and a Warning Event
// StatusPruned) when the server dropped status.<field> of an object of kind (a result
// the kind's schema does not keep); luaop test fails a case with the same words.
func StatusPrunedMessage(field, kind string) string {
	return fmt.Sprintf("the server dropped status.%s of %s: its schema does not keep it; for a custom resource, "+
		"declare it in the CRD's openAPIV3Schema or add `x-kubernetes-preserve-unknown-fields: true` under status; "+
		"a built-in kind keeps only its own status fields (return nothing from the handler, write through ctx.patch)", field, kind)
}
