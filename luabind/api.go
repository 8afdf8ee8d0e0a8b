package luabind

import (
	"fmt"
	"math"
	"path"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	lua "github.com/luaop/luaop/third_party/gopher-lua"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/luaop/luaop/luabind/internal/luaerr"
	"github.com/luaop/luaop/luabind/internal/luavalue"
	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/scriptapi"
	"github.com/luaop/luaop/state"
)

// newModule builds the `luaop` module of a shard: registration functions, markers,
// error constructors.
func (s *shard) newModule() *lua.LTable {
	L := s.L
	mod := L.NewTable()
	on := L.NewTable()
	for name, reasons := range map[string][]causes.Reason{
		"create": {causes.Create}, "update": {causes.Update}, "delete": {causes.Delete}, "resume": {causes.Resume},
	} {
		on.RawSetString(name, L.NewFunction(s.registerChange(name, reasons)))
	}
	on.RawSetString("field", L.NewFunction(s.registerField))
	on.RawSetString("related", L.NewFunction(s.registerRelated))
	on.RawSetString("event", L.NewFunction(s.registerKind(causes.KindEvent, "event")))
	on.RawSetString("validate", L.NewFunction(s.registerKind(causes.KindValidate, "validate")))
	on.RawSetString("mutate", L.NewFunction(s.registerKind(causes.KindMutate, "mutate")))
	for _, hook := range []causes.Kind{causes.KindStartup, causes.KindCleanup, causes.KindProbe} {
		on.RawSetString(string(hook), L.NewFunction(s.registerHook(hook)))
	}
	mod.RawSetString("on", on)
	mod.RawSetString("daemon", L.NewFunction(s.registerKind(causes.KindDaemon, "daemon")))
	mod.RawSetString("timer", L.NewFunction(s.registerKind(causes.KindTimer, "timer")))
	mod.RawSetString("index", L.NewFunction(s.registerKind(causes.KindIndex, "index")))
	mod.RawSetString("reads", L.NewFunction(s.registerReads))
	mod.RawSetString("PRESENT", presentMarker(L))
	mod.RawSetString("ABSENT", absentMarker(L))
	luavalue.InstallMarkers(L, mod)
	luaerr.InstallConstructors(L, mod)
	installAdmissionError(L, mod)
	s.installKube(mod)
	mod.RawSetString("metrics", s.metricsModule())
	s.runPrelude(mod)
	return mod
}

func presentMarker(L *lua.LState) lua.LValue { return markerUserdata(L, "luaop.PRESENT") }
func absentMarker(L *lua.LState) lua.LValue  { return markerUserdata(L, "luaop.ABSENT") }

// markerUserdata returns a per-state singleton userdata used as a filter marker.
func markerUserdata(L *lua.LState, name string) lua.LValue {
	reg := L.Get(lua.RegistryIndex).(*lua.LTable)
	if v := reg.RawGetString(name); v != lua.LNil {
		return v
	}
	ud := L.NewUserData()
	ud.Value = name
	mt := L.NewTable()
	mt.RawSetString("__tostring", L.NewFunction(func(L *lua.LState) int { L.Push(lua.LString(name)); return 1 }))
	mt.RawSetString("__metatable", lua.LFalse)
	L.SetMetatable(ud, mt)
	reg.RawSetString(name, ud)
	return ud
}

// parseResource reads "group/version/plural" or "version/plural" (core group).
// ParseResource parses a resource as scripts write it: "group/version/plural" or
// "v1/plural" (a kind or a short name in place of the plural is resolved later).
func ParseResource(s string) (causes.Resource, error) { return parseResource(s) }

func parseResource(s string) (causes.Resource, error) {
	parts := strings.Split(s, "/")
	switch len(parts) {
	case 3:
		return causes.Resource{GroupVersionResource: schema.GroupVersionResource{Group: parts[0], Version: parts[1], Resource: parts[2]}}, nil
	case 2:
		return causes.Resource{GroupVersionResource: schema.GroupVersionResource{Version: parts[0], Resource: parts[1]}}, nil
	}
	return causes.Resource{}, fmt.Errorf("resource %q: write it as \"group/version/plural\" (\"example.com/v1/widgets\") or \"v1/plural\" for the core group", s)
}

