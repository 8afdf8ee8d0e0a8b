package luabind

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// Tests of the Runtime as the processing core uses it: Load, Specs, Hooks, Match,
// Invoke, Forget.

const widgetsResource = "example.com/v1/widgets"

// scriptsOf builds scripts from name, source pairs.
func scriptsOf(pairs ...string) []Script {
	var out []Script
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, Script{Name: pairs[i], Source: []byte(pairs[i+1])})
	}
	return out
}

// newTestRuntime makes a runtime with a quiet logger and 2 shards unless told otherwise.
func newTestRuntime(t testing.TB, opts Options) *Runtime {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.Shards == 0 {
		opts.Shards = 2
	}
	rt := New(opts)
	t.Cleanup(rt.Close)
	return rt
}

func mustLoad(t testing.TB, rt *Runtime, pairs ...string) LoadReport {
	t.Helper()
	rep, err := rt.Load(t.Context(), scriptsOf(pairs...))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return rep
}

// loadedRuntime is newTestRuntime + mustLoad.
func loadedRuntime(t testing.TB, opts Options, pairs ...string) *Runtime {
	t.Helper()
	rt := newTestRuntime(t, opts)
	mustLoad(t, rt, pairs...)
	return rt
}

// specOf finds a handler (or hook) by id in the current generation.
func specOf(t testing.TB, rt *Runtime, id string) causes.Spec {
	t.Helper()
	for _, s := range append(append([]causes.Spec(nil), rt.Specs()...), rt.Hooks()...) {
		if s.ID == id {
			return s
		}
	}
	t.Fatalf("no handler %q; have %v", id, specIDs(rt.Specs()))
	return causes.Spec{}
}

func findSpec(specs []causes.Spec, id string) causes.Spec {
	for _, s := range specs {
		if s.ID == id {
			return s
		}
	}
	return causes.Spec{ID: id}
}

func specIDs(specs []causes.Spec) []string {
	ids := []string{}
	for _, s := range specs {
		ids = append(ids, s.ID)
	}
	return ids
}

// widgetObject is a small Widget as client-go decodes it.
func widgetObject(uid string) map[string]any {
	return map[string]any{
		"apiVersion": "example.com/v1",
		"kind":       "Widget",
		"metadata": map[string]any{
			"name": "w1", "namespace": "ns1", "uid": uid,
			"labels":      map[string]any{"app": "x", "tier": "web"},
			"annotations": map[string]any{"example.com/note": "hi"},
		},
		"spec":   map[string]any{"size": int64(3), "mode": "on", "items": []any{"a", "b"}},
		"status": map[string]any{"phase": "Pending"},
	}
}

func createCause(uid string) causes.Cause {
	return causes.Cause{Reason: causes.Create, Resource: causes.Resource{}, Body: widgetObject(uid)}
}

// invokeHandler runs handler id for the cause with a fresh patch.
func invokeHandler(t testing.TB, rt *Runtime, id string, cause causes.Cause) (causes.Result, *state.Patch, error) {
	t.Helper()
	patch := state.NewPatch()
	res, err := rt.Invoke(t.Context(), causes.Call{Handler: specOf(t, rt, id), Cause: cause, Patch: patch})
	return res, patch, err
}

func mustInvoke(t testing.TB, rt *Runtime, id string, cause causes.Cause) causes.Result {
	t.Helper()
	res, _, err := invokeHandler(t, rt, id, cause)
	if err != nil {
		t.Fatalf("Invoke %s: %v", id, err)
	}
	return res
}

// checkScriptError asserts err is a *ScriptError at file:line (line 0: any, -1: none) whose text
// contains every want.
func checkScriptError(t *testing.T, err error, file string, line int, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error; want %s:%d %q", file, line, want)
	}
	var se *ScriptError
	if !errors.As(err, &se) {
		t.Fatalf("error %T %q is not a *ScriptError", err, err)
	}
	if file != "" && se.File != file {
		t.Errorf("File = %q, want %q (error %q)", se.File, file, err)
	}
	if line < 0 && se.Line != 0 {
		t.Errorf("Line = %d, want 0 (no line) (error %q)", se.Line, err)
	}
	if line > 0 && se.Line != line {
		t.Errorf("Line = %d, want %d (error %q)", se.Line, line, err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not contain %q", err, w)
		}
	}
}

// ---------------------------------------------------------------- Load

func TestLoadErrors(t *testing.T) {
	okScript := `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function(ctx) return 1 end, {id = "ok"})
`
	cases := []struct {
		name    string
		scripts []string
		file    string // "" when the error need not be a *ScriptError
		line    int
		want    []string
	}{
		{
			name:    "syntax error",
			scripts: []string{"a.lua", okScript, "broken.lua", "local x = 1\nlocal y = = 2\n"},
			file:    "broken.lua", line: 2, want: []string{"broken.lua:2", "syntax error"},
		},
		{
			name:    "syntax error at end of file",
			scripts: []string{"broken.lua", "local luaop = require('luaop')\nfunction f()\n"},
			file:    "broken.lua", line: -1, want: []string{"broken.lua: syntax error at end of file"},
		},
		{
			name:    "calling nil at top level",
			scripts: []string{"boom.lua", "local luaop = require('luaop')\n\nlocal f = nil\nf()\n"},
			file:    "boom.lua", line: 4, want: []string{"boom.lua:4"},
		},
		{
			name:    "error() at top level",
			scripts: []string{"boom.lua", "error('refusing to load')\n"},
			file:    "boom.lua", line: 1, want: []string{"boom.lua:1", "refusing to load"},
		},
		{
			name: "duplicate id across files",
			scripts: []string{
				"a.lua", "local luaop = require('luaop')\nluaop.on.create('example.com/v1/widgets', function() end, {id = 'same'})\n",
				"b.lua", "local luaop = require('luaop')\n\nluaop.on.update('example.com/v1/widgets', function() end, {id = 'same'})\n",
			},
			want: []string{`"same"`, "a.lua:2", "b.lua:3"},
		},
		{
			name:    "duplicate default id is impossible, duplicate explicit id in one file",
			scripts: []string{"a.lua", "local luaop = require('luaop')\nluaop.on.create('v1/pods', function() end, {id = 'x'})\nluaop.on.delete('v1/pods', function() end, {id = 'x'})\n"},
			want:    []string{`"x"`, "a.lua:2", "a.lua:3"},
		},
		{
			name:    "unknown option (typo)",
			scripts: []string{"typo.lua", "local luaop = require('luaop')\nluaop.on.create('example.com/v1/widgets', function() end, {retires = 3})\n"},
			want:    []string{"typo.lua:2", "unknown handler option retires", "retries"},
		},
		{
			name:    "bad option type",
			scripts: []string{"opt.lua", "local luaop = require('luaop')\nluaop.on.create('example.com/v1/widgets', function() end, {retries = 'three'})\n"},
			want:    []string{"opt.lua:2", "retries"},
		},
		{
			name:    "bad errors mode",
			scripts: []string{"opt.lua", "local luaop = require('luaop')\nluaop.on.create('example.com/v1/widgets', function() end, {errors = 'sometimes'})\n"},
			want:    []string{"opt.lua:2", "sometimes", "temporary"},
		},
		{
			name:    "bad resource string",
			scripts: []string{"res.lua", "local luaop = require('luaop')\nluaop.on.create('widgets', function() end)\n"},
			want:    []string{"res.lua:2", `"widgets"`, "group/version/plural"},
		},
		{
			name:    "resource with too many parts",
			scripts: []string{"res.lua", "local luaop = require('luaop')\nluaop.on.create('a/b/c/d', function() end)\n"},
			want:    []string{"res.lua:2", `"a/b/c/d"`},
		},
		{
			name:    "handler is not a function",
			scripts: []string{"fn.lua", "local luaop = require('luaop')\nluaop.on.create('example.com/v1/widgets', 42)\n"},
			want:    []string{"fn.lua:2", "function"},
		},
		{
			name:    "invalid id",
			scripts: []string{"id.lua", "local luaop = require('luaop')\nluaop.on.create('example.com/v1/widgets', function() end, {id = 'has space'})\n"},
			want:    []string{"id.lua:2", "has space"},
		},
		{
			name:    "missing module",
			scripts: []string{"main.lua", "local luaop = require('luaop')\nlocal u = require('lib.nothere')\n"},
			want:    []string{"main.lua:2", "module 'lib.nothere' not found", "lib/nothere.lua"},
		},
		{
			name: "error inside a required module names the module",
			scripts: []string{
				"main.lua", "local u = require('lib.bad')\n",
				"lib/bad.lua", "local x = 1\nerror('bad module')\n",
			},
			want: []string{"lib/bad.lua:2", "bad module"},
		},
		{
			name: "require loop",
			scripts: []string{
				"main.lua", "require('lib.a')\n",
				"lib/a.lua", "require('lib.b')\nreturn {}\n",
				"lib/b.lua", "require('lib.a')\nreturn {}\n",
			},
			want: []string{"lib.a", "loop"},
		},
		{
			name:    "hook is not a function",
			scripts: []string{"hook.lua", "local luaop = require('luaop')\nluaop.on.startup('not a function')\n"},
			want:    []string{"hook.lua:2", "function"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rt := newTestRuntime(t, Options{})
			_, err := rt.Load(t.Context(), scriptsOf(tc.scripts...))
			if err == nil {
				t.Fatalf("Load succeeded; specs %v", specIDs(rt.Specs()))
			}
			t.Logf("error: %v", err)
			if tc.file != "" {
				checkScriptError(t, err, tc.file, tc.line, tc.want...)
			} else {
				for _, w := range tc.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not contain %q", err, w)
					}
				}
			}
			if len(rt.Specs()) != 0 || len(rt.Hooks()) != 0 || rt.Hash() != "" {
				t.Errorf("a failed first load left specs %v hooks %v hash %q", specIDs(rt.Specs()), specIDs(rt.Hooks()), rt.Hash())
			}
		})
	}
}

