package processing

import (
	"context"
	"reflect"

	"github.com/luaop/luaop/handling"
	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// Held-back fields: a field handler whose filter the object no longer matches (a
// label filter it left) does not run on the changes of its field, and the cause that
// completes without it stores a diff-base that has them: when the object matches
// again, the handler would never see them. A watch that missed the state out of the
// filter (Sieve's hidden intermediate states: the label changed and changed back
// between two events) shows the handler the change instead: what a handler sees
// must not depend on what the watch happened to show. So the diff-base keeps, per such
// handler, the value of its field the handler last handled, under heldBackKey; that
// handler's causes are computed from it, and the entry goes once it ran (or once the
// field is back at that value: nothing was missed).
//
// Handlers of the whole essence need nothing of the kind: the filter's change is
// itself a change of the essence (labels, annotations, the spec a `when` reads), so
// they run when the object matches again, on its newest state.

// heldBackKey is the key of the stored diff-base holding the held-back values (a key
// no object's field has: it holds a "/").
func heldBackKey(prefix string) string { return prefix + "/held-back" }

// heldValue is what a handler last handled of its field: a value, or its absence.
type heldValue struct {
	value   any
	present bool
}

// splitHeldBack takes the held-back values out of a stored diff-base (a copy without
// them; the stored map is left as it is).
func splitHeldBack(stored map[string]any, prefix string) (map[string]any, map[string]heldValue) {
	raw, ok := stored[heldBackKey(prefix)]
	if !ok {
		return stored, nil
	}
	out := make(map[string]any, len(stored)-1)
	for k, v := range stored {
		if k != heldBackKey(prefix) {
			out[k] = v
		}
	}
	entries, _ := raw.(map[string]any)
	held := make(map[string]heldValue, len(entries))
	for id, e := range entries {
		m, _ := e.(map[string]any)
		v, present := m["value"]
		held[id] = heldValue{value: v, present: present}
	}
	return out, held
}

// withHeldBack is an essence to store with its held-back values (the essence itself
// when there are none).
func withHeldBack(essence map[string]any, prefix string, held map[string]heldValue) map[string]any {
	if len(held) == 0 {
		return essence
	}
	out := make(map[string]any, len(essence)+1)
	for k, v := range essence {
		out[k] = v
	}
	entries := make(map[string]any, len(held))
	for id, h := range held {
		if h.present {
			entries[id] = map[string]any{"value": h.value}
		} else {
			entries[id] = map[string]any{}
		}
	}
	out[heldBackKey(prefix)] = entries
	return out
}

// heldAfterCause is what stays held back once a cause completes: what was held,
// minus the handlers that ran in it and those whose field is back at the value they
// last handled, plus the handlers its changes passed by (outOfFilter: the value each
// last handled), minus handlers that are no longer field handlers (fields: the
// field handlers now, by id).
func heldAfterCause(before, outOfFilter map[string]heldValue, ran map[string]bool, handled any, fields map[string][]string) map[string]heldValue {
	after := map[string]heldValue{}
	for id, h := range before {
		after[id] = h
	}
	for id, h := range outOfFilter {
		if _, ok := after[id]; !ok {
			after[id] = h
		}
	}
	for id, h := range after {
		field, isField := fields[id]
		if !isField || ran[id] {
			delete(after, id)
			continue
		}
		v, present := state.Resolve(handled, field)
		if present == h.present && (!present || reflect.DeepEqual(v, h.value)) {
			delete(after, id) // back where the handler left it
		}
	}
	return after
}

// withHeldField is old with field set to what a handler last handled of it (or
// without it).
func withHeldField(old any, field []string, h heldValue) any {
	m, _ := old.(map[string]any)
	if h.present {
		return handling.WithValue(m, field, h.value)
	}
	return removeCopied(m, field)
}

// removeCopied is m without the value at path (maps along the way copied).
func removeCopied(m map[string]any, path []string) map[string]any {
	if len(path) == 0 || m == nil {
		return m
	}
	if _, ok := m[path[0]]; !ok {
		return m
	}
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	if len(path) == 1 {
		delete(out, path[0])
		return out
	}
	child, ok := out[path[0]].(map[string]any)
	if !ok {
		return m
	}
	out[path[0]] = removeCopied(child, path[1:])
	return out
}

// fieldChangeCause is the cause a field handler gets from a creation or an update
// (handling.FieldChange): old, new and diff of its field, from what it last handled
// of it when that is held back; changed is false when its field did not change.
func (c *cycle) fieldChangeCause(spec causes.Spec, cause causes.Cause) (hc causes.Cause, changed bool) {
	old, diff := c.heldBackOld(spec, cause)
	return handling.FieldChange(spec, cause, old, diff)
}

// heldBackOld is the old essence and the diff a handler's view of an update starts
// from: with its field as it last handled it when that is held back, else the
// cause's own.
func (c *cycle) heldBackOld(spec causes.Spec, cause causes.Cause) (any, state.Diff) {
	if len(spec.Field) == 0 || cause.Reason != causes.Update {
		return cause.Old, cause.Diff
	}
	if h, held := c.held[spec.ID]; held {
		old := withHeldField(cause.Old, spec.Field, h)
		return old, state.Compare(old, cause.New)
	}
	return cause.Old, cause.Diff
}

// heldPending tells whether a handler with a held-back value has a change to see
// now: its field differs from what it last handled, and its filters match (the
// cause it would get, as selectHandlers builds it).
func (c *cycle) heldPending(ctx context.Context, cause causes.Cause) bool {
	update := cause
	update.Reason = causes.Update
	for _, spec := range c.specs {
		if _, ok := c.held[spec.ID]; !ok || spec.Kind != causes.KindChange || len(spec.Field) == 0 || !spec.Serves(causes.Update) {
			continue
		}
		hc, changed := c.fieldChangeCause(spec, update)
		if !changed {
			continue
		}
		if ok, err := c.op.handlers.Match(ctx, spec, hc); err == nil && ok {
			return true
		}
	}
	return false
}

// fieldHandlers are the field handlers of the cycle's resource, by id.
func (c *cycle) fieldHandlers() map[string][]string {
	out := map[string][]string{}
	for _, s := range c.specs {
		if s.Kind == causes.KindChange && len(s.Field) > 0 {
			out[s.ID] = s.Field
		}
	}
	return out
}

// passedBy notes a field handler whose field changed in a cause that its filters do
// not let it see: what it last handled is held back when the cause completes.
func (c *cycle) passedBy(spec causes.Spec, cause causes.Cause) {
	if c.outOfFilter == nil {
		c.outOfFilter = map[string]heldValue{}
	}
	if h, ok := c.held[spec.ID]; ok {
		c.outOfFilter[spec.ID] = h
		return
	}
	v, present := state.Resolve(cause.Old, spec.Field)
	c.outOfFilter[spec.ID] = heldValue{value: v, present: present}
}
