package luabind

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

// Issue 18: a reload compiles only the files whose content changed, and keeps every
// guarantee of a full load.

func TestReloadCompilesOnlyChangedFiles(t *testing.T) {
	rt := newTestRuntime(t, Options{Shards: 3})
	files := []string{
		"a.lua", `local luaop = require("luaop")
local util = require("lib.util")
luaop.on.create("example.com/v1/widgets", function(ctx) return util.tag("a") end, {id = "a"})
`,
		"b.lua", `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function(ctx) return "b1" end, {id = "b"})
`,
		"c.lua", `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function(ctx) return "c" end, {id = "c"})
`,
		"lib/util.lua", `return {tag = function(s) return s .. "-v1" end}
`,
	}
	rep := mustLoad(t, rt, files...)
	if want := []string{"a.lua", "b.lua", "c.lua", "lib/util.lua"}; !reflect.DeepEqual(rep.Compiled, want) {
		t.Errorf("first load compiled %v, want %v", rep.Compiled, want)
	}
	hashA, hashC := specOf(t, rt, "a").CodeHash, specOf(t, rt, "c").CodeHash

	// b changes: only b is compiled; every handler serves, b's new code included.
	files[3] = strings.Replace(files[3], "b1", "b2", 1)
	rep = mustLoad(t, rt, files...)
	if want := []string{"b.lua"}; !reflect.DeepEqual(rep.Compiled, want) {
		t.Errorf("reload compiled %v, want %v", rep.Compiled, want)
	}
	if rep.Held <= 0 || rep.Held > rep.Took {
		t.Errorf("Held = %s, want more than 0 and at most Took (%s)", rep.Held, rep.Took)
	}
	for uid, want := range map[string]any{"u1": "b2", "u2": "b2", "u3": "b2"} { // several shards
		if res := mustInvoke(t, rt, "b", createCause(uid)); res.Value != want {
			t.Errorf("%s: b = %#v, want %#v", uid, res.Value, want)
		}
		if res := mustInvoke(t, rt, "a", createCause(uid)); res.Value != "a-v1" {
			t.Errorf("%s: a = %#v", uid, res.Value)
		}
	}
	if got := specOf(t, rt, "a").CodeHash; got != hashA {
		t.Errorf("code hash of unchanged a changed: %s -> %s", hashA, got)
	}
	// A required module changes: the files requiring it run again (they always do)
	// and see the new module; only the module is compiled.
	files[7] = strings.Replace(files[7], "-v1", "-v2", 1)
	rep = mustLoad(t, rt, files...)
	if want := []string{"lib/util.lua"}; !reflect.DeepEqual(rep.Compiled, want) {
		t.Errorf("reload compiled %v, want %v", rep.Compiled, want)
	}
	if res := mustInvoke(t, rt, "a", createCause("u1")); res.Value != "a-v2" {
		t.Errorf("a after the module changed = %#v, want a-v2", res.Value)
	}
	// Nothing changed: nothing compiled, same hashes.
	rep = mustLoad(t, rt, files...)
	if len(rep.Compiled) != 0 {
		t.Errorf("identical reload compiled %v", rep.Compiled)
	}
	if got := specOf(t, rt, "c").CodeHash; got != hashC {
		t.Errorf("code hash of c changed on an identical reload")
	}
}