func TestLoadTimeout(t *testing.T) {
	rt := newTestRuntime(t, Options{HandlerTimeout: 200 * time.Millisecond})
	start := time.Now()
	_, err := rt.Load(t.Context(), scriptsOf("spin.lua", "local n = 0\nwhile true do n = n + 1 end\n"))
	if err == nil {
		t.Fatal("an endless loop at the top level loaded")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("load took %s with a 200ms deadline", took)
	}
	checkScriptError(t, err, "spin.lua", 2)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("errors.Is(err, DeadlineExceeded) = false for %q", err)
	}
	// The runtime still loads.
	mustLoad(t, rt, "ok.lua", "require('luaop').on.create('v1/pods', function() return 1 end, {id = 'ok'})")
}

func TestLoadFailureKeepsPreviousGeneration(t *testing.T) {
	v1 := `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function(ctx) return "v1" end, {id = "h"})
`
	v2 := `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function(ctx) return "v2" end, {id = "h"})
luaop.on.update("example.com/v1/widgets", function(ctx) return "new" end, {id = "added"})
`
	cases := []struct {
		name    string
		scripts []string
	}{
		{"syntax error in another file", []string{"a.lua", v2, "z.lua", "this is not lua"}},
		{"runtime error after registering", []string{"a.lua", v2, "z.lua", "local t = nil\nprint(t.x)\n"}},
		{"duplicate id", []string{"a.lua", v2, "b.lua", "require('luaop').on.create('v1/pods', function() end, {id = 'added'})"}},
		{"unknown option", []string{"a.lua", v2, "b.lua", "require('luaop').on.create('v1/pods', function() end, {retires = 1})"}},
		{"missing module", []string{"a.lua", v2, "b.lua", "require('nope')"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rt := loadedRuntime(t, Options{Shards: 3}, "a.lua", v1)
			specs, hash := rt.Specs(), rt.Hash()
			if _, err := rt.Load(t.Context(), scriptsOf(tc.scripts...)); err == nil {
				t.Fatal("the broken load succeeded")
			}
			if !reflect.DeepEqual(rt.Specs(), specs) || rt.Hash() != hash {
				t.Errorf("specs/hash changed: %v -> %v", specIDs(specs), specIDs(rt.Specs()))
			}
			// Every shard still runs the old code.
			for i := 0; i < 12; i++ {
				res, _, err := invokeHandler(t, rt, "h", createCause(fmt.Sprintf("uid-%d", i)))
				if err != nil || res.Value != "v1" {
					t.Fatalf("uid-%d: Invoke = %v, %v; want v1", i, res.Value, err)
				}
			}
			// A good reload then swaps at once.
			mustLoad(t, rt, "a.lua", v2)
			for i := 0; i < 12; i++ {
				res, _, err := invokeHandler(t, rt, "h", createCause(fmt.Sprintf("uid-%d", i)))
				if err != nil || res.Value != "v2" {
					t.Fatalf("uid-%d after reload: Invoke = %v, %v; want v2", i, res.Value, err)
				}
			}
			if got := specIDs(rt.Specs()); !reflect.DeepEqual(got, []string{"h", "added"}) {
				t.Errorf("specs after reload = %v", got)
			}
		})
	}
}

func TestReloadRemovesHandler(t *testing.T) {
	rt := loadedRuntime(t, Options{}, "a.lua", `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function(ctx) return 1 end, {id = "gone"})
luaop.on.create("example.com/v1/widgets", function(ctx) return 2 end, {id = "kept"})
`)
	old := specOf(t, rt, "gone")
	mustLoad(t, rt, "a.lua", `require("luaop").on.create("example.com/v1/widgets", function(ctx) return 3 end, {id = "kept"})`)
	_, err := rt.Invoke(t.Context(), causes.Call{Handler: old, Cause: createCause("u1"), Patch: state.NewPatch()})
	if !causes.IsPermanent(err) || !strings.Contains(err.Error(), "gone") {
		t.Errorf("Invoke of a removed handler = %v; want a PermanentError naming it", err)
	}
	if res := mustInvoke(t, rt, "kept", createCause("u1")); res.Value != int64(3) {
		t.Errorf("kept = %#v, want 3", res.Value)
	}
}

func TestLoadModules(t *testing.T) {
	rt := loadedRuntime(t, Options{},
		"main.lua", `local luaop = require("luaop")
local util = require("lib.util")
local pkg = require("lib")
local again = require("lib.util")
luaop.on.create("example.com/v1/widgets", function(ctx)
  return {double = util.double(ctx.spec.size), same = (util == again), pkg = pkg.name, loads = util.loads()}
end, {id = "mod"})
`,
		"lib/util.lua", `local M = {}
local loads = (M.loads or 0) + 1
UTIL_LOADS = (UTIL_LOADS or 0) + 1
function M.double(x) return 2 * x end
function M.loads() return UTIL_LOADS end
return M
`,
		"lib/init.lua", `return {name = "lib"}`,
		// Modules in subfolders only run when required.
		"lib/never.lua", `error("lib/never.lua must not run")`,
		"lib/registers.lua", `require("luaop").on.create("v1/pods", function() end, {id = "from_unrequired_module"})`,
	)
	if got := specIDs(rt.Specs()); !reflect.DeepEqual(got, []string{"mod"}) {
		t.Errorf("specs = %v, want [mod] (modules in subfolders must not run unless required)", got)
	}
	res := mustInvoke(t, rt, "mod", createCause("u1"))
	want := map[string]any{"double": int64(6), "same": true, "pkg": "lib", "loads": int64(1)}
	if !reflect.DeepEqual(res.Value, want) {
		t.Errorf("result = %#v, want %#v", res.Value, want)
	}
}

func TestModuleCanRegisterHandlers(t *testing.T) {
	rt := loadedRuntime(t, Options{},
		"main.lua", `require("lib.handlers")`,
		"lib/handlers.lua", `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function() return "from module" end)
`)
	s := specOf(t, rt, "handlers_create")
	if !strings.HasPrefix(s.Source, "lib/handlers.lua:2") {
		t.Errorf("Source = %q, want lib/handlers.lua:2", s.Source)
	}
	if res := mustInvoke(t, rt, "handlers_create", createCause("u")); res.Value != "from module" {
		t.Errorf("result = %#v", res.Value)
	}
}

func TestReloadDropsGlobals(t *testing.T) {
	rt := loadedRuntime(t, Options{}, "a.lua", `local luaop = require("luaop")
LOADED_ONCE = "yes"
luaop.on.create("example.com/v1/widgets", function(ctx) CALL_GLOBAL = "set"; return LOADED_ONCE end, {id = "g"})
`)
	if res := mustInvoke(t, rt, "g", createCause("u1")); res.Value != "yes" {
		t.Fatalf("first generation: %#v", res.Value)
	}
	mustLoad(t, rt, "a.lua", `local luaop = require("luaop")
local seen = {top = tostring(LOADED_ONCE), call = tostring(CALL_GLOBAL), rawtop = tostring(rawget(_G, "LOADED_ONCE"))}
luaop.on.create("example.com/v1/widgets", function(ctx)
  return {top = seen.top, call = seen.call, rawtop = seen.rawtop, now = tostring(LOADED_ONCE), now_call = tostring(CALL_GLOBAL)}
end, {id = "g"})
`)
	res := mustInvoke(t, rt, "g", createCause("u1"))
	want := map[string]any{"top": "nil", "call": "nil", "rawtop": "nil", "now": "nil", "now_call": "nil"}
	if !reflect.DeepEqual(res.Value, want) {
		t.Errorf("globals of the previous load are visible: %#v", res.Value)
	}
}

