package luabind

import (
	"context"
	"fmt"
	"slices"
	"strings"

	lua "github.com/luaop/luaop/third_party/gopher-lua"

	"github.com/luaop/luaop/luabind/internal/luavalue"
	"github.com/luaop/luaop/processing/causes"
)

// registerRelated makes on.related(resource, fn, opts): a change handler of
// resource's objects that runs when objects related to one of them (owned,
// labelled or mapped, in opts) are created, changed or deleted:
//
//	luaop.on.related("example.com/v1/tenants", heal, {id = "heal", owned = {"v1/namespaces"}})
func (s *shard) registerRelated(L *lua.LState) int {
	col := s.mustCollect(L, "luaop.on.related")
	res := s.checkResource(L, 1)
	fn := L.CheckFunction(2)
	// A non-nil Related marks the registration that takes the relation options
	// (finishRelations); subhandlers and other handlers refuse them.
	spec := causes.Spec{Kind: causes.KindChange, Resource: res, Reasons: []causes.Reason{causes.Related},
		Related: []causes.Relation{}, Source: s.where(L)}
	s.add(L, col, spec, fn, L.OptTable(3, nil), "related")
	return 0
}

// relationOption reads one of the options naming related objects (owned,
// controller, labelled, mapped) into the spec (data) and fns (mapping functions).
func (s *shard) relationOption(L *lua.LState, spec *causes.Spec, fns *handlerFns, name string, v lua.LValue) {
	if spec.Related == nil {
		L.RaiseError("option %s applies to luaop.on.related only", name)
	}
	switch name {
	case "owned":
		var list []lua.LValue
		switch t := v.(type) {
		case lua.LString:
			list = []lua.LValue{t}
		case *lua.LTable:
			t.ForEach(func(_, x lua.LValue) { list = append(list, x) })
		default:
			L.RaiseError("option owned must be a resource (\"v1/configmaps\") or a list of them")
		}
		for _, x := range list {
			str, ok := x.(lua.LString)
			if !ok {
				L.RaiseError("option owned must be a resource (\"v1/configmaps\") or a list of them, got a %s in the list", x.Type())
			}
			spec.Related = append(spec.Related, causes.Relation{Kind: causes.RelationOwned, Resource: s.relatedResource(L, name, string(str))})
		}
	case "controller":
		if v.Type() != lua.LTBool {
			L.RaiseError("option controller must be true (the controller owner reference only, the default) or false (any owner reference)")
		}
		fns.anyOwner = v == lua.LFalse
	case "labelled":
		s.relationTable(L, name, v, func(res causes.Resource, x lua.LValue) {
			label, ok := x.(lua.LString)
			if !ok || label == "" {
				L.RaiseError("option labelled: the label of %s must be a string: {[\"v1/configmaps\"] = \"example.com/owner\"}", res)
			}
			spec.Related = append(spec.Related, causes.Relation{Kind: causes.RelationLabelled, Resource: res, Label: string(label)})
		})
	case "mapped":
		s.relationTable(L, name, v, func(res causes.Resource, x lua.LValue) {
			fn, ok := x.(*lua.LFunction)
			if !ok {
				L.RaiseError("option mapped: the value of %s must be a function(ctx) returning the objects it relates to: {[\"v1/namespaces\"] = function(ctx) return {{namespace = \"a\", name = \"b\"}} end}", res)
			}
			if fns.maps == nil {
				fns.maps = map[string]*lua.LFunction{}
			}
			fns.maps[res.String()] = fn
			spec.Related = append(spec.Related, causes.Relation{Kind: causes.RelationMapped, Resource: res})
		})
	}
}

