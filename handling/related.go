package handling

import (
	"strings"

	"github.com/luaop/luaop/processing/causes"
)

// ParentResource is what the rules of relations need to know of a handler's
// resource: its API group and kind (owner references name them) and whether its
// objects live in namespaces (a label names "namespace.name" or "name").
type ParentResource struct {
	Group, Kind string
	Namespaced  bool
}

// RelatedParents are the objects of parent that obj is related to through rel,
// for the relations whose rule is data (owned, labelled); a mapped relation's
// function is the scripts' (see MappedParents). The rules are controller-runtime's
// where it has them:
//   - owned: every owner reference of obj whose group and kind are the parent's
//     (its controller reference only, unless rel.AnyOwner), as handler.
//     EnqueueRequestForOwner matches them; a namespaced parent is in obj's own
//     namespace (an owner reference cannot cross namespaces);
//   - labelled: the value of rel.Label, "namespace.name" for a namespaced parent
//     (a namespace holds no dot, so the first dot splits), "name" for a
//     cluster-scoped one; a value that names nothing (empty, no dot where one is
//     needed) relates obj to nothing.
func RelatedParents(rel causes.Relation, parent ParentResource, obj map[string]any) []causes.ObjectRef {
	meta, _ := obj["metadata"].(map[string]any)
	switch rel.Kind {
	case causes.RelationOwned:
		return ownedBy(rel, parent, meta)
	case causes.RelationLabelled:
		labels, _ := meta["labels"].(map[string]any)
		value, _ := labels[rel.Label].(string)
		if ref, ok := ParseLabelledRef(value, parent.Namespaced); ok {
			return []causes.ObjectRef{ref}
		}
	}
	return nil
}

// ParseLabelledRef reads the value of a labelled relation's label: "namespace.name"
// for a namespaced parent, "name" for a cluster-scoped one.
func ParseLabelledRef(value string, namespaced bool) (causes.ObjectRef, bool) {
	if !namespaced {
		return causes.ObjectRef{Name: value}, value != ""
	}
	ns, name, ok := strings.Cut(value, ".")
	return causes.ObjectRef{Namespace: ns, Name: name}, ok && ns != "" && name != ""
}

func ownedBy(rel causes.Relation, parent ParentResource, meta map[string]any) []causes.ObjectRef {
	refs, _ := meta["ownerReferences"].([]any)
	ns := ""
	if parent.Namespaced {
		ns, _ = meta["namespace"].(string)
	}
	var out []causes.ObjectRef
	for _, raw := range refs {
		ref, _ := raw.(map[string]any)
		if controller, _ := ref["controller"].(bool); !controller && !rel.AnyOwner {
			continue
		}
		apiVersion, _ := ref["apiVersion"].(string)
		kind, _ := ref["kind"].(string)
		name, _ := ref["name"].(string)
		group := ""
		if i := strings.LastIndexByte(apiVersion, '/'); i >= 0 {
			group = apiVersion[:i]
		}
		if kind == parent.Kind && group == parent.Group && name != "" {
			out = append(out, causes.ObjectRef{Namespace: ns, Name: name})
		}
	}
	return out
}

// MappedParents normalizes what a mapped relation's function returned for obj: a
// cluster-scoped parent has no namespace, and a namespaced parent given without
// one is in obj's namespace. Empty names and repeats are dropped.
func MappedParents(refs []causes.ObjectRef, parentNamespaced bool, obj map[string]any) []causes.ObjectRef {
	meta, _ := obj["metadata"].(map[string]any)
	own, _ := meta["namespace"].(string)
	seen := make(map[causes.ObjectRef]bool, len(refs))
	out := make([]causes.ObjectRef, 0, len(refs))
	for _, r := range refs {
		switch {
		case !parentNamespaced:
			r.Namespace = ""
		case r.Namespace == "":
			r.Namespace = own
		}
		if r.Name == "" || seen[r] {
			continue
		}
		seen[r] = true
		out = append(out, r)
	}
	return out
}

// ForRelated is the cause of a handler of related objects: the object's current
// essence as both old and new (nothing of the object itself changed), and the
// changes of its related objects that this handler is given.
func ForRelated(resource causes.Resource, body map[string]any, essence any, related []causes.RelatedChange) causes.Cause {
	return causes.Cause{Reason: causes.Related, Resource: resource, Body: body, Old: essence, New: essence, Related: related}
}