var validID = regexp.MustCompile(`^[A-Za-z0-9_][-A-Za-z0-9_./]*$`)

func (s *shard) where(L *lua.LState) string {
	return strings.TrimSuffix(strings.TrimSpace(L.Where(1)), ":")
}

func (s *shard) mustCollect(L *lua.LState, what string) *collected {
	if s.collecting == nil {
		L.RaiseError("%s: handlers can only be registered while the scripts load (at the top level of a script)", what)
	}
	return s.collecting
}

// registerChange makes on.create / on.update / on.delete / on.resume:
//
//	luaop.on.create("example.com/v1/widgets", function(ctx) ... end, {id = "...", retries = 3})
func (s *shard) registerChange(name string, reasons []causes.Reason) lua.LGFunction {
	return func(L *lua.LState) int {
		col := s.mustCollect(L, "luaop.on."+name)
		res := s.checkResource(L, 1)
		fn := L.CheckFunction(2)
		spec := causes.Spec{Kind: causes.KindChange, Resource: res, Reasons: reasons, Source: s.where(L)}
		s.add(L, col, spec, fn, L.OptTable(3, nil), name)
		return 0
	}
}

// registerField makes on.field(resource, "spec.path", fn, opts): an update (and
// create) handler for one field.
func (s *shard) registerField(L *lua.LState) int {
	col := s.mustCollect(L, "luaop.on.field")
	res := s.checkResource(L, 1)
	field := state.ParsePath(L.CheckString(2))
	if len(field) == 0 {
		L.ArgError(2, "a field path such as \"spec.size\" is required")
	}
	fn := L.CheckFunction(3)
	spec := causes.Spec{Kind: causes.KindChange, Resource: res, Reasons: []causes.Reason{causes.Create, causes.Update}, Field: field, Source: s.where(L)}
	s.add(L, col, spec, fn, L.OptTable(4, nil), "field_"+strings.Join(field, "_"))
	return 0
}

func (s *shard) registerKind(kind causes.Kind, name string) lua.LGFunction {
	return func(L *lua.LState) int {
		what := "luaop." + name
		if kind == causes.KindEvent || kind.IsAdmission() {
			what = "luaop.on." + name
		}
		col := s.mustCollect(L, what)
		res := s.checkResource(L, 1)
		fn := L.CheckFunction(2)
		spec := causes.Spec{Kind: kind, Resource: res, Source: s.where(L)}
		s.add(L, col, spec, fn, L.OptTable(3, nil), name)
		return 0
	}
}

func (s *shard) registerHook(kind causes.Kind) lua.LGFunction {
	return func(L *lua.LState) int {
		col := s.mustCollect(L, "luaop.on."+string(kind))
		fn := L.CheckFunction(1)
		spec := causes.Spec{Kind: kind, Source: s.where(L)}
		s.add(L, col, spec, fn, L.OptTable(2, nil), string(kind))
		return 0
	}
}

func (s *shard) checkResource(L *lua.LState, n int) causes.Resource {
	res, err := parseResource(L.CheckString(n))
	if err != nil {
		L.ArgError(n, err.Error())
	}
	return res
}