// relationTable reads a table resource -> value (labelled, mapped).
func (s *shard) relationTable(L *lua.LState, name string, v lua.LValue, each func(causes.Resource, lua.LValue)) {
	t, ok := v.(*lua.LTable)
	if !ok {
		L.RaiseError("option %s must be a table keyed by resource: {[\"v1/configmaps\"] = ...}", name)
	}
	t.ForEach(func(k, x lua.LValue) {
		key, ok := k.(lua.LString)
		if !ok {
			L.RaiseError("option %s must be a table keyed by resource: {[\"v1/configmaps\"] = ...}", name)
		}
		each(s.relatedResource(L, name, string(key)), x)
	})
}

func (s *shard) relatedResource(L *lua.LState, option, spelling string) causes.Resource {
	res, err := parseResource(spelling)
	if err != nil {
		L.RaiseError("option %s: %s", option, err.Error())
	}
	return res
}

// finishRelations checks a registration's relations once its options are read:
// luaop.on.related needs at least one, in a stable order (its code hash and the
// watches follow it), and takes no field or old/new filter (nothing of its own
// object changes in its causes).
func (s *shard) finishRelations(L *lua.LState, spec *causes.Spec, fns *handlerFns, f *dataFilters) {
	if spec.Related == nil {
		return
	}
	if len(spec.Related) == 0 {
		L.RaiseError("luaop.on.related needs the objects that trigger it: owned = {\"v1/configmaps\"}, labelled = {[\"v1/configmaps\"] = \"label\"} or mapped = {[\"v1/namespaces\"] = function(ctx) ... end}")
	}
	if f.field != nil || f.old.mode != valueNone || f.new.mode != valueNone {
		L.RaiseError("luaop.on.related: options field, value, old and new do not apply (nothing of the object itself changes in a related cause); filter with labels, annotations or when")
	}
	for i := range spec.Related {
		if spec.Related[i].Kind == causes.RelationOwned {
			spec.Related[i].AnyOwner = fns.anyOwner
		}
	}
	slices.SortFunc(spec.Related, func(a, b causes.Relation) int {
		return strings.Compare(string(a.Kind)+" "+a.Resource.String()+" "+a.Label, string(b.Kind)+" "+b.Resource.String()+" "+b.Label)
	})
	for i := 1; i < len(spec.Related); i++ {
		if a, b := spec.Related[i-1], spec.Related[i]; a.Kind == b.Kind && a.Resource == b.Resource {
			L.RaiseError("luaop.on.related: %s is %s twice; name each resource once per kind of relation", a.Resource, a.Kind)
		}
	}
}

// mergeRelations lets one function registered for other causes and for related
// changes under one id be one handler (as on.create and on.resume are): the
// relations of the related registration go to the merged handler. It returns
// the specs to compare (relations left out when only one side has them).
func mergeRelations(prev, spec causes.Spec) (a, b causes.Spec) {
	a, b = prev, spec
	if len(a.Related) == 0 || len(b.Related) == 0 {
		a.Related, b.Related = nil, nil
	}
	return a, b
}

// MapRelated runs a mapped relation's function on one related object
// (processing.RelatedMapper): the objects of the handler's resource it relates
// the object to.
func (r *Runtime) MapRelated(ctx context.Context, call causes.Call, relation int) ([]causes.ObjectRef, error) {
	uid := uidOf(call.Cause.Body)
	return withShard(ctx, func() *shard { return r.shardFor(uid) }, func(sh *shard) ([]causes.ObjectRef, error) {
		return sh.mapRelated(ctx, call, relation)
	})
}

func (s *shard) mapRelated(ctx context.Context, call causes.Call, relation int) ([]causes.ObjectRef, error) {
	if relation < 0 || relation >= len(call.Handler.Related) {
		return nil, fmt.Errorf("handler %s has no relation %d", call.Handler.ID, relation)
	}
	res := call.Handler.Related[relation].Resource
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.unlock()
	fns := s.fns[call.Handler.ID]
	var fn *lua.LFunction
	if fns != nil {
		fn = fns.maps[res.String()]
	}
	if fn == nil {
		return nil, fmt.Errorf("handler %s maps %s with no function now (removed by a script reload)", call.Handler.ID, res)
	}
	ret, cs, err := s.call(ctx, fn, call, fns)
	defer s.endPatch(cs)
	if err != nil {
		return nil, fmt.Errorf("mapped = {[%q] = ...} of %s: %w", res.String(), call.Handler.ID, err)
	}
	refs, err := objectRefs(ret)
	if err != nil {
		return nil, fmt.Errorf("mapped = {[%q] = ...} of %s: %s", res.String(), call.Handler.ID, err)
	}
	return refs, nil
}