func TestHash(t *testing.T) {
	a := scriptsOf("a.lua", "-- one\n")
	b := scriptsOf("a.lua", "-- two\n")
	renamed := scriptsOf("b.lua", "-- one\n")
	rt := newTestRuntime(t, Options{})
	if rt.Hash() != "" {
		t.Errorf("Hash before load = %q", rt.Hash())
	}
	hash := func(s []Script) string {
		t.Helper()
		rep, err := rt.Load(t.Context(), s)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Hash != rt.Hash() {
			t.Errorf("report hash %q != Hash() %q", rep.Hash, rt.Hash())
		}
		return rt.Hash()
	}
	ha, hb, hr, ha2 := hash(a), hash(b), hash(renamed), hash(a)
	if ha == "" || ha == hb || ha == hr {
		t.Errorf("hash does not follow content/name: a=%s b=%s renamed=%s", ha, hb, hr)
	}
	if ha != ha2 {
		t.Errorf("same scripts, different hash: %s vs %s", ha, ha2)
	}
	// Order of the input does not matter.
	two := scriptsOf("a.lua", "-- one\n", "b.lua", "-- two\n")
	rev := []Script{two[1], two[0]}
	if hash(two) != hash(rev) {
		t.Errorf("hash depends on the order of the scripts slice")
	}
}

func TestDefaultIDsAndSpecs(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	rep := mustLoad(t, rt, "widgets.lua", `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function() end)
luaop.on.create("example.com/v1/widgets", function() end)
luaop.on.update("example.com/v1/widgets", function() end, {retries = 3, backoff = 1.5, timeout = 60, errors = "permanent"})
luaop.on.delete("v1/pods", function() end, {optional = true})
luaop.on.resume("example.com/v1/widgets", function() end, {deleted = true})
luaop.on.field("example.com/v1/widgets", "spec.size", function() end)
luaop.on.event("example.com/v1/widgets", function() end)
luaop.timer("example.com/v1/widgets", function() end, {interval = 10, initial_delay = 2, idle = 5, sharp = true})
luaop.daemon("example.com/v1/widgets", function() end, {cancellation_timeout = 3})
luaop.index("example.com/v1/widgets", function() end)
luaop.on.startup(function() end)
`, "my-app.v2.lua", `require("luaop").on.create("v1/configmaps", function() end)`)
	widgets := causes.Resource{}
	widgets.Group, widgets.Version, widgets.Resource = "example.com", "v1", "widgets"
	pods := causes.Resource{}
	pods.Version, pods.Resource = "v1", "pods"
	cms := causes.Resource{}
	cms.Version, cms.Resource = "v1", "configmaps"
	want := []causes.Spec{
		// Files run in name order: "my-app.v2.lua" < "widgets.lua".
		{ID: "my-app_v2_create", Kind: causes.KindChange, Resource: cms, Reasons: []causes.Reason{causes.Create}, Source: "my-app.v2.lua:1"},
		{ID: "widgets_create", Kind: causes.KindChange, Resource: widgets, Reasons: []causes.Reason{causes.Create}, Source: "widgets.lua:2"},
		{ID: "widgets_create_2", Kind: causes.KindChange, Resource: widgets, Reasons: []causes.Reason{causes.Create}, Source: "widgets.lua:3"},
		{ID: "widgets_update", Kind: causes.KindChange, Resource: widgets, Reasons: []causes.Reason{causes.Update}, Retries: 3,
			Backoff: 1500 * time.Millisecond, Timeout: time.Minute, Errors: causes.ErrorsPermanent, Source: "widgets.lua:4"},
		{ID: "widgets_delete", Kind: causes.KindChange, Resource: pods, Reasons: []causes.Reason{causes.Delete}, Optional: true, Source: "widgets.lua:5"},
		{ID: "widgets_resume", Kind: causes.KindChange, Resource: widgets, Reasons: []causes.Reason{causes.Resume}, Deleted: true, Source: "widgets.lua:6"},
		{ID: "widgets_field_spec_size", Kind: causes.KindChange, Resource: widgets, Reasons: []causes.Reason{causes.Create, causes.Update},
			Field: []string{"spec", "size"}, NamedField: []string{"spec", "size"}, Source: "widgets.lua:7"},
		{ID: "widgets_event", Kind: causes.KindEvent, Resource: widgets, Source: "widgets.lua:8"},
		{ID: "widgets_timer", Kind: causes.KindTimer, Resource: widgets, Interval: 10 * time.Second, InitialDelay: 2 * time.Second,
			Idle: 5 * time.Second, Sharp: true, Source: "widgets.lua:9"},
		{ID: "widgets_daemon", Kind: causes.KindDaemon, Resource: widgets, CancellationTimeout: 3 * time.Second, Source: "widgets.lua:10"},
		{ID: "widgets_index", Kind: causes.KindIndex, Resource: widgets, Source: "widgets.lua:11"},
	}
	got := rt.Specs()
	if len(got) != len(want) {
		t.Fatalf("specs = %v, want %v", specIDs(got), specIDs(want))
	}
	for i := range want {
		t.Run(want[i].ID, func(t *testing.T) {
			if got[i].CodeHash == "" {
				t.Errorf("spec %s has no code hash (reloads restart daemons by it)", got[i].ID)
			}
			got[i].CodeHash = ""
			if revisit := got[i].RevisitedOnReload(); revisit != (got[i].EvalHash != "") {
				t.Errorf("spec %s (revisited on reload: %v) has EvalHash %q: daemons, timers, indexes and handlers needing a finalizer have one, others none", got[i].ID, revisit, got[i].EvalHash)
			}
			got[i].EvalHash = ""
			if !reflect.DeepEqual(got[i], want[i]) {
				t.Errorf("spec\n got %+v\nwant %+v", got[i], want[i])
			}
		})
	}
	if len(rep.Handlers) != len(want)+1 || rep.Handlers[len(want)].ID != "widgets_startup" {
		t.Errorf("LoadReport.Handlers = %v, want the specs then the hooks", specIDs(rep.Handlers))
	}
	if !reflect.DeepEqual(rep.Files, []string{"my-app.v2.lua", "widgets.lua"}) {
		t.Errorf("LoadReport.Files = %v", rep.Files)
	}
}

func TestHooks(t *testing.T) {
	rt := loadedRuntime(t, Options{}, "op.lua", `local luaop = require("luaop")
luaop.on.startup(function(ctx) ctx.memo.started = true; return "up" end)
luaop.on.cleanup(function(ctx) return ctx.memo.started end, {id = "bye"})
luaop.on.probe(function(ctx) return {ok = true} end, {id = "health"})
luaop.on.create("example.com/v1/widgets", function() end, {id = "w"})
`)
	if got := specIDs(rt.Specs()); !reflect.DeepEqual(got, []string{"w"}) {
		t.Errorf("Specs() = %v, want only the resource handler", got)
	}
	hooks := rt.Hooks()
	if got := specIDs(hooks); !reflect.DeepEqual(got, []string{"op_startup", "bye", "health"}) {
		t.Fatalf("Hooks() = %v", got)
	}
	for i, kind := range []string{"startup", "cleanup", "probe"} {
		if hooks[i].Kind != causes.Kind(kind) || !strings.HasPrefix(hooks[i].Source, "op.lua:") {
			t.Errorf("hook %s: kind %q source %q, want kind %q", hooks[i].ID, hooks[i].Kind, hooks[i].Source, kind)
		}
	}
	cases := []struct {
		id   string
		want any
	}{
		{"op_startup", "up"},
		{"bye", true}, // the operator-level memo is shared by hooks
		{"health", map[string]any{"ok": true}},
	}
	for _, tc := range cases {
		t.Run(tc.id, func(t *testing.T) {
			res, err := rt.Invoke(t.Context(), causes.Call{Handler: specOf(t, rt, tc.id)})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(res.Value, tc.want) {
				t.Errorf("value = %#v, want %#v", res.Value, tc.want)
			}
		})
	}
}

// ---------------------------------------------------------------- Invoke