// add applies the options table, checks the id and records the handler.
func (s *shard) add(L *lua.LState, col *collected, spec causes.Spec, fn *lua.LFunction, opts *lua.LTable, suffix string) {
	fns := &handlerFns{fn: fn, param: lua.LNil}
	filters := &dataFilters{}
	if opts != nil {
		s.applyOptions(L, &spec, fns, filters, opts)
	}
	spec.NamedField = filters.field
	if spec.NamedField == nil {
		spec.NamedField = spec.Field
	}
	if spec.ID == "" {
		spec.ID = defaultID(col, spec.Source, suffix)
	}
	if !validID.MatchString(spec.ID) {
		L.RaiseError("handler id %q: use letters, digits, '_', '-', '.' and '/' only", spec.ID)
	}
	if spec.Kind == causes.KindTimer && spec.Interval <= 0 && spec.Idle <= 0 {
		// kopf: idle alone runs the timer once the object was idle that long, then
		// after each change and another idle period.
		L.RaiseError("timer %q needs an interval or idle in seconds: {interval = 60} or {idle = 300}", spec.ID)
	}
	if spec.Kind.IsAdmission() {
		checkAdmissionSpec(L, &spec, filters)
	}
	if prev, dup := col.sources[spec.ID]; dup {
		if s.mergeCauses(col, spec, fns, filters) {
			return // one function for two causes under one id (kopf's two decorators)
		}
		L.RaiseError("duplicate handler id %q (first registered at %s); give one of them another id = \"...\" (the same function may be registered for several causes under one id, with the same options)", spec.ID, prev)
	}
	col.sources[spec.ID] = spec.Source
	if other, clash := col.records[recordName(spec.ID)]; clash {
		L.RaiseError("handler id %q would share its progress record with handler %q (first registered at %s): in annotations both are %s; give one of them another id = \"...\"",
			spec.ID, other, col.sources[other], recordName(spec.ID))
	}
	col.records[recordName(spec.ID)] = spec.ID
	fns.setHasFilter()
	filters.hasCallbacks = fns.hasFilter
	col.fns[spec.ID] = fns
	if !filters.empty() {
		col.filters[spec.ID] = filters
	}
	switch {
	case spec.Kind.IsHook():
		col.hooks = append(col.hooks, spec)
	case spec.Kind.IsAdmission():
		col.admission = append(col.admission, spec)
	default:
		col.specs = append(col.specs, spec)
	}
}

// mergeCauses adds the reasons of spec to the change handler already registered
// under its id when both are the same function with the same options: kopf's two
// decorators on one function (@kopf.on.resume and @kopf.on.create) make one handler
// of both causes, one progress record. Anything else is a duplicate id.
func (s *shard) mergeCauses(col *collected, spec causes.Spec, fns *handlerFns, filters *dataFilters) bool {
	i := slices.IndexFunc(col.specs, func(x causes.Spec) bool { return x.ID == spec.ID })
	prevFns := col.fns[spec.ID]
	if i < 0 || spec.Kind != causes.KindChange || col.specs[i].Kind != causes.KindChange || prevFns == nil || prevFns.fn != fns.fn {
		return false
	}
	prev := col.specs[i]
	a, b := mergeRelations(prev, spec)
	a.Reasons, b.Reasons, a.Source, b.Source = nil, nil, "", ""
	fns.setHasFilter()
	filters.hasCallbacks = fns.hasFilter
	prevFilters := col.filters[spec.ID] // kept only when not empty
	sameFilters := prevFilters == nil && filters.empty() || prevFilters != nil && reflect.DeepEqual(*prevFilters, *filters)
	if !reflect.DeepEqual(a, b) || !sameFilters || !prevFns.same(fns) {
		return false
	}
	for _, r := range spec.Reasons {
		if !prev.Serves(r) {
			col.specs[i].Reasons = append(slices.Clone(col.specs[i].Reasons), r)
		}
	}
	if len(spec.Related) > 0 {
		col.specs[i].Related, prevFns.maps = spec.Related, fns.maps
	}
	return true
}

// defaultID derives a stable id from the file name and the handler kind, so that
// progress survives edits that move lines: "widgets.lua" + create -> "widgets_create".
func defaultID(col *collected, source, suffix string) string {
	file := source
	if i := strings.LastIndex(file, ":"); i > 0 {
		file = file[:i]
	}
	stem := strings.TrimSuffix(path.Base(file), ".lua")
	stem = strings.Map(func(r rune) rune {
		if r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' {
			return r
		}
		return '_'
	}, stem)
	id := stem + "_" + suffix
	col.stems[id]++
	if n := col.stems[id]; n > 1 {
		id = fmt.Sprintf("%s_%d", id, n)
	}
	return id
}

