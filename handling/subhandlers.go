package handling

import (
	"fmt"
	"slices"
	"strings"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// MaxSubhandlerDepth stops a handler that registers itself again and again: a
// subhandler's id has one "/" per level.
const MaxSubhandlerDepth = 8

// NestedTooDeep tells (with the handler's failure message) when a handler is nested
// too deep to run the subhandlers it registered.
func NestedTooDeep(parentID string) (string, bool) {
	if strings.Count(parentID, "/") >= MaxSubhandlerDepth {
		return fmt.Sprintf("subhandlers nested deeper than %d levels", MaxSubhandlerDepth), true
	}
	return "", false
}

// SubhandlerView is the cause a subhandler's filters (field, value, old, new, when)
// see, from the cause its parent was given: the parent's, when they share a field;
// else their values come from the whole old and new, which a field handler's view
// carries along (WholeOld, WholeNew), reduced to the subhandler's own field when it
// has one.
//
// A deliberate difference from kopf (README, "Semantics"): kopf matches a
// subhandler against the parent's cause already reduced to the parent's field
// (kopf/_core/actions/execution.py invoke_handler sets cause_var to
// handler.adjust_cause(cause); reactor/subhandling.py execute matches the
// subregistry on it; intents/registries.py _matches_field_values resolves the
// subhandler's field in cause.old and cause.new), so under a field handler a
// subhandler's field is never found and a subhandler with a field never runs.
// luaop keeps the whole object's view, in which it can.
func SubhandlerView(parent causes.Spec, cause causes.Cause, sub causes.Spec) causes.Cause {
	if slices.Equal(sub.Field, parent.Field) {
		return cause
	}
	wholeOld, wholeNew := cause.Old, cause.New
	if len(parent.Field) > 0 {
		wholeOld, wholeNew = cause.WholeOld, cause.WholeNew
	}
	if len(sub.Field) == 0 {
		cause.Old, cause.New = wholeOld, wholeNew
	} else {
		cause.Old, _ = state.Resolve(wholeOld, sub.Field)
		cause.New, _ = state.Resolve(wholeNew, sub.Field)
	}
	return cause
}
