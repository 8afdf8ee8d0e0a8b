package luabind

import (
	"context"
	"slices"
	"sort"
	"strings"

	lua "github.com/luaop/luaop/third_party/gopher-lua"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"

	"github.com/luaop/luaop/processing/causes"
)

// luaop.reads(resource, opts) declares, at a script's top level, a resource the
// handlers read with luaop.kube.get and list: the operator keeps it in its informer
// cache (processing.ReadDeclarations), so that those reads are answered there, as the
// resources it watches already are. opts: labels (a table of name = value,
// luaop.PRESENT or luaop.ABSENT: only those objects are kept), metadata (true: the
// objects' metadata only). A declaration rather than a cache filled by the first read
// (controller-runtime's cache-backed client starts an informer on the first Get of a
// type): the list and watch start with the scripts, readiness waits for them, luaop
// rbac grants them from the source, and what the operator holds in memory is written
// where the reads are.

var readOptions = []string{"labels", "metadata"}

func (s *shard) registerReads(L *lua.LState) int {
	col := s.mustCollect(L, "luaop.reads")
	res := s.checkResource(L, 1)
	d := causes.Read{Resource: res, Source: s.where(L)}
	if opts := L.OptTable(2, nil); opts != nil {
		opts.ForEach(func(k, v lua.LValue) {
			switch name := k.String(); {
			case k.Type() != lua.LTString || !slices.Contains(readOptions, name):
				L.RaiseError("luaop.reads: unknown option %s; known options: %s", k.String(), strings.Join(readOptions, ", "))
			case name == "metadata":
				d.Metadata = lua.LVAsBool(v)
			case name == "labels":
				d.LabelSelector = s.readSelector(L, v)
			}
		})
	}
	if !slices.Contains(col.reads, d) {
		col.reads = append(col.reads, d)
	}
	return 0
}

// readSelector turns a reads' labels table into a label selector; functions are
// refused: the API server applies it.
func (s *shard) readSelector(L *lua.LState, v lua.LValue) string {
	t, ok := v.(*lua.LTable)
	if !ok {
		L.RaiseError("luaop.reads: option labels must be a table of name = value, luaop.PRESENT or luaop.ABSENT")
	}
	present, absent := presentMarker(L), absentMarker(L)
	var reqs []labels.Requirement
	t.ForEach(func(k, v lua.LValue) {
		key := k.String()
		var r *labels.Requirement
		var err error
		switch {
		case v == present:
			r, err = labels.NewRequirement(key, selection.Exists, nil)
		case v == absent:
			r, err = labels.NewRequirement(key, selection.DoesNotExist, nil)
		case v.Type() == lua.LTString:
			r, err = labels.NewRequirement(key, selection.Equals, []string{v.String()})
		default:
			L.RaiseError("luaop.reads: labels filter %q: use a string, luaop.PRESENT or luaop.ABSENT (the API server applies it: no function)", key)
		}
		if err != nil {
			L.RaiseError("luaop.reads: labels filter %q: %s", key, err.Error())
		}
		reqs = append(reqs, *r)
	})
	sort.Slice(reqs, func(i, j int) bool { return reqs[i].Key() < reqs[j].Key() })
	return labels.NewSelector().Add(reqs...).String()
}

// Reads are the reads the current scripts declare (luaop.reads), once each.
func (r *Runtime) Reads() []causes.Read { return r.gen.Load().reads }

// ValueFilter is a handler's value filter when it is a string the field must equal
// (field = "metadata.namespace", value = "prod"); ok is false for any other. With
// LabelFilters, it is what the API server could filter for the handler.
func (r *Runtime) ValueFilter(id string) (field []string, value string, ok bool) {
	f := r.gen.Load().filters[id]
	if f == nil || f.field == nil || f.value.mode != valueEquals {
		return nil, "", false
	}
	value, ok = f.value.v.(string)
	return f.field, value, ok
}

// LiveReads is the optional capability of a Kube whose reads are answered from the
// operator's cache to read from the API server instead, for the reads that pass
// {live = true} (kubeclient.Client has it). A Kube without it reads live already.
type LiveReads interface {
	GetLive(ctx context.Context, apiVersion, kind, namespace, name string) (map[string]any, error)
	ListLive(ctx context.Context, apiVersion, kind, namespace, selector string) ([]map[string]any, error)
}

// liveOption reads {live = true} from an options table.
func liveOption(opts lua.LValue) bool {
	t, ok := opts.(*lua.LTable)
	return ok && lua.LVAsBool(t.RawGetString("live"))
}

// readKube is the client of a read: its live reads when asked and available.
func (s *shard) readKube(L *lua.LState, live bool) Kube {
	k := s.kube(L)
	if lr, ok := k.(LiveReads); ok && live {
		return liveKube{Kube: k, live: lr}
	}
	return k
}

// liveKube is a Kube whose Get and List are its live reads.
type liveKube struct {
	Kube
	live LiveReads
}

func (l liveKube) Get(ctx context.Context, apiVersion, kind, namespace, name string) (map[string]any, error) {
	return l.live.GetLive(ctx, apiVersion, kind, namespace, name)
}

func (l liveKube) List(ctx context.Context, apiVersion, kind, namespace, selector string) ([]map[string]any, error) {
	return l.live.ListLive(ctx, apiVersion, kind, namespace, selector)
}