// knownOptionsList lists the handler options in an error message.
var knownOptionsList = strings.Join(scriptapi.HandlerOptions, ", ")

func (s *shard) applyOptions(L *lua.LState, spec *causes.Spec, fns *handlerFns, f *dataFilters, opts *lua.LTable) {
	opts.ForEach(func(k, v lua.LValue) {
		key, ok := k.(lua.LString)
		if !ok || !scriptapi.IsHandlerOption(string(key)) {
			L.RaiseError("unknown handler option %s; known options: %s", k.String(), knownOptionsList)
		}
		name := string(key)
		switch name {
		case "id":
			spec.ID = s.optString(L, name, v)
		case "retries":
			spec.Retries = int(s.optNumber(L, name, v, maxRetries, ""))
		case "backoff":
			spec.Backoff = s.optSeconds(L, name, v)
		case "timeout":
			spec.Timeout = s.optSeconds(L, name, v)
		case "errors":
			mode := causes.ErrorMode(s.optString(L, name, v))
			if mode != causes.ErrorsTemporary && mode != causes.ErrorsPermanent && mode != causes.ErrorsIgnored {
				L.RaiseError("option errors = %q: use \"temporary\", \"permanent\" or \"ignored\"", mode)
			}
			spec.Errors = mode
		case "param":
			fns.param = v
		case "labels", "annotations":
			t, ok := v.(*lua.LTable)
			if !ok {
				L.RaiseError("option %s must be a table of name = value, luaop.PRESENT, luaop.ABSENT or function(value, ctx)", name)
			}
			s.metaFilters(L, name, t, fns, f)
		case "field":
			f.field = state.ParsePath(s.optString(L, name, v))
			if spec.Kind == causes.KindChange {
				// kopf: on.update(field=...) serves changes of that field only,
				// with old/new/diff of the field.
				spec.Field = f.field
			}
		case "value":
			f.value = s.optValueFilter(L, name, v, &fns.valueFn)
		case "old", "new":
			if spec.Kind != causes.KindChange {
				L.RaiseError("option %s applies to change handlers only (on.create, on.update, on.delete, on.resume, on.field); use value = ... with field = ... to filter by the value in the body", name)
			}
			if name == "old" {
				f.old = s.optValueFilter(L, name, v, &fns.oldFn)
			} else {
				f.new = s.optValueFilter(L, name, v, &fns.newFn)
			}
		case "when":
			fn, ok := v.(*lua.LFunction)
			if !ok {
				L.RaiseError("option when must be a function(ctx) returning true or false")
			}
			fns.when = fn
		case "optional":
			spec.Optional = lua.LVAsBool(v)
		case "deleted":
			spec.Deleted = lua.LVAsBool(v)
		case "interval":
			spec.Interval = s.optSeconds(L, name, v)
		case "initial_delay":
			spec.InitialDelay = s.optSeconds(L, name, v)
		case "idle":
			spec.Idle = s.optSeconds(L, name, v)
		case "sharp":
			spec.Sharp = lua.LVAsBool(v)
		case "cancellation_timeout":
			spec.CancellationTimeout = s.optSeconds(L, name, v)
		case "cancellation_backoff":
			spec.CancellationBackoff = s.optSeconds(L, name, v)
		case "owned", "controller", "labelled", "mapped":
			s.relationOption(L, spec, fns, name, v)
		case "operations", "side_effects", "failure_policy", "subresource":
			if !spec.Kind.IsAdmission() {
				L.RaiseError("option %s applies to admission handlers only (luaop.on.validate, luaop.on.mutate)", name)
			}
			s.admissionOption(L, spec, name, v)
		}
	})
	s.finishRelations(L, spec, fns, f)
	f.change = spec.Kind == causes.KindChange
	if f.field == nil && spec.Field != nil {
		f.field = spec.Field
	}
	if f.value.mode != valueNone && f.field == nil {
		L.RaiseError("option value needs a field: {field = \"spec.mode\", value = ...}")
	}
}