func TestInvokeResultConversion(t *testing.T) {
	rt := loadedRuntime(t, Options{}, "conv.lua", `local luaop = require("luaop")
local R = "example.com/v1/widgets"
luaop.on.create(R, function() return 42 end, {id = "int"})
luaop.on.create(R, function() return 2.5 end, {id = "float"})
luaop.on.create(R, function() return "s" end, {id = "string"})
luaop.on.create(R, function() return false end, {id = "false"})
luaop.on.create(R, function() end, {id = "nothing"})
luaop.on.create(R, function() return {} end, {id = "empty_object"})
luaop.on.create(R, function() return luaop.array() end, {id = "empty_list"})
luaop.on.create(R, function()
  return {n = 1, f = 0.5, big = 2^40, list = {1, "two", {three = 3}}, nested = {a = {b = {c = true}}}, null = luaop.null}
end, {id = "nested"})
luaop.on.create(R, function(ctx) return ctx.spec end, {id = "proxy"})
luaop.on.create(R, function() return function() end end, {id = "function"})
`)
	cases := []struct {
		id   string
		want any
	}{
		{"int", int64(42)},
		{"float", 2.5},
		{"string", "s"},
		{"false", false},
		{"nothing", nil},
		{"empty_object", map[string]any{}},
		{"empty_list", []any{}},
		{"nested", map[string]any{
			"n": int64(1), "f": 0.5, "big": int64(1 << 40),
			"list":   []any{int64(1), "two", map[string]any{"three": int64(3)}},
			"nested": map[string]any{"a": map[string]any{"b": map[string]any{"c": true}}},
			"null":   nil,
		}},
		{"proxy", map[string]any{"size": int64(3), "mode": "on", "items": []any{"a", "b"}}},
	}
	for _, tc := range cases {
		t.Run(tc.id, func(t *testing.T) {
			res := mustInvoke(t, rt, tc.id, createCause("u1"))
			if !reflect.DeepEqual(res.Value, tc.want) {
				t.Errorf("value = %#v, want %#v", res.Value, tc.want)
			}
		})
	}
	t.Run("function", func(t *testing.T) {
		_, _, err := invokeHandler(t, rt, "function", createCause("u1"))
		if !causes.IsPermanent(err) || !strings.Contains(err.Error(), "conv.lua") {
			t.Errorf("returning a function: %v; want a PermanentError naming the source", err)
		}
	})
}

func TestInvokePatch(t *testing.T) {
	rt := loadedRuntime(t, Options{}, "patch.lua", `local luaop = require("luaop")
local R = "example.com/v1/widgets"
luaop.on.create(R, function(ctx) ctx.patch.status.x = 1 end, {id = "status"})
luaop.on.create(R, function(ctx) ctx.patch.status.phase = "Ready"; ctx.patch.metadata.labels["app.kubernetes.io/name"] = "w" end, {id = "two"})
luaop.on.create(R, function(ctx) ctx.patch.spec.mode = luaop.null end, {id = "null"})
luaop.on.create(R, function(ctx) local _ = ctx.patch.status.deep.er; local _ = ctx.patch.spec end, {id = "read_only"})
luaop.on.create(R, function(ctx) local _ = ctx.patch.spec.a; ctx.patch.status.ok = true end, {id = "read_and_write"})
luaop.on.create(R, function(ctx) ctx.patch.status.list = {1, 2.5}; ctx.patch.status.empty = {} end, {id = "values"})
luaop.on.create(R, function(ctx) ctx.patch.status = {phase = "Set"} end, {id = "whole"})
luaop.on.create(R, function(ctx) ctx.patch.status.x = 1; error("failed") end, {id = "error"})
luaop.on.create(R, function(ctx) ctx.patch.status.f = function() end end, {id = "bad"})
`)
	cases := []struct {
		id   string
		want map[string]any
	}{
		{"status", map[string]any{"status": map[string]any{"x": int64(1)}}},
		{"two", map[string]any{"status": map[string]any{"phase": "Ready"}, "metadata": map[string]any{"labels": map[string]any{"app.kubernetes.io/name": "w"}}}},
		{"null", map[string]any{"spec": map[string]any{"mode": nil}}},
		{"read_only", map[string]any{}},
		{"read_and_write", map[string]any{"status": map[string]any{"ok": true}}},
		{"values", map[string]any{"status": map[string]any{"list": []any{int64(1), 2.5}, "empty": map[string]any{}}}},
		{"whole", map[string]any{"status": map[string]any{"phase": "Set"}}},
	}
	for _, tc := range cases {
		t.Run(tc.id, func(t *testing.T) {
			_, patch, err := invokeHandler(t, rt, tc.id, createCause("u1"))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(patch.Map(), tc.want) {
				t.Errorf("patch = %#v, want %#v", patch.Map(), tc.want)
			}
		})
	}
	t.Run("JSON null", func(t *testing.T) {
		_, patch, _ := invokeHandler(t, rt, "null", createCause("u1"))
		spec := patch.Map()["spec"].(map[string]any)
		if v, ok := spec["mode"]; !ok || v != nil {
			t.Errorf("spec.mode = %#v, %v; want a present nil (JSON null)", v, ok)
		}
	})
	// kopf applies what a handler wrote before raising (issue 12, item 3): see
	// TestPatchWrittenBeforeAnErrorIsKept.
	t.Run("error keeps the patch", func(t *testing.T) {
		_, patch, err := invokeHandler(t, rt, "error", createCause("u1"))
		if err == nil {
			t.Fatal("no error")
		}
		if patch.IsEmpty() {
			t.Errorf("the patch written before the error was dropped")
		}
	})
	t.Run("unconvertible value", func(t *testing.T) {
		_, patch, err := invokeHandler(t, rt, "bad", createCause("u1"))
		if !causes.IsPermanent(err) || !strings.Contains(err.Error(), "ctx.patch") || !strings.Contains(err.Error(), "status.f") {
			t.Errorf("err = %v; want a PermanentError naming ctx.patch and status.f", err)
		}
		if !patch.IsEmpty() {
			t.Errorf("patch = %#v", patch.Map())
		}
	})
	t.Run("nil Patch in the call", func(t *testing.T) {
		_, err := rt.Invoke(t.Context(), causes.Call{Handler: specOf(t, rt, "status"), Cause: createCause("u1")})
		if err != nil {
			t.Errorf("a call without a Patch: %v", err)
		}
	})
	t.Run("merges into an existing patch", func(t *testing.T) {
		patch := state.NewPatch()
		patch.Set([]string{"status", "other"}, "kept")
		if _, err := rt.Invoke(t.Context(), causes.Call{Handler: specOf(t, rt, "status"), Cause: createCause("u1"), Patch: patch}); err != nil {
			t.Fatal(err)
		}
		want := map[string]any{"status": map[string]any{"other": "kept", "x": int64(1)}}
		if !reflect.DeepEqual(patch.Map(), want) {
			t.Errorf("patch = %#v, want %#v", patch.Map(), want)
		}
	})
}