// objectRefs reads what a mapping function returned: nil (none), or a list of
// {namespace = ..., name = ...} tables or "namespace/name" (or "name") strings; a
// read-only view (an index's list, ctx.indexes.x.key) is read as its values.
func objectRefs(v lua.LValue) ([]causes.ObjectRef, error) {
	if v == lua.LNil {
		return nil, nil
	}
	value, err := luavalue.FromLua(v)
	if err != nil {
		return nil, err
	}
	var items []any
	switch x := value.(type) {
	case []any:
		items = x
	case map[string]any:
		if len(x) > 0 { // an empty table converts to an empty map
			return nil, fmt.Errorf("return a list of objects ({{namespace = \"a\", name = \"b\"}} or {\"a/b\"}), not a table with keys")
		}
	default:
		return nil, fmt.Errorf("return a list of objects ({{namespace = \"a\", name = \"b\"}} or {\"a/b\"}), not a %s", v.Type())
	}
	out := make([]causes.ObjectRef, 0, len(items))
	for _, item := range items {
		switch x := item.(type) {
		case string:
			ns, name, found := strings.Cut(x, "/")
			if !found {
				ns, name = "", ns
			}
			out = append(out, causes.ObjectRef{Namespace: ns, Name: name})
		case map[string]any:
			name, _ := x["name"].(string)
			ns, _ := x["namespace"].(string)
			if name == "" {
				return nil, fmt.Errorf("an object of the list has no name: give {namespace = \"a\", name = \"b\"}")
			}
			out = append(out, causes.ObjectRef{Namespace: ns, Name: name})
		default:
			return nil, fmt.Errorf("the list holds a %T: give {namespace = \"a\", name = \"b\"} tables or \"a/b\" strings", item)
		}
	}
	return out, nil
}

// relatedToLua is ctx.related of a related cause: the list of changes of related
// objects the handler is given, each {relation, resource, kind, namespace, name,
// type, object, old, new} (objects as read-only views; old is nil for ADDED, new
// for DELETED). nil for any other cause.
func relatedToLua(L *lua.LState, cause causes.Cause) lua.LValue {
	if cause.Reason != causes.Related {
		return lua.LNil
	}
	list := L.CreateTable(len(cause.Related), 0)
	for _, ch := range cause.Related {
		e := L.CreateTable(0, 10)
		e.RawSetString("relation", lua.LString(ch.Relation))
		e.RawSetString("resource", lua.LString(ch.Resource.String()))
		e.RawSetString("kind", lua.LString(ch.Kind))
		if ch.Namespace != "" {
			e.RawSetString("namespace", lua.LString(ch.Namespace))
		}
		e.RawSetString("name", lua.LString(ch.Name))
		e.RawSetString("type", lua.LString(ch.Type))
		if ch.Object != nil {
			e.RawSetString("object", luavalue.NewProxyNamed(L, ch.Object, "ctx.related[].object"))
		}
		if ch.Old != nil && ch.Type != "ADDED" {
			e.RawSetString("old", luavalue.NewProxyNamed(L, ch.Old, "ctx.related[].old"))
		}
		if ch.Object != nil && ch.Type != "DELETED" {
			e.RawSetString("new", luavalue.NewProxyNamed(L, ch.Object, "ctx.related[].new"))
		}
		list.Append(e)
	}
	return list
}
