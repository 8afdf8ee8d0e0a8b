package handling

import (
	"strings"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// StatusField is the field of status that an operator with this prefix keeps its
// bookkeeping in when it stores it in status (processing's Options.StatusField
// default): the prefix with its dots as underscores.
func StatusField(prefix string) string { return strings.ReplaceAll(prefix, ".", "_") }

// Essence is what change handlers compare of an object: its essence (state.Essence)
// with the fields that change handlers name outside of it (status.phase) added, as
// kopf adds them, read without the operator's own bookkeeping. Maps along the way
// are copied, never written: they may be the body's own.
func Essence(body map[string]any, prefix, statusField string, fields [][]string) map[string]any {
	essence := state.Essence(body, prefix)
	if len(fields) > 0 {
		essence = WithFields(essence, state.WithoutBookkeeping(body, prefix, statusField), fields)
	}
	return essence
}

// ChangeFields are the fields named by the change handlers among specs: those
// Essence adds.
func ChangeFields(specs []causes.Spec) [][]string {
	var out [][]string
	for _, s := range specs {
		if s.Kind == causes.KindChange && len(s.Field) > 0 {
			out = append(out, s.Field)
		}
	}
	return out
}

// WithFields adds to an essence the values that body has at paths the essence lacks.
// Maps along the way are copied, never written: they may be the body's own.
func WithFields(essence, body map[string]any, paths [][]string) map[string]any {
	for _, path := range paths {
		if len(path) == 0 {
			continue
		}
		if _, ok := state.Resolve(essence, path); ok {
			continue
		}
		v, ok := state.Resolve(body, path)
		if !ok {
			continue
		}
		essence = WithValue(essence, path, v)
	}
	return essence
}

// WithValue is m with v at path, maps along the way copied (m is never written).
func WithValue(m map[string]any, path []string, v any) map[string]any {
	return state.WithValue(m, path, v)
}

// ChangeCause is the cause of a change of reason, from the essence stored as the
// diff-base when the last cause completed (old, nil when none) and the current one
// (new), as kopf builds every change cause (kopf/_core/reactor/processing.py,
// _detect_causes: old, new and diff(old, new) go to detect_changing_cause whatever
// the reason): a creation has new and its diff from nothing; an update, a deletion
// and a no-change old, new and their diff; a resume old and new, which do not
// differ, so that a resume given no stored essence (luaop test without old:) has
// the current one as old, as the core's always has (it is a resume because
// nothing changed since). body is the object as the watch delivered it.
func ChangeCause(reason causes.Reason, resource causes.Resource, body map[string]any, old, new any) causes.Cause {
	c := causes.Cause{Reason: reason, Resource: resource, Body: body, Old: old, New: new}
	switch reason {
	case causes.Create:
		c.Old = nil
		c.Diff = state.Compare(nil, new)
	case causes.Resume:
		if old == nil {
			c.Old = new
		}
	default:
		c.Diff = state.Compare(old, new)
	}
	return c
}

// View is the cause a change handler is given for a cause, and whether it takes
// part in it at all. A field handler of a creation or an update takes part when its
// field changed (changeOfField): old, new and diff are of its field, from old and
// diff (the cause's own, or what processing held back for the handler, see
// processing/heldback.go); for the other reasons its field is a presence filter
// (FieldCause). A handler of the whole object does not take part in an update
// without a diff (a cause for held-back field handlers only). Filters are the
// caller's to evaluate on the view.
func View(spec causes.Spec, cause causes.Cause, old any, diff state.Diff) (view causes.Cause, takesPart, changeOfField bool) {
	if len(spec.Field) == 0 {
		if cause.Reason == causes.Update && len(cause.Diff) == 0 {
			return cause, false, false
		}
		return cause, true, false
	}
	switch cause.Reason {
	case causes.Create, causes.Update:
		view, changed := FieldChange(spec, cause, old, diff)
		return view, changed, changed
	}
	view, present := FieldCause(spec, cause)
	return view, present, false
}

// FieldChange reduces a creation or an update to a field handler's field: the diff
// to the field's changes, old and new to its values; the whole essences go along
// (WholeOld, WholeNew) for subhandlers filtering on other fields (luaop matches
// them against the whole, kopf does not: SubhandlerView). old and diff are the cause's, or those that processing held
// back for the handler. changed is false when the field did not change.
func FieldChange(spec causes.Spec, cause causes.Cause, old any, diff state.Diff) (view causes.Cause, changed bool) {
	view = cause
	view.Diff = diff.Reduce(spec.Field)
	if len(view.Diff) == 0 {
		return view, false
	}
	view.Old, _ = state.Resolve(old, spec.Field)
	view.New, _ = state.Resolve(cause.New, spec.Field)
	view.WholeOld, view.WholeNew = cause.Old, cause.New
	return view, true
}

// FieldCause reduces a cause to a field handler's field for the causes where the
// field is a presence filter (delete, resume, and the finalizer's decision): old is
// the field in the stored essence, new in the current one; present when either has
// it (kopf's _matches_field_values, kopf/_core/intents/registries.py). The whole
// essences go along for subhandlers (SubhandlerView); on a deletion they are the
// stored and the current essence, as kopf's deletion cause carries them. A handler
// of the whole object gets the cause as it is.
func FieldCause(spec causes.Spec, cause causes.Cause) (causes.Cause, bool) {
	if len(spec.Field) == 0 {
		return cause, true
	}
	out := cause
	out.Diff = nil
	out.WholeOld, out.WholeNew = cause.Old, cause.New
	var oldOK, newOK bool
	out.Old, oldOK = state.Resolve(cause.Old, spec.Field)
	out.New, newOK = state.Resolve(cause.New, spec.Field)
	return out, oldOK || newOK
}

// ForEvent is the cause of a raw event handler: the event's type and body, as the
// watch delivered them.
func ForEvent(resource causes.Resource, body map[string]any, eventType string) causes.Cause {
	return causes.Cause{Resource: resource, Body: body, EventType: eventType}
}

// ForObject is the cause of a timer's run or an index function: the object's
// current body, no change.
func ForObject(resource causes.Resource, body map[string]any) causes.Cause {
	return causes.Cause{Resource: resource, Body: body}
}

// ForDaemon is the cause a daemon starts with: its resource only. A daemon reads
// its object's newest body through its link (causes.DaemonLink.Latest): it must not
// keep its first body alive for its whole life.
func ForDaemon(resource causes.Resource) causes.Cause {
	return causes.Cause{Resource: resource}
}

// ForHook is the cause of an operator hook (startup, cleanup, probe): none, the
// hooks are not tied to an object.
func ForHook() causes.Cause { return causes.Cause{} }