func TestInvokeContextFields(t *testing.T) {
	rt := loadedRuntime(t, Options{}, "fields.lua", `local luaop = require("luaop")
luaop.on.update("example.com/v1/widgets", function(ctx)
  local d = ctx.diff[1]
  return {
    body_kind = ctx.body.kind, body_name = ctx.body.metadata.name,
    spec_size = ctx.spec.size, spec_item = ctx.spec.items[2], spec_items = #ctx.spec.items,
    meta_name = ctx.meta.name, metadata_ns = ctx.metadata.namespace,
    status_phase = ctx.status.phase,
    label = ctx.labels.app, annotation = ctx.annotations["example.com/note"],
    name = ctx.name, namespace = ctx.namespace, uid = ctx.uid,
    reason = ctx.reason,
    old = ctx.old.size, new = ctx.new.size,
    diff_n = #ctx.diff, diff_op = d.op, diff_path = d.path, diff_field = d.field[2], diff_old = d.old, diff_new = d.new,
    retry = ctx.retry, started = ctx.started, runtime = ctx.runtime,
    param = ctx.param, id = ctx.id, resource = ctx.resource,
    unknown = ctx.no_such_field == nil,
    logger = type(ctx.logger.info) == "function",
    memo = type(ctx.memo),
    subhandler = type(ctx.subhandler),
    again = rawequal(ctx.spec, ctx.spec),
  }
end, {id = "fields", param = {x = 1, s = "p"}})
luaop.on.update("example.com/v1/widgets", function(ctx)
  return {spec = next(ctx.spec) == nil, status = next(ctx.status) == nil, labels = next(ctx.labels) == nil,
          reason = ctx.reason == nil, started = ctx.started == nil, name = ctx.name == nil, param = ctx.param == nil, old = ctx.old == nil}
end, {id = "bare"})
`)
	started := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	cause := createCause("uid-1")
	cause.Reason = causes.Update
	cause.Old = map[string]any{"size": int64(2)}
	cause.New = map[string]any{"size": int64(3)}
	cause.Diff = state.Diff{{Op: state.DiffChange, Path: []string{"spec", "size"}, Old: int64(2), New: int64(3)}}
	res, err := rt.Invoke(t.Context(), causes.Call{
		Handler: specOf(t, rt, "fields"), Cause: cause, Patch: state.NewPatch(),
		Retry: 2, Started: started, Runtime: 1500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := res.Value.(map[string]any)
	cases := []struct {
		field string
		want  any
	}{
		{"body_kind", "Widget"}, {"body_name", "w1"},
		{"spec_size", int64(3)}, {"spec_item", "b"}, {"spec_items", int64(2)},
		{"meta_name", "w1"}, {"metadata_ns", "ns1"},
		{"status_phase", "Pending"},
		{"label", "x"}, {"annotation", "hi"},
		{"name", "w1"}, {"namespace", "ns1"}, {"uid", "uid-1"},
		{"reason", "update"},
		{"old", int64(2)}, {"new", int64(3)},
		{"diff_n", int64(1)}, {"diff_op", "change"}, {"diff_path", "spec.size"}, {"diff_field", "size"}, {"diff_old", int64(2)}, {"diff_new", int64(3)},
		{"retry", int64(2)}, {"started", int64(started.Unix())}, {"runtime", 1.5},
		{"param", map[string]any{"x": int64(1), "s": "p"}}, {"id", "fields"}, {"resource", widgetsResource},
		{"unknown", true}, {"logger", true}, {"memo", "table"}, {"subhandler", "function"}, {"again", true},
	}
	for _, tc := range cases {
		t.Run(tc.field, func(t *testing.T) {
			if v, ok := got[tc.field]; !ok || !reflect.DeepEqual(v, tc.want) {
				t.Errorf("ctx %s = %#v, want %#v", tc.field, v, tc.want)
			}
		})
	}

	t.Run("missing parts", func(t *testing.T) {
		res, err := rt.Invoke(t.Context(), causes.Call{
			Handler: specOf(t, rt, "bare"),
			Cause:   causes.Cause{Body: map[string]any{"metadata": map[string]any{"uid": "bare"}}},
		})
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range res.Value.(map[string]any) {
			if v != true {
				t.Errorf("%s: missing part not empty/nil", k)
			}
		}
	})
}

func TestInvokeReadOnly(t *testing.T) {
	cases := []struct {
		name string
		code string
		want []string
	}{
		{"spec field", "ctx.spec.size = 1", []string{"ctx.spec.size is read-only", "ctx.patch"}},
		{"nested spec", "ctx.spec.items[1] = 'z'", []string{"ctx.spec.items[1] is read-only"}},
		{"body", "ctx.body.spec.size = 1", []string{"ctx.body.spec.size is read-only"}},
		{"labels", "ctx.labels.app = 'y'", []string{"ctx.labels.app is read-only"}},
		{"annotations", "ctx.annotations['example.com/note'] = 'y'", []string{`ctx.annotations["example.com/note"] is read-only`}},
		{"meta", "ctx.meta.name = 'y'", []string{"ctx.meta.name is read-only"}},
		{"old", "ctx.old.size = 1", []string{"ctx.old.size is read-only"}},
		{"new key", "ctx.status.brand_new = 1", []string{"ctx.status.brand_new is read-only"}},
		{"missing part", "ctx.status.conditions[1] = 1", []string{"attempt to index"}},
		{"rawset on a proxy", "rawset(ctx.spec, 'size', 1); return ctx.spec.size", nil},
	}
	var b strings.Builder
	b.WriteString("local luaop = require('luaop')\n")
	for i, tc := range cases {
		fmt.Fprintf(&b, "luaop.on.update(%q, function(ctx) %s end, {id = 'ro%d'})\n", widgetsResource, tc.code, i)
	}
	rt := loadedRuntime(t, Options{}, "ro.lua", b.String())
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cause := createCause("u1")
			cause.Old, cause.New = map[string]any{"size": int64(2)}, map[string]any{"size": int64(3)}
			res, _, err := invokeHandler(t, rt, fmt.Sprintf("ro%d", i), cause)
			if tc.want == nil {
				// rawset bypasses the proxy, but the object itself must not change.
				if sz := cause.Body["spec"].(map[string]any)["size"]; sz != int64(3) {
					t.Errorf("the Go object changed: spec.size = %#v", sz)
				}
				t.Logf("rawset: value %#v err %v", res.Value, err)
				return
			}
			t.Logf("error: %v", err)
			checkScriptError(t, err, "ro.lua", i+2, tc.want...)
			if !reflect.DeepEqual(cause.Body, widgetObject("u1")) {
				t.Errorf("the Go object changed: %#v", cause.Body)
			}
		})
	}
}

func TestInvokeMemo(t *testing.T) {
	script := `local luaop = require("luaop")
luaop.on.update("example.com/v1/widgets", function(ctx)
  ctx.memo.n = (ctx.memo.n or 0) + 1
  return ctx.memo.n
end, {id = "count"})
luaop.on.update("example.com/v1/widgets", function(ctx)
  ctx.memo.saved = ctx
  ctx.memo.saved_patch = ctx.patch.status
end, {id = "keep_ctx"})
luaop.on.update("example.com/v1/widgets", function(ctx)
  local s = ctx.memo.saved
  local out = {same = rawequal(s, ctx)}
  for _, k in ipairs({"name", "spec", "body", "patch", "memo", "subhandler"}) do
    local ok, err = pcall(function() return s[k] end)
    out[k] = ok and "read" or tostring(err)
  end
  return out
end, {id = "read_ctx"})
luaop.on.update("example.com/v1/widgets", function(ctx)
  ctx.memo.saved_patch.late = true  -- the old call's patch
  return "ok"
end, {id = "write_old_patch"})
local kept
luaop.on.update("example.com/v1/widgets", function(ctx)
  kept = ctx.memo
  ctx.memo.mine = "secret"
end, {id = "keep_memo"})
luaop.on.update("example.com/v1/widgets", function(ctx)
  kept.mine = "overwritten"
end, {id = "write_kept_memo"})
luaop.on.update("example.com/v1/widgets", function(ctx)
  local n = 0
  for k, v in pairs(ctx.memo) do n = n + 1 end
  return {mine = ctx.memo.mine, n = n, len = #ctx.memo}
end, {id = "read_memo"})
`
	rt := loadedRuntime(t, Options{Shards: 4}, "memo.lua", script)
	count := func(uid string) any { return mustInvoke(t, rt, "count", createCause(uid)).Value }

	t.Run("per object", func(t *testing.T) {
		for i := 1; i <= 3; i++ {
			if got := count("a"); got != int64(i) {
				t.Errorf("a call %d: memo.n = %#v", i, got)
			}
		}
		if got := count("b"); got != int64(1) {
			t.Errorf("b shares a's memo: %#v", got)
		}
	})
	t.Run("forget", func(t *testing.T) {
		rt.Forget("a")
		if got := count("a"); got != int64(1) {
			t.Errorf("after Forget: memo.n = %#v, want 1", got)
		}
		if got := count("b"); got != int64(2) {
			t.Errorf("Forget(a) dropped b's memo: %#v", got)
		}
		rt.Forget("")           // harmless
		rt.Forget("never-seen") // harmless
	})
	t.Run("kept across reload", func(t *testing.T) {
		mustLoad(t, rt, "memo.lua", script+"\n-- edited\n")
		if got := count("b"); got != int64(3) {
			t.Errorf("after reload: memo.n = %#v, want 3", got)
		}
	})
	t.Run("ctx kept beyond its call", func(t *testing.T) {
		mustInvoke(t, rt, "keep_ctx", createCause("c"))
		// Issue 34: a ctx is dead after its call, every field of it (cached
		// during its call or not) fails with a clear error.
		res := mustInvoke(t, rt, "read_ctx", createCause("c"))
		out, _ := res.Value.(map[string]any)
		if out["same"] != false {
			t.Errorf("old ctx = %#v", res.Value)
		}
		for _, k := range []string{"name", "spec", "body", "patch", "memo", "subhandler"} {
			if msg, _ := out[k].(string); !strings.Contains(msg, "memo.lua:14: ctx."+k+": this ctx belongs to a call that ended") {
				t.Errorf("old ctx.%s: %#v", k, out[k])
			}
		}
		// Writing a kept ctx.patch fails instead of being lost.
		_, patch, err := invokeHandler(t, rt, "write_old_patch", createCause("c"))
		if err == nil || !strings.Contains(err.Error(), "memo.lua:20: ctx.patch: this patch was already applied") {
			t.Errorf("writing an old ctx.patch: %v", err)
		}
		if !patch.IsEmpty() {
			t.Errorf("writing an old ctx.patch changed this call's patch: %#v", patch.Map())
		}
	})
	t.Run("memo kept beyond its call", func(t *testing.T) {
		// Issue 34: a memo kept in a variable is reachable only during its own
		// call, by no other call (not another object's, not a later one).
		mustInvoke(t, rt, "keep_memo", createCause("m"))
		_, _, err := invokeHandler(t, rt, "write_kept_memo", createCause("m"))
		if err == nil || !strings.Contains(err.Error(), "memo.lua:29: ctx.memo: this ctx belongs to a call that ended") {
			t.Errorf("writing a kept memo: %v", err)
		}
		res := mustInvoke(t, rt, "read_memo", createCause("m"))
		if want := map[string]any{"mine": "secret", "n": int64(1), "len": int64(0)}; !reflect.DeepEqual(res.Value, want) {
			t.Errorf("memo = %#v, want %#v", res.Value, want)
		}
	})
}