func (s *shard) optString(L *lua.LState, name string, v lua.LValue) string {
	str, ok := v.(lua.LString)
	if !ok {
		L.RaiseError("option %s must be a string, got %s", name, v.Type())
	}
	return string(str)
}

// optNumber reads a number option: from 0 to max, neither NaN nor infinite (NaN
// passed every comparison, so `timeout = 0/0` was accepted and the Go conversion
// of it undefined). The error names the registration's line.
func (s *shard) optNumber(L *lua.LState, name string, v lua.LValue, max float64, unit string) float64 {
	n, ok := v.(lua.LNumber)
	if !ok || !(n >= 0 && float64(n) <= max) { // NaN fails both
		L.RaiseError("option %s must be a number from 0 to %g%s, got %s", name, max, unit, luavalue.Describe(v, 64))
	}
	return float64(n)
}

// maxOptionSeconds bounds the options in seconds: about 31 years, within a
// time.Duration.
const maxOptionSeconds = 1e9

// maxRetries bounds the retries option (an int32, and more than any handler means).
const maxRetries = math.MaxInt32

func (s *shard) optSeconds(L *lua.LState, name string, v lua.LValue) time.Duration {
	return time.Duration(s.optNumber(L, name, v, maxOptionSeconds, " seconds") * float64(time.Second))
}

// optValueFilter reads a value, old or new option: a value to equal, luaop.PRESENT,
// luaop.ABSENT or a function(value, ctx) (stored in *fn, run by the shard).
func (s *shard) optValueFilter(L *lua.LState, name string, v lua.LValue, fn **lua.LFunction) valueFilter {
	switch {
	case v == presentMarker(L):
		return valueFilter{mode: valuePresent}
	case v == absentMarker(L):
		return valueFilter{mode: valueAbsent}
	case v.Type() == lua.LTFunction:
		*fn = v.(*lua.LFunction)
		return valueFilter{mode: valueCallback}
	}
	out, err := luavalue.FromLua(v)
	if err != nil {
		L.RaiseError("option %s: %s (use a value, luaop.PRESENT, luaop.ABSENT or a function(value, ctx))", name, err.Error())
	}
	return valueFilter{mode: valueEquals, v: out}
}

func (s *shard) metaFilters(L *lua.LState, name string, t *lua.LTable, fns *handlerFns, f *dataFilters) {
	present, absent := presentMarker(L), absentMarker(L)
	t.ForEach(func(k, v lua.LValue) {
		key := k.String()
		var mf metaFilter
		switch {
		case v == present:
			mf = metaFilter{key: key, mode: metaPresent}
		case v == absent:
			mf = metaFilter{key: key, mode: metaAbsent}
		case v.Type() == lua.LTFunction:
			if name == "labels" {
				if fns.labelFns == nil {
					fns.labelFns = map[string]*lua.LFunction{}
				}
				fns.labelFns[key] = v.(*lua.LFunction)
			} else {
				if fns.annotFns == nil {
					fns.annotFns = map[string]*lua.LFunction{}
				}
				fns.annotFns[key] = v.(*lua.LFunction)
			}
			return
		case v.Type() == lua.LTString:
			mf = metaFilter{key: key, mode: metaEquals, value: v.String()}
		default:
			L.RaiseError("%s filter %q: use a string, luaop.PRESENT, luaop.ABSENT or a function(value, ctx)", name, key)
		}
		if name == "labels" {
			f.labels = append(f.labels, mf)
		} else {
			f.annotations = append(f.annotations, mf)
		}
	})
}

// recordName is the name of a handler's progress record in annotations storage
// (state.AnnotationKey without the prefix): ids that differ only in characters an
// annotation name cannot hold ("a/b", "a:b", "a.b") share it, so the runtime refuses
// them (one handler's record would stand for the other's: a run lost).
func recordName(id string) string {
	return strings.TrimPrefix(state.AnnotationKey("p", id), "p/")
}