func TestReloadBrokenFileKeepsOldCodeThenRecovers(t *testing.T) {
	rt := newTestRuntime(t, Options{Shards: 3})
	good := []string{
		"a.lua", `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function(ctx) return "a1" end, {id = "a"})
`,
		"b.lua", `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function(ctx) return "b1" end, {id = "b"})
`,
	}
	mustLoad(t, rt, good...)
	hash := rt.Hash()
	for name, broken := range map[string]string{
		"syntax":  `local luaop = require("luaop") luaop.on.create(`,
		"runtime": `local luaop = require("luaop") error("boom")`,
	} {
		_, err := rt.Load(t.Context(), scriptsOf("a.lua", good[1], "b.lua", broken))
		if err == nil || !strings.Contains(err.Error(), "b.lua") {
			t.Errorf("%s: error %v, want one naming b.lua", name, err)
		}
		if rt.Hash() != hash {
			t.Errorf("%s: a failed load changed the hash", name)
		}
		for _, uid := range []string{"u1", "u2", "u3"} {
			if res := mustInvoke(t, rt, "b", createCause(uid)); res.Value != "b1" {
				t.Errorf("%s: b after a failed load = %#v, want the old b1", name, res.Value)
			}
		}
	}
	// The fix: b compiles, a (unchanged all along) does not.
	fixed := append([]string(nil), good...)
	fixed[3] = strings.Replace(fixed[3], "b1", "b2", 1)
	rep := mustLoad(t, rt, fixed...)
	if want := []string{"b.lua"}; !reflect.DeepEqual(rep.Compiled, want) {
		t.Errorf("reload after the fix compiled %v, want %v", rep.Compiled, want)
	}
	if res := mustInvoke(t, rt, "b", createCause("u2")); res.Value != "b2" {
		t.Errorf("b after the fix = %#v", res.Value)
	}
}

// A file's registration may depend on other files (modules): the handler file is
// unchanged, yet its spec, code hash and behaviour follow what it depends on.
func TestReloadUnchangedFileFollowsItsDependencies(t *testing.T) {
	rt := newTestRuntime(t, Options{Shards: 2})
	timer := `local luaop = require("luaop")
local opts = require("lib.opts")
luaop.timer("example.com/v1/widgets", function(ctx) return opts.prefix end, {id = "t", interval = opts.interval})
`
	mustLoad(t, rt, "b_timer.lua", timer, "lib/opts.lua", `return {interval = 10, prefix = "one"}`)
	before := specOf(t, rt, "t")
	rep := mustLoad(t, rt, "b_timer.lua", timer, "lib/opts.lua", `return {interval = 20, prefix = "two"}`)
	if want := []string{"lib/opts.lua"}; !reflect.DeepEqual(rep.Compiled, want) {
		t.Errorf("compiled %v, want %v", rep.Compiled, want)
	}
	after := specOf(t, rt, "t")
	if after.Interval == before.Interval {
		t.Errorf("interval stayed %v: the unchanged file did not run again", after.Interval)
	}
	if after.CodeHash == before.CodeHash {
		t.Errorf("code hash unchanged although the timer's options changed")
	}
	if res := mustInvoke(t, rt, "t", createCause("u1")); res.Value != "two" {
		t.Errorf("module value seen by the unchanged file's handler = %#v, want two", res.Value)
	}
}

// The main chunk's `arg` is a global (Lua 5.1), never gopher-lua's 5.0 vararg table,
// and `...` is empty: not building that table must change nothing a script sees.
func TestMainChunkArgAndVarargs(t *testing.T) {
	rt := loadedRuntime(t, Options{}, "a.lua", `local luaop = require("luaop")
local n = select("#", ...)
local seen = type(arg)
luaop.on.create("example.com/v1/widgets", function(ctx) return {n = n, arg = seen} end, {id = "a"})
`, "b.lua", `local luaop = require("luaop")
arg = "global"
local seen = arg
luaop.on.create("example.com/v1/widgets", function(ctx) return seen end, {id = "b"})
`)
	res := mustInvoke(t, rt, "a", createCause("u1"))
	if want := map[string]any{"n": int64(0), "arg": "nil"}; !reflect.DeepEqual(res.Value, want) {
		t.Errorf("a = %#v, want %#v", res.Value, want)
	}
	if res := mustInvoke(t, rt, "b", createCause("u1")); res.Value != "global" {
		t.Errorf("b = %#v", res.Value)
	}
}

