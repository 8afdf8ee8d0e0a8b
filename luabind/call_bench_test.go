package luabind

import (
	"fmt"
	"reflect"
	"sync/atomic"
	"testing"

	"github.com/luaop/luaop/luabind/internal/luatest"
	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// Benchmarks of one handler call through Runtime.Invoke / Runtime.Match, as the
// processing core makes it: the ~5 KB Deployment of testdata goes in as a lazy proxy,
// the handler reads two fields, and the result (and patch) come back as Go values.

const benchScript = `local luaop = require("luaop")
local R = "apps/v1/deployments"
luaop.on.update(R, function(ctx)
  return {ok = true, replicas = ctx.spec.replicas, name = ctx.name}
end, {id = "read"})
luaop.on.update(R, function(ctx)
  ctx.patch.status.phase = "Ready"
  return {ok = true, replicas = ctx.spec.replicas, name = ctx.name}
end, {id = "patch"})
luaop.on.update(R, function() end, {id = "when", when = function(ctx)
  return ctx.spec.replicas > 1 and ctx.name ~= nil
end})
`

func benchSetup(b *testing.B, shards int) (*Runtime, map[string]any) {
	b.Helper()
	obj := luatest.LoadFile(b, "deployment.json").(map[string]any)
	return loadedRuntime(b, Options{Shards: shards}, "bench.lua", benchScript), obj
}

func benchInvoke(b *testing.B, id string, wantPatch map[string]any) {
	rt, obj := benchSetup(b, 1)
	ctx := b.Context()
	call := causes.Call{Handler: specOf(b, rt, id), Cause: causes.Cause{Reason: causes.Update, Body: obj}}
	replicas := obj["spec"].(map[string]any)["replicas"]
	name := obj["metadata"].(map[string]any)["name"]

	// Check once what a user would check.
	call.Patch = state.NewPatch()
	res, err := rt.Invoke(ctx, call)
	if err != nil {
		b.Fatal(err)
	}
	want := map[string]any{"ok": true, "replicas": replicas, "name": name}
	if !reflect.DeepEqual(res.Value, want) {
		b.Fatalf("result %#v, want %#v", res.Value, want)
	}
	if !reflect.DeepEqual(call.Patch.Map(), wantPatch) {
		b.Fatalf("patch %#v, want %#v", call.Patch.Map(), wantPatch)
	}

	b.ReportAllocs()
	for b.Loop() {
		call.Patch = state.NewPatch()
		if _, err := rt.Invoke(ctx, call); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkInvoke5KB: read ctx.spec.replicas and ctx.name, return a small table.
func BenchmarkInvoke5KB(b *testing.B) {
	benchInvoke(b, "read", map[string]any{})
}

// BenchmarkInvoke5KBWithPatch: the same, plus ctx.patch.status.phase = "Ready".
func BenchmarkInvoke5KBWithPatch(b *testing.B) {
	benchInvoke(b, "patch", map[string]any{"status": map[string]any{"phase": "Ready"}})
}

// BenchmarkInvoke5KBParallel: BenchmarkInvoke5KB from GOMAXPROCS goroutines on
// different objects, one shard per CPU (the default).
func BenchmarkInvoke5KBParallel(b *testing.B) {
	rt, obj := benchSetup(b, 0)
	spec := specOf(b, rt, "read")
	var next atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		// Each goroutine works on its own object (its own uid, so its own shard mostly).
		mine := map[string]any{}
		for k, v := range obj {
			mine[k] = v
		}
		meta := map[string]any{}
		for k, v := range obj["metadata"].(map[string]any) {
			meta[k] = v
		}
		meta["uid"] = fmt.Sprintf("uid-%d", next.Add(1))
		mine["metadata"] = meta
		call := causes.Call{Handler: spec, Cause: causes.Cause{Reason: causes.Update, Body: mine}}
		for pb.Next() {
			call.Patch = state.NewPatch()
			if _, err := rt.Invoke(b.Context(), call); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkMatchWhen: a `when` filter reading two fields.
func BenchmarkMatchWhen(b *testing.B) {
	rt, obj := benchSetup(b, 1)
	ctx := b.Context()
	spec := specOf(b, rt, "when")
	cause := causes.Cause{Reason: causes.Update, Body: obj}
	if ok, err := rt.Match(ctx, spec, cause); err != nil || !ok {
		b.Fatalf("Match = %v, %v", ok, err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := rt.Match(ctx, spec, cause); err != nil {
			b.Fatal(err)
		}
	}
}