// ---------------------------------------------------------------- errors

func TestInvokeErrors(t *testing.T) {
	cases := []struct {
		name  string
		code  string
		check func(t *testing.T, err error, line int)
	}{
		{"error string", `error("x")`, func(t *testing.T, err error, line int) {
			checkScriptError(t, err, "err.lua", line, "err.lua:"+fmt.Sprint(line)+": x")
			var se *ScriptError
			errors.As(err, &se)
			if se.Message != "x" {
				t.Errorf("Message = %q, want x", se.Message)
			}
		}},
		{"error level 2 string", `local function f() error("deep", 2) end f()`, func(t *testing.T, err error, line int) {
			checkScriptError(t, err, "err.lua", line, "deep")
		}},
		{"error table", `error({message = "m"})`, func(t *testing.T, err error, line int) {
			checkScriptError(t, err, "err.lua", line, "m")
		}},
		{"error table without message", `error({code = 7})`, func(t *testing.T, err error, line int) {
			checkScriptError(t, err, "err.lua", line, "code = 7")
		}},
		{"error nil", `error(nil)`, func(t *testing.T, err error, line int) {
			checkScriptError(t, err, "err.lua", line, "error(nil)")
		}},
		{"error number", `error(42)`, func(t *testing.T, err error, line int) {
			checkScriptError(t, err, "", 0, "42")
		}},
		{"runtime error", `local t = nil; return t.x`, func(t *testing.T, err error, line int) {
			checkScriptError(t, err, "err.lua", line)
		}},
		{"temporary error", `error(luaop.temporary_error("t", 5))`, func(t *testing.T, err error, line int) {
			te, ok := causes.AsTemporary(err)
			if !ok || te.Message != "t" || te.Delay != 5*time.Second {
				t.Errorf("err = %#v, want TemporaryError{t, 5s}", err)
			}
		}},
		{"temporary error default delay", `error(luaop.temporary_error("t"))`, func(t *testing.T, err error, line int) {
			te, ok := causes.AsTemporary(err)
			if !ok || te.Delay != 60*time.Second {
				t.Errorf("err = %#v, want a 60s TemporaryError", err)
			}
		}},
		{"permanent error", `error(luaop.permanent_error("p"))`, func(t *testing.T, err error, line int) {
			var pe *causes.PermanentError
			if !errors.As(err, &pe) || pe.Message != "p" {
				t.Errorf("err = %#v, want PermanentError{p}", err)
			}
		}},
		{"pcall catches and rethrows a temporary error", `local ok, e = pcall(error, luaop.temporary_error("again", 1)); assert(not ok and e.kind == "temporary"); error(e)`, func(t *testing.T, err error, line int) {
			if te, ok := causes.AsTemporary(err); !ok || te.Delay != time.Second {
				t.Errorf("err = %#v", err)
			}
		}},
		{"huge string.rep", `local s = string.rep("x", 1e10); return #s`, func(t *testing.T, err error, line int) {
			checkScriptError(t, err, "err.lua", line)
		}},
		{"huge rep method", `local s = ("xy"):rep(2^40); return #s`, func(t *testing.T, err error, line int) {
			checkScriptError(t, err, "err.lua", line)
		}},
		{"deep recursion", `local function f(n) return 1 + f(n + 1) end return f(1)`, func(t *testing.T, err error, line int) {
			checkScriptError(t, err, "", 0)
		}},
		{"deep recursion through pcall", `local function f() local ok, e = pcall(f); error(e, 0) end f()`, func(t *testing.T, err error, line int) {
			checkScriptError(t, err, "", 0, "stack overflow")
		}},
		{"coroutine.yield outside a coroutine", `coroutine.yield(1)`, func(t *testing.T, err error, line int) {
			checkScriptError(t, err, "err.lua", line)
		}},
		{"calling a nil global", `undefined_function()`, func(t *testing.T, err error, line int) {
			checkScriptError(t, err, "err.lua", line)
		}},
		{"registering at call time", `luaop.on.create("v1/pods", function() end)`, func(t *testing.T, err error, line int) {
			checkScriptError(t, err, "err.lua", line, "only be registered while the scripts load")
		}},
		{"error in a sibling module function", `require_util_fail()`, func(t *testing.T, err error, line int) {
			checkScriptError(t, err, "lib/fail.lua", 2, "from module")
		}},
	}
	var b strings.Builder
	b.WriteString("local luaop = require('luaop')\nlocal fail = require('lib.fail')\nrequire_util_fail = fail.boom\n")
	b.WriteString("luaop.on.create('v1/pods', function() return 'alive' end, {id = 'ok'})\n")
	const first = 5
	for i, tc := range cases {
		fmt.Fprintf(&b, "luaop.on.create(%q, function(ctx) %s end, {id = 'e%d'})\n", widgetsResource, tc.code, i)
	}
	rt := loadedRuntime(t, Options{HandlerTimeout: 5 * time.Second}, "err.lua", b.String(), "lib/fail.lua", "local M = {}\nfunction M.boom() error('from module') end\nreturn M\n")
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("Invoke panicked: %v", r)
					}
				}()
				_, _, err = invokeHandler(t, rt, fmt.Sprintf("e%d", i), createCause("u1"))
			}()
			t.Logf("error: %v", err)
			tc.check(t, err, first+i)
			// The runtime keeps working.
			if res := mustInvoke(t, rt, "ok", createCause("u1")); res.Value != "alive" {
				t.Errorf("unexpected value %#v", res.Value)
			}
		})
	}
}

func TestInvokeTimeout(t *testing.T) {
	rt := loadedRuntime(t, Options{Shards: 1, HandlerTimeout: 200 * time.Millisecond}, "loop.lua", `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function(ctx)
  while true do end
end, {id = "spin"})
luaop.on.create("example.com/v1/widgets", function(ctx)
  local n = 0
  for i = 1, 1e12 do n = n + string.len("x") end
  return n
end, {id = "spin_go_calls"})
luaop.on.create("example.com/v1/widgets", function(ctx) return "alive" end, {id = "ok"})
luaop.on.create("example.com/v1/widgets", function() end, {id = "filter", when = function(ctx) while true do end end})
luaop.on.create("example.com/v1/widgets", function() end, {id = "label_filter", labels = {app = function() while true do end end}})
`)
	for _, id := range []string{"spin", "spin_go_calls"} {
		t.Run(id, func(t *testing.T) {
			start := time.Now()
			_, _, err := invokeHandler(t, rt, id, createCause("u1"))
			took := time.Since(start)
			if err == nil {
				t.Fatal("an endless loop returned")
			}
			t.Logf("after %s: %v", took, err)
			if took > 3*time.Second {
				t.Errorf("took %s with a 200ms deadline", took)
			}
			if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "deadline") {
				t.Errorf("err = %v; want a deadline error (errors.Is DeadlineExceeded)", err)
			}
			checkScriptError(t, err, "loop.lua", 0)
			if res := mustInvoke(t, rt, "ok", createCause("u1")); res.Value != "alive" {
				t.Errorf("next call: %#v", res.Value)
			}
		})
	}
	for _, id := range []string{"filter", "label_filter"} {
		t.Run("Match "+id, func(t *testing.T) {
			ok, err := rt.Match(t.Context(), specOf(t, rt, id), createCause("u1"))
			if ok || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Match = %v, %v; want a deadline error", ok, err)
			}
			if res := mustInvoke(t, rt, "ok", createCause("u1")); res.Value != "alive" {
				t.Errorf("next call: %#v", res.Value)
			}
		})
	}
	t.Run("caller's context cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		go func() { time.Sleep(20 * time.Millisecond); cancel() }()
		_, err := rt.Invoke(ctx, causes.Call{Handler: specOf(t, rt, "spin"), Cause: createCause("u1")})
		if !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v; want context.Canceled", err)
		}
		if res := mustInvoke(t, rt, "ok", createCause("u1")); res.Value != "alive" {
			t.Errorf("next call: %#v", res.Value)
		}
	})
}