// A reload gives every object a cycle only when the EvalHash of a handler it must
// revisit objects for (daemons, timers, indexes, handlers needing a finalizer)
// changed (processing.Reactor.Refresh): it must change with anything such a handler
// may evaluate (its code and options, its file: filters as data or functions,
// constants; any module; anything at all for an index) and stay put when only a file
// of other handlers changed.
func TestEvalHashFollowsWhatACycleEvaluates(t *testing.T) {
	const engines = `local luaop = require("luaop")
local util = require("lib.util")
local LIMIT = 3
luaop.daemon("example.com/v1/widgets", function(ctx) while luaop.sleep(30) do end end,
  {id = "d", labels = {tier = "gold"}, when = function(ctx) return util.big(ctx.spec.size, LIMIT) end})
luaop.timer("example.com/v1/widgets", function(ctx) return 1 end, {id = "t", interval = 10})
luaop.index("example.com/v1/widgets", function(ctx) return ctx.name end, {id = "i"})
`
	const other = `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function(ctx) return "c1" end, {id = "c"})
luaop.on.delete("example.com/v1/widgets", function(ctx) end, {id = "del"})
`
	const changes = `local luaop = require("luaop")
luaop.on.update("example.com/v1/widgets", function(ctx) return "u1" end, {id = "u"})
`
	const util = `return {big = function(size, limit) return size > limit end}
`
	ids := []string{"d", "t", "i", "c", "del", "u"}
	type hashes map[string][2]string // id -> CodeHash, EvalHash
	load := func(t *testing.T, rt *Runtime, files ...string) hashes {
		mustLoad(t, rt, files...)
		h := hashes{}
		for _, id := range ids {
			s := specOf(t, rt, id)
			h[id] = [2]string{s.CodeHash, s.EvalHash}
		}
		return h
	}
	set := func(engines, other, changes, util string) []string {
		return []string{"engines.lua", engines, "other.lua", other, "changes.lua", changes, "lib/util.lua", util}
	}
	for _, tc := range []struct {
		name        string
		files       []string
		evalChanged []string // handlers whose EvalHash must change
		codeChanged []string // handlers whose CodeHash must change
	}{
		{name: "identical", files: set(engines, other, changes, util)},
		{name: "a file of change handlers only edited", files: set(engines, other, strings.Replace(changes, "u1", "u2", 1), util),
			evalChanged: []string{"i"}, codeChanged: []string{"u"}},
		{name: "lines moved in the daemon's file", files: set("-- a comment\n\n"+engines, other, changes, util),
			evalChanged: []string{"d", "t", "i"}},
		{name: "the daemon's data filter edited", files: set(strings.Replace(engines, `"gold"`, `"silver"`, 1), other, changes, util),
			evalChanged: []string{"d", "t", "i"}}, // the cycle stops the daemon where it no longer matches
		{name: "a constant its filter reads edited", files: set(strings.Replace(engines, "LIMIT = 3", "LIMIT = 4", 1), other, changes, util),
			evalChanged: []string{"d", "t", "i"}},
		{name: "a module edited", files: set(engines, other, changes, strings.Replace(util, "size > limit", "size >= limit", 1)),
			evalChanged: []string{"d", "t", "i", "del"}},
		{name: "the delete handler's file edited", files: set(engines, strings.Replace(other, "c1", "c2", 1), changes, util),
			evalChanged: []string{"i", "del"}, codeChanged: []string{"c"}},
		{name: "the timer's interval edited", files: set(strings.Replace(engines, "interval = 10", "interval = 20", 1), other, changes, util),
			evalChanged: []string{"d", "t", "i"}, codeChanged: []string{"t"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := newTestRuntime(t, Options{Shards: 2})
			before := load(t, rt, set(engines, other, changes, util)...)
			after := load(t, rt, tc.files...)
			for _, id := range ids {
				b, a := before[id], after[id]
				if want := slices.Contains(tc.codeChanged, id); (a[0] != b[0]) != want {
					t.Errorf("%s: CodeHash %s -> %s, want changed = %v", id, b[0], a[0], want)
				}
				if want := slices.Contains(tc.evalChanged, id); (a[1] != b[1]) != want {
					t.Errorf("%s: EvalHash %q -> %q, want changed = %v", id, b[1], a[1], want)
				}
			}
			for _, id := range []string{"c", "u"} {
				if after[id][1] != "" {
					t.Errorf("%s (a change handler needing no finalizer) has EvalHash %q", id, after[id][1])
				}
			}
		})
	}
}
