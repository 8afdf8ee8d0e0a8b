package scripttest

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/luaop/luaop/handling"
	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// RelatedCase is one change of a related object that a case gives a luaop.on.related
// handler (related:): the object after the change, and before it for a MODIFIED.
type RelatedCase struct {
	// Type is the watch event: ADDED, MODIFIED (the default) or DELETED (the
	// object is then its last state).
	Type   string         `json:"type,omitempty"`
	Object map[string]any `json:"object"`
	Old    map[string]any `json:"old,omitempty"`
	// Resource is the related resource as the handler's relation spells it, when
	// it cannot be told from the object's apiVersion and kind.
	Resource string `json:"resource,omitempty"`
}

var relatedKeys = keysOf(RelatedCase{})

// isRelatedCase tells whether a case runs a related cause: cause: related, or a
// handler: case giving related objects.
func isRelatedCase(c Case) bool {
	return c.Cause == string(causes.Related) || c.Cause == "" && len(c.Related) > 0
}

// relatedView is the cause a handler of related objects gets for the case, as the
// core builds it: the object's essence, unchanged, and the case's related changes
// that the handler's relations relate to the object, checked by the core's own
// rules (owner references, the label's value, the mapping function run on each
// object as the operator runs it). A related object the handler's relations do not
// relate to the object is a problem of the case: the operator would not run the
// handler for it.
func relatedView(ctx context.Context, rt *luabind.Runtime, spec causes.Spec, c Case, prefix string, obj map[string]any, indexes *state.Indexes) (causes.Cause, string) {
	if len(c.Related) == 0 {
		return causes.Cause{}, "a related cause needs related: (the related objects that changed, each {type, object, old})"
	}
	if !spec.Serves(causes.Related) {
		return causes.Cause{}, fmt.Sprintf("handler %s is not a luaop.on.related handler: related: applies to those only", spec.ID)
	}
	meta, _ := obj["metadata"].(map[string]any)
	ns, _ := meta["namespace"].(string)
	name, _ := meta["name"].(string)
	kind, _ := obj["kind"].(string)
	parent := handling.ParentResource{Group: spec.Resource.Group, Kind: kind, Namespaced: ns != ""}
	self := causes.ObjectRef{Namespace: ns, Name: name}
	var changes []causes.RelatedChange
	for i, rc := range c.Related {
		ch, problem := relatedChange(ctx, rt, spec, parent, self, rc, indexes)
		if problem != "" {
			return causes.Cause{}, fmt.Sprintf("related[%d]: %s", i, problem)
		}
		changes = append(changes, ch)
	}
	statusField := handling.StatusField(prefix)
	essence := handling.Essence(obj, prefix, statusField, handling.ChangeFields(rt.Specs()))
	return handling.ForRelated(spec.Resource, obj, essence, changes), ""
}

// relatedChange checks one related object of a case against the handler's
// relations and makes the change the handler is given.
func relatedChange(ctx context.Context, rt *luabind.Runtime, spec causes.Spec, parent handling.ParentResource, self causes.ObjectRef, rc RelatedCase, indexes *state.Indexes) (causes.RelatedChange, string) {
	if rc.Object == nil {
		return causes.RelatedChange{}, "give the related object (object:)"
	}
	typ := rc.Type
	if typ == "" {
		typ = "MODIFIED"
	}
	if typ != "ADDED" && typ != "MODIFIED" && typ != "DELETED" {
		return causes.RelatedChange{}, fmt.Sprintf("type %q: ADDED, MODIFIED or DELETED", typ)
	}
	obj := normalize(rc.Object).(map[string]any)
	var old map[string]any
	if rc.Old != nil && typ != "ADDED" {
		old = normalize(rc.Old).(map[string]any)
	}
	if typ == "DELETED" && old == nil {
		old = obj
	}
	var tried []string
	for i, rel := range spec.Related {
		if !resourceMatches(rel.Resource, obj, rc.Resource) {
			continue
		}
		// Before the change and after it, as the operator maps both states.
		var parents []causes.ObjectRef
		for _, state := range []map[string]any{old, obj} {
			if state == nil {
				continue
			}
			more, problem := relatedParents(ctx, rt, spec, i, parent, state, indexes)
			if problem != "" {
				return causes.RelatedChange{}, problem
			}
			parents = append(parents, more...)
		}
		if slices.Contains(parents, self) {
			meta, _ := obj["metadata"].(map[string]any)
			ns, _ := meta["namespace"].(string)
			name, _ := meta["name"].(string)
			kind, _ := obj["kind"].(string)
			return causes.RelatedChange{Relation: rel.Kind, Resource: rel.Resource, Kind: kind, Namespace: ns, Name: name,
				Type: typ, Object: obj, Old: old}, ""
		}
		tried = append(tried, fmt.Sprintf("%s %s relates it to %s", rel.Kind, rel.Resource, describeRefs(parents)))
	}
	av, _ := obj["apiVersion"].(string)
	kind, _ := obj["kind"].(string)
	if len(tried) == 0 {
		var rels []string
		for _, r := range spec.Related {
			rels = append(rels, string(r.Kind)+" "+r.Resource.String())
		}
		return causes.RelatedChange{}, fmt.Sprintf("no relation of handler %s is of apiVersion %q, kind %q (its relations: %s; give resource: for an irregular plural)",
			spec.ID, av, kind, strings.Join(rels, ", "))
	}
	return causes.RelatedChange{}, fmt.Sprintf("the %s is not related to %s by handler %s, so the operator would not run it for this change: %s",
		kind, describeRefs([]causes.ObjectRef{self}), spec.ID, strings.Join(tried, "; "))
}

// relatedParents are the parents a relation gives a related object, by the
// core's rules; a mapped relation runs the scripts' function.
func relatedParents(ctx context.Context, rt *luabind.Runtime, spec causes.Spec, i int, parent handling.ParentResource, obj map[string]any, indexes *state.Indexes) ([]causes.ObjectRef, string) {
	rel := spec.Related[i]
	if rel.Kind != causes.RelationMapped {
		return handling.RelatedParents(rel, parent, obj), ""
	}
	refs, err := rt.MapRelated(ctx, causes.Call{Handler: spec, Cause: handling.ForObject(rel.Resource, obj), Indexes: indexes, Logger: discardLogger()}, i)
	if err != nil {
		return nil, err.Error()
	}
	return handling.MappedParents(refs, parent.Namespaced, obj), ""
}

func describeRefs(refs []causes.ObjectRef) string {
	if len(refs) == 0 {
		return "nothing"
	}
	var out []string
	for _, r := range refs {
		if r.Namespace == "" {
			out = append(out, r.Name)
		} else {
			out = append(out, r.Namespace+"/"+r.Name)
		}
	}
	return strings.Join(out, ", ")
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