// ---------------------------------------------------------------- Match

func TestMatch(t *testing.T) {
	rt := loadedRuntime(t, Options{}, "match.lua", `local luaop = require("luaop")
local R = "example.com/v1/widgets"
local function h() end
luaop.on.update(R, h, {id = "none"})
luaop.on.update(R, h, {id = "label_eq", labels = {app = "x"}})
luaop.on.update(R, h, {id = "label_eq2", labels = {app = "x", tier = "web"}})
luaop.on.update(R, h, {id = "label_present", labels = {app = luaop.PRESENT}})
luaop.on.update(R, h, {id = "label_absent", labels = {app = luaop.ABSENT}})
luaop.on.update(R, h, {id = "label_fn", labels = {app = function(value, ctx) return value == "x" and ctx.name == "w1" end}})
luaop.on.update(R, h, {id = "label_fn_nil", labels = {missing = function(value, ctx) return value == nil end}})
luaop.on.update(R, h, {id = "annot_eq", annotations = {["example.com/note"] = "hi"}})
luaop.on.update(R, h, {id = "annot_present", annotations = {["example.com/note"] = luaop.PRESENT}})
luaop.on.update(R, h, {id = "annot_absent", annotations = {["example.com/note"] = luaop.ABSENT}})
luaop.on.update(R, h, {id = "annot_fn", annotations = {["example.com/note"] = function(v) return #v == 2 end}})
luaop.on.update(R, h, {id = "when", when = function(ctx) return ctx.spec.size > 2 end})
luaop.on.update(R, h, {id = "when_reason", when = function(ctx) return ctx.reason == "update" end})
luaop.on.update(R, h, {id = "when_error", when = function(ctx) error("bad filter") end})
luaop.on.update(R, h, {id = "when_nil_index", when = function(ctx) return ctx.spec.nothing.deeper end})
luaop.on.update(R, h, {id = "field_value", field = "spec.mode", value = "on"})
luaop.on.update(R, h, {id = "field_value_int", field = "spec.size", value = 3})
luaop.on.field(R, "spec.mode", h, {id = "onfield_value", value = "on"})
luaop.on.update(R, h, {id = "old_new", old = 2, new = 3})
luaop.on.update(R, h, {id = "labels_and_when", labels = {app = "x"}, when = function(ctx) return ctx.memo.allow == true end})
luaop.on.update(R, function(ctx) ctx.memo.allow = true end, {id = "allow"})
`)
	type mod func(c *causes.Cause)
	setLabel := func(k string, v any) mod {
		return func(c *causes.Cause) {
			labels := c.Body["metadata"].(map[string]any)["labels"].(map[string]any)
			if v == nil {
				delete(labels, k)
			} else {
				labels[k] = v
			}
		}
	}
	noAnnotations := func(c *causes.Cause) { delete(c.Body["metadata"].(map[string]any), "annotations") }
	setSpec := func(k string, v any) mod {
		return func(c *causes.Cause) { c.Body["spec"].(map[string]any)[k] = v }
	}
	cases := []struct {
		id   string
		mod  mod
		want bool
		err  string
	}{
		{"none", nil, true, ""},
		{"label_eq", nil, true, ""},
		{"label_eq", setLabel("app", "y"), false, ""},
		{"label_eq", setLabel("app", nil), false, ""},
		{"label_eq2", nil, true, ""},
		{"label_eq2", setLabel("tier", "db"), false, ""},
		{"label_present", nil, true, ""},
		{"label_present", setLabel("app", ""), true, ""},
		{"label_present", setLabel("app", nil), false, ""},
		{"label_absent", nil, false, ""},
		{"label_absent", setLabel("app", nil), true, ""},
		{"label_fn", nil, true, ""},
		{"label_fn", setLabel("app", "y"), false, ""},
		{"label_fn_nil", nil, true, ""},
		{"annot_eq", nil, true, ""},
		{"annot_eq", noAnnotations, false, ""},
		{"annot_present", nil, true, ""},
		{"annot_present", noAnnotations, false, ""},
		{"annot_absent", nil, false, ""},
		{"annot_absent", noAnnotations, true, ""},
		{"annot_fn", nil, true, ""},
		{"when", nil, true, ""},
		{"when", setSpec("size", int64(1)), false, ""},
		{"when_reason", nil, true, ""},
		{"when_error", nil, false, "bad filter"},
		{"when_nil_index", nil, false, "match.lua:18"},
		// field/value of change handlers: TestValueFilters (old and new values).
		{"old_new", nil, true, ""},
		{"old_new", func(c *causes.Cause) { c.New = int64(4) }, false, ""},
		{"labels_and_when", nil, false, ""},
	}
	for _, tc := range cases {
		name := tc.id
		if tc.mod != nil {
			name += "/modified"
		}
		t.Run(name, func(t *testing.T) {
			cause := createCause("m1")
			cause.Reason = causes.Update
			cause.Old, cause.New = int64(2), int64(3)
			if tc.mod != nil {
				tc.mod(&cause)
			}
			ok, err := rt.Match(t.Context(), specOf(t, rt, tc.id), cause)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), tc.id) {
					t.Errorf("Match = %v, %v; want an error naming %s and %q", ok, err, tc.id, tc.err)
				}
				return
			}
			if err != nil || ok != tc.want {
				t.Errorf("Match = %v, %v; want %v", ok, err, tc.want)
			}
		})
	}
	t.Run("when sees the object's memo", func(t *testing.T) {
		cause := createCause("m2")
		cause.Reason = causes.Update
		mustInvoke(t, rt, "allow", cause)
		ok, err := rt.Match(t.Context(), specOf(t, rt, "labels_and_when"), cause)
		if err != nil || !ok {
			t.Errorf("Match = %v, %v; want true after the memo was set", ok, err)
		}
	})
	t.Run("unknown handler", func(t *testing.T) {
		ok, err := rt.Match(t.Context(), causes.Spec{ID: "nope"}, createCause("m1"))
		t.Logf("Match of an unknown id: %v, %v", ok, err)
	})
}

// ---------------------------------------------------------------- subhandlers

func TestSubhandlers(t *testing.T) {
	rt := loadedRuntime(t, Options{Shards: 3}, "sub.lua", `local luaop = require("luaop")
local R = "example.com/v1/widgets"
luaop.on.create(R, function(ctx)
  local size = ctx.spec.size
  for _, name in ipairs({"a", "b"}) do
    ctx.subhandler(function(sub)
      sub.memo[name] = (sub.memo[name] or 0) + 1
      sub.patch.status[name] = size
      return {child = name, id = sub.id, size = size, uid = sub.uid, calls = sub.memo[name]}
    end, {id = name, retries = 2})
  end
  return "parent"
end, {id = "parent"})
luaop.on.create(R, function(ctx)
  ctx.subhandler(function() end, {id = "a"})
  ctx.subhandler(function() end, {id = "a"})
end, {id = "dup"})
luaop.on.create(R, function(ctx)
  ctx.subhandler(function() end)
  ctx.subhandler(function() end)
end, {id = "anon"})
luaop.on.create(R, function(ctx)
  ctx.subhandler(function() end, {id = "x/y"})
end, {id = "slash"})
luaop.on.create(R, function(ctx)
  ctx.memo.saved_sub = ctx.subhandler
end, {id = "keeper"})
luaop.on.create(R, function(ctx)
  ctx.memo.saved_sub(function() end, {id = "late"})
end, {id = "late"})
luaop.on.event(R, function(ctx) return type(ctx.subhandler) end, {id = "event"})
luaop.on.create(R, function(ctx)
  ctx.subhandler(function(child)
    child.subhandler(function(grandchild) return grandchild.id end, {id = "g"})
    return "child"
  end, {id = "c"})
end, {id = "nest"})
`)
	res, _, err := invokeHandler(t, rt, "parent", createCause("obj-1"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Value != "parent" {
		t.Errorf("parent value = %#v", res.Value)
	}
	if got := specIDs(res.Subhandlers); !reflect.DeepEqual(got, []string{"parent/a", "parent/b"}) {
		t.Fatalf("subhandlers = %v", got)
	}
	parent := specOf(t, rt, "parent")
	for _, sub := range res.Subhandlers {
		if sub.Kind != causes.KindChange || sub.Resource != parent.Resource || !reflect.DeepEqual(sub.Reasons, parent.Reasons) || sub.Retries != 2 {
			t.Errorf("sub spec %+v does not inherit from parent %+v or lost its options", sub, parent)
		}
		if !strings.HasPrefix(sub.Source, "sub.lua:") {
			t.Errorf("sub Source = %q", sub.Source)
		}
	}
	for i, name := range []string{"a", "b"} {
		t.Run("invoke "+name, func(t *testing.T) {
			sub := res.Subhandlers[i]
			patch := state.NewPatch()
			got, err := rt.Invoke(t.Context(), causes.Call{Handler: sub, Cause: createCause("obj-1"), Patch: patch})
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]any{"child": name, "id": "parent/" + name, "size": int64(3), "uid": "obj-1", "calls": int64(1)}
			if !reflect.DeepEqual(got.Value, want) {
				t.Errorf("child value = %#v, want %#v", got.Value, want)
			}
			if !reflect.DeepEqual(patch.Map(), map[string]any{"status": map[string]any{name: int64(3)}}) {
				t.Errorf("child patch = %#v", patch.Map())
			}
		})
	}
	t.Run("other object has no such subhandler", func(t *testing.T) {
		_, err := rt.Invoke(t.Context(), causes.Call{Handler: res.Subhandlers[0], Cause: createCause("obj-2")})
		if !causes.IsPermanent(err) {
			t.Errorf("err = %v; want a PermanentError", err)
		}
	})
	t.Run("parent re-run replaces the closures", func(t *testing.T) {
		body := createCause("obj-1")
		body.Body["spec"].(map[string]any)["size"] = int64(9)
		mustInvoke(t, rt, "parent", body)
		got, err := rt.Invoke(t.Context(), causes.Call{Handler: res.Subhandlers[0], Cause: body})
		if err != nil {
			t.Fatal(err)
		}
		if v := got.Value.(map[string]any); v["size"] != int64(9) || v["calls"] != int64(2) {
			t.Errorf("child after parent re-run = %#v; want size 9 (new closure), calls 2 (same memo)", v)
		}
	})
	t.Run("forget drops them", func(t *testing.T) {
		rt.Forget("obj-1")
		_, err := rt.Invoke(t.Context(), causes.Call{Handler: res.Subhandlers[0], Cause: createCause("obj-1")})
		if !causes.IsPermanent(err) {
			t.Errorf("err = %v; want a PermanentError after Forget", err)
		}
	})
	t.Run("duplicate sub id", func(t *testing.T) {
		_, _, err := invokeHandler(t, rt, "dup", createCause("obj-3"))
		checkScriptError(t, err, "sub.lua", 0, "duplicate subhandler id", "dup/a")
	})
	t.Run("default sub ids", func(t *testing.T) {
		r := mustInvoke(t, rt, "anon", createCause("obj-3"))
		if got := specIDs(r.Subhandlers); !reflect.DeepEqual(got, []string{"anon/sub1", "anon/sub2"}) {
			t.Errorf("ids = %v", got)
		}
	})
	t.Run("slash in sub id", func(t *testing.T) {
		_, _, err := invokeHandler(t, rt, "slash", createCause("obj-3"))
		checkScriptError(t, err, "sub.lua", 0, "x/y")
	})
	t.Run("subhandler after its call", func(t *testing.T) {
		mustInvoke(t, rt, "keeper", createCause("obj-4"))
		_, _, err := invokeHandler(t, rt, "late", createCause("obj-4"))
		checkScriptError(t, err, "sub.lua", 0, "while its handler runs")
	})
	t.Run("nested", func(t *testing.T) {
		r := mustInvoke(t, rt, "nest", createCause("obj-6"))
		if len(r.Subhandlers) != 1 {
			t.Fatalf("subhandlers = %v", specIDs(r.Subhandlers))
		}
		child, err := rt.Invoke(t.Context(), causes.Call{Handler: r.Subhandlers[0], Cause: createCause("obj-6")})
		if err != nil || child.Value != "child" || len(child.Subhandlers) != 1 || child.Subhandlers[0].ID != "nest/c/g" {
			t.Fatalf("child = %+v, %v; want value child and subhandler nest/c/g", child, err)
		}
		g, err := rt.Invoke(t.Context(), causes.Call{Handler: child.Subhandlers[0], Cause: createCause("obj-6")})
		if err != nil || g.Value != "nest/c/g" {
			t.Errorf("grandchild = %+v, %v", g, err)
		}
	})
	t.Run("no subhandlers for event handlers", func(t *testing.T) {
		if r := mustInvoke(t, rt, "event", createCause("obj-5")); r.Value != "nil" {
			t.Errorf("type(ctx.subhandler) in an event handler = %#v", r.Value)
		}
	})
}

// ---------------------------------------------------------------- concurrency

// TestConcurrentMemo: 4 shards, 8 goroutines, 100 objects each, plus reloads and
// filter calls in between. Every object's counter must see every call exactly once,
// which holds only if one caller owns a state at a time and memos are per object.
func TestConcurrentMemo(t *testing.T) {
	script := `local luaop = require("luaop")
luaop.on.update("example.com/v1/widgets", function(ctx)
  local n = (ctx.memo.n or 0) + 1
  for i = 1, 20 do local _ = ctx.spec.size end  -- widen the window for a race
  ctx.memo.n = n
  ctx.patch.status.n = n
  return n
end, {id = "count"})
luaop.on.update("example.com/v1/widgets", function() end, {id = "filtered", when = function(ctx) return (ctx.memo.n or 0) >= 0 end})
`
	rt := loadedRuntime(t, Options{Shards: 4}, "count.lua", script)
	const (
		goroutines = 8
		objects    = 100
		rounds     = 3
	)
	bodies := make([]map[string]any, objects)
	for i := range bodies {
		bodies[i] = widgetObject(fmt.Sprintf("uid-%03d", i))
	}
	var mu sync.Mutex
	seen := make([][]int64, objects)
	var wg sync.WaitGroup
	errs := make(chan error, goroutines*objects*rounds)
	stop := make(chan struct{})
	var reloads sync.WaitGroup
	reloadCount := 0
	reloads.Add(1)
	go func() { // reload now and then: memos must survive
		defer reloads.Done()
		for i := 0; ; i++ {
			reloadCount = i
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if _, err := rt.Load(t.Context(), scriptsOf("count.lua", fmt.Sprintf("%s\n-- %d\n", script, i))); err != nil {
				errs <- err
				return
			}
		}
	}()
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				for k := 0; k < objects; k++ {
					i := (k + g*13) % objects // different goroutines start on different objects
					cause := causes.Cause{Reason: causes.Update, Body: bodies[i]}
					spec := findSpec(rt.Specs(), "count")
					patch := state.NewPatch()
					res, err := rt.Invoke(t.Context(), causes.Call{Handler: spec, Cause: cause, Patch: patch})
					if err != nil {
						errs <- err
						return
					}
					n, _ := res.Value.(int64)
					if got, _ := patch.Get([]string{"status", "n"}); got != n {
						errs <- fmt.Errorf("object %d: patch %v, value %v", i, got, n)
					}
					if ok, err := rt.Match(t.Context(), findSpec(rt.Specs(), "filtered"), cause); err != nil || !ok {
						errs <- fmt.Errorf("Match: %v, %v", ok, err)
					}
					mu.Lock()
					seen[i] = append(seen[i], n)
					mu.Unlock()
				}
			}
		}(g)
	}
	wg.Wait()
	close(stop)
	reloads.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d calls, %d reloads in between", goroutines*objects*rounds, reloadCount)
	want := make([]int64, goroutines*rounds)
	for i := range want {
		want[i] = int64(i + 1)
	}
	for i, got := range seen {
		sort.Slice(got, func(a, b int) bool { return got[a] < got[b] })
		if !reflect.DeepEqual(got, want) {
			t.Errorf("object %d saw counters %v, want 1..%d each once", i, got, len(want))
		}
	}
}
