package luabind

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// budgetedRuntime is a runtime whose memory budget is the heap now plus headroom.
func budgetedRuntime(t *testing.T, headroom uint64, pairs ...string) (*Runtime, uint64) {
	t.Helper()
	runtime.GC()
	budget := heapObjects() + headroom
	rt := loadedRuntime(t, Options{Shards: 2, HandlerTimeout: 5 * time.Minute, MemoryBudget: int64(budget)}, pairs...)
	return rt, budget
}

// checkHeapUnder asserts the heap, after a GC, is back under the budget.
func checkHeapUnder(t *testing.T, budget uint64) {
	t.Helper()
	runtime.GC()
	if h := heapObjects(); h > budget {
		t.Errorf("heap after GC = %s, over the budget of %s: the memory was not released", FormatBytes(h), FormatBytes(budget))
	}
}

const memoryBombs = `local luaop = require("luaop")
local R = "example.com/v1/widgets"
luaop.on.create(R, function(ctx)
  local t = {}
  while true do t[#t + 1] = {n = #t, s = "item"} end
end, {id = "table"})
luaop.on.create(R, function(ctx)
  local s, kept = "0123456789abcdef", {}
  while true do if #s < 4e6 then s = s .. s end; kept[#kept + 1] = s .. #kept end
end, {id = "doubling"})
luaop.on.create(R, function(ctx)
  local t = {}
  for i = 1, 1e9 do t[i] = string.rep("x", 1e6) .. i end
end, {id = "rep"})
luaop.on.create(R, function(ctx)
  local t = {}
  while true do t[#t + 1] = table.concat({string.rep("y", 1e5), #t}, ",") end
end, {id = "concat"})
luaop.on.create(R, function(ctx)
  local parts = {}
  local chunk = string.rep("f", 1e5)
  for i = 1, 1e9 do parts[i] = string.format("%s-%d", chunk, i) end
end, {id = "format"})
luaop.on.create(R, function(ctx) return "fine" end, {id = "fine"})
`

// Issue 16, memory bombs: each handler grows the heap without bound; the watchdog
// cancels it once the heap is over the budget, with "memory budget exceeded" naming
// file:line; the memory is released (the heap after GC is back under the budget) and
// the runtime keeps serving other objects and the same object.
func TestMemoryBudgetCancelsBombs(t *testing.T) {
	lines := map[string]string{"table": "bombs.lua:5", "doubling": "bombs.lua:9", "rep": "bombs.lua:13", "concat": "bombs.lua:17", "format": "bombs.lua:22"}
	rt, budget := budgetedRuntime(t, 96<<20, "bombs.lua", memoryBombs)
	for _, id := range []string{"table", "doubling", "rep", "concat", "format"} {
		t.Run(id, func(t *testing.T) {
			_, _, err := invokeHandler(t, rt, id, createCause("bomb-"+id))
			if err == nil {
				t.Fatal("the bomb returned")
			}
			if !errors.Is(err, ErrMemoryBudget) {
				t.Fatalf("error is not the budget's: %v", err)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, lines[id]+": memory budget exceeded") {
				t.Errorf("error = %q, want it to start with %q", msg, lines[id]+": memory budget exceeded")
			}
			checkHeapUnder(t, budget)
			// Another object, and the same one, are served.
			for _, uid := range []string{"other-" + id, "bomb-" + id} {
				if res := mustInvoke(t, rt, "fine", createCause(uid)); res.Value != "fine" {
					t.Errorf("%s after the bomb: %#v", uid, res.Value)
				}
			}
		})
	}
}

// A bomb at the top level of a script fails the load with the budget's error, and the
// scripts loaded before keep serving.
func TestMemoryBudgetCancelsLoad(t *testing.T) {
	rt, budget := budgetedRuntime(t, 96<<20, "a.lua", `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function(ctx) return "a" end, {id = "a"})`)
	_, err := rt.Load(t.Context(), scriptsOf("a.lua", `local luaop = require("luaop")
local cache = {}
while true do cache[#cache + 1] = {1, 2, 3} end`))
	if !errors.Is(err, ErrMemoryBudget) || !strings.HasPrefix(err.Error(), "a.lua:3: memory budget exceeded") {
		t.Fatalf("load error = %v", err)
	}
	checkHeapUnder(t, budget)
	if res := mustInvoke(t, rt, "a", createCause("u1")); res.Value != "a" {
		t.Errorf("the previous scripts stopped serving: %#v", res.Value)
	}
}

// Calls waiting in a blocking function allocate nothing and are never the ones
// cancelled; a short call running meanwhile is not either (the bomb runs longest).
func TestMemoryBudgetSparesOtherCalls(t *testing.T) {
	rt, budget := budgetedRuntime(t, 96<<20, "a.lua", `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function(ctx)
  local t = {}
  while true do t[#t + 1] = {n = #t} end
end, {id = "bomb"})
luaop.on.create("example.com/v1/widgets", function(ctx)
  luaop.sleep(0.2)
  return "slept"
end, {id = "sleeper"})
`)
	done := make(chan error, 4)
	for i := range 4 {
		go func() {
			res, _, err := invokeHandler(t, rt, "sleeper", createCause("sleeper-"+string(rune('a'+i))))
			if err == nil && res.Value != "slept" {
				err = errors.New("sleeper returned " + res.Value.(string))
			}
			done <- err
		}()
	}
	if _, _, err := invokeHandler(t, rt, "bomb", createCause("bomb")); !errors.Is(err, ErrMemoryBudget) {
		t.Fatalf("bomb: %v", err)
	}
	for range 4 {
		if err := <-done; err != nil {
			t.Errorf("a sleeping call failed: %v", err)
		}
	}
	checkHeapUnder(t, budget)
}

// The guards that stop single big allocations the watchdog cannot interrupt, and the
// stack bounds: each gives a clear error with file:line, the runtime goes on. (The
// data stack's bound, "registry overflow", is TestThreadStacksGrowWithinLimits'.)
func TestMemoryGuards(t *testing.T) {
	rt := loadedRuntime(t, Options{Shards: 1}, "g.lua", `local luaop = require("luaop")
local R = "example.com/v1/widgets"
luaop.on.create(R, function(ctx) return string.rep("x", 1e10) end, {id = "rep"})
luaop.on.create(R, function(ctx) local t = {} for i = 1, 20 do t[i] = string.rep("z", 1e6) end return table.concat(t) end, {id = "concat"})
luaop.on.create(R, function(ctx) return string.format("%s%s%s", string.rep("a", 9e6), string.rep("b", 9e6), "c") end, {id = "format"})
luaop.on.create(R, function(ctx)
  local v, err = luaop.json.decode("[" .. string.rep("[],", 4e6) .. "[]]")
  if v == nil then error(err) end
end, {id = "json"})
luaop.on.create(R, function(ctx)
  local v, err = luaop.yaml.decode(string.rep("- []\n", 3e5))
  if v == nil then error(err) end
end, {id = "yaml"})
luaop.on.create(R, function(ctx) local function f(n) return 1 + f(n + 1) end return f(1) end, {id = "recursion"})
luaop.on.create(R, function(ctx)
  local t = setmetatable({}, {__index = function(t, k) return t[k .. "x"] end})
  return t.a
end, {id = "metarecursion"})
luaop.on.create(R, function(ctx) return #luaop.json.encode(luaop.json.decode(string.rep(" ", 1e6) .. "[1, 2]")) end, {id = "decodes"})
`)
	cases := []struct{ id, want string }{
		{"rep", "g.lua:3: string.rep: result too large"},
		{"concat", "g.lua:4: table.concat: result too large"},
		{"format", "g.lua:5: string.format: result too large"},
		{"json", "g.lua:8: json.decode: document too large (about 8000003 values, more than the 262144 allowed)"},
		{"yaml", "g.lua:12: yaml.decode: document too large"},
		{"recursion", "g.lua:14: stack overflow"},
		{"metarecursion", "g.lua:16: stack overflow"},
	}
	for _, tc := range cases {
		_, _, err := invokeHandler(t, rt, tc.id, createCause("u-"+tc.id))
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%s: error = %v, want it to start with %q", tc.id, err, tc.want)
		}
	}
	// A large but reasonable document decodes.
	if res := mustInvoke(t, rt, "decodes", createCause("u1")); res.Value != int64(5) {
		t.Errorf("decodes = %#v", res.Value)
	}
}

func TestDefaultMemoryBudget(t *testing.T) {
	budget, source := DefaultMemoryBudget()
	if budget <= 0 || source == "" {
		t.Fatalf("DefaultMemoryBudget() = %d, %q", budget, source)
	}
	if rt := newTestRuntime(t, Options{}); rt.MemoryBudget() != budget {
		t.Errorf("a runtime's default budget = %d, want %d (%s)", rt.MemoryBudget(), budget, source)
	}
	if rt := newTestRuntime(t, Options{MemoryBudget: -1}); rt.MemoryBudget() != 0 {
		t.Errorf("MemoryBudget -1 gives %d, want no budget", rt.MemoryBudget())
	}
}

// heapGrowth is how much the heap's objects grew (negative: shrank) across f, each
// side measured after a GC.
func heapGrowth(f func()) int64 {
	runtime.GC()
	before := heapObjects()
	f()
	runtime.GC()
	return int64(heapObjects()) - int64(before)
}

// An operator that runs for weeks sees objects come and go under new uids: a memo
// must not outlive its object. gopher-lua's tables keep every string key ever set
// (setting it to nil leaves it in the key list), so memos kept in a Lua table keyed
// by uid grew by about 100 bytes per object ever handled (found by the soak). After
// tens of thousands of objects were handled and forgotten, the heap holds no trace of
// them.
func TestForgottenObjectsLeaveNoMemory(t *testing.T) {
	rt := loadedRuntime(t, Options{Shards: 2}, "memo.lua", `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function(ctx)
  ctx.memo.seen = (ctx.memo.seen or 0) + 1
  return ctx.memo.seen
end, {id = "count"})
`)
	spec := specOf(t, rt, "count")
	churn := func(from, n int) {
		for i := from; i < from+n; i++ {
			uid := fmt.Sprintf("00000000-0000-0000-0000-%012d", i)
			res, err := rt.Invoke(t.Context(), causes.Call{Handler: spec, Cause: createCause(uid), Patch: state.NewPatch()})
			if err != nil || res.Value != int64(1) {
				t.Fatalf("object %d: result %#v, error %v; want a fresh memo (1)", i, res.Value, err)
			}
			rt.Forget(uid)
		}
	}
	churn(0, 2000) // pools and maps reach their working size
	const objects = 40000
	// About 5 MB with the leak; what is left is noise from the allocator.
	if grew := heapGrowth(func() { churn(2000, objects) }); grew > 1<<20 {
		t.Errorf("heap grew by %s after %d objects were handled and forgotten: something keeps forgotten objects",
			FormatBytes(uint64(grew)), objects)
	}
}

// A reload replaces the scripts: what the old ones compiled to must go. The soak
// rewrites one file every 30 s; each revision compiles to a few prototypes (gopher-lua
// keeps about 12 KB of compiler buffers with each), so a generation kept alive by
// anything would show as megabytes here.
func TestReloadsLeaveNoOldScriptsBehind(t *testing.T) {
	revision := func(n int) string {
		return fmt.Sprintf(`-- revision %d
local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function(ctx)
  ctx.memo.seen = (ctx.memo.seen or 0) + 1
  return { rev = %d, size = ctx.spec.size }
end, {id = "created"})
luaop.on.update("example.com/v1/widgets", function(ctx)
  ctx.patch.status.updated = { size = ctx.spec.size }
end, {id = "updated"})
luaop.on.field("example.com/v1/widgets", "spec.size", function(ctx) return ctx.new end, {id = "sized"})
luaop.on.probe(function(ctx) return "ok" end, {id = "alive"})
`, n, n)
	}
	rt := loadedRuntime(t, Options{Shards: 2}, "handlers.lua", revision(0))
	reload := func(from, n int) {
		for i := from; i < from+n; i++ {
			mustLoad(t, rt, "handlers.lua", revision(i))
			// Calls between reloads, as an operator makes them: each takes a call thread
			// of the pool, which must not keep the generation it ran.
			uid := fmt.Sprintf("uid-%d", i%10)
			if res := mustInvoke(t, rt, "created", createCause(uid)); res.Value == nil {
				t.Fatalf("revision %d: no result", i)
			}
		}
	}
	reload(1, 20)
	const reloads = 300
	if grew := heapGrowth(func() { reload(21, reloads) }); grew > 2<<20 {
		t.Errorf("heap grew by %s over %d reloads (%s per reload): old generations are kept",
			FormatBytes(uint64(grew)), reloads, FormatBytes(uint64(grew/reloads)))
	}
}

// What a loaded script costs stays proportional to its code: an operator with many
// small files (or a daemon keeping its generation's functions) pays for what they
// hold, not for compiler buffers. gopher-lua's compiler slices each function's code
// and line table out of buffers made for 1,024 instructions, 12 KB per function.
func TestLoadedScriptsCostWhatTheyHold(t *testing.T) {
	const files = 200
	var pairs []string
	for i := range files {
		pairs = append(pairs, fmt.Sprintf("f%03d.lua", i), fmt.Sprintf(`local luaop = require("luaop")
local function double(x) return x * 2 end
luaop.on.create("example.com/v1/widgets", function(ctx) return double(%d) end, {id = "c%d"})
luaop.on.update("example.com/v1/widgets", function(ctx) return double(ctx.spec.size) end, {id = "u%d"})
`, i, i, i))
	}
	var rt *Runtime
	perFile := heapGrowth(func() { rt = loadedRuntime(t, Options{Shards: 1}, pairs...) }) / files
	// Four functions per file: 75 KB per file with the compiler's buffers; what the
	// file holds (its code, constants, closures, globals table, handler specs) is
	// about 11 KB.
	t.Logf("a loaded file of four small functions holds %s (one shard)", FormatBytes(uint64(max(perFile, 0))))
	if perFile > 24<<10 {
		t.Errorf("a loaded file of four small functions holds %s", FormatBytes(uint64(perFile)))
	}
	runtime.KeepAlive(rt)
}

// A daemon runs the code of the load it started in, for as long as it runs: that is
// all it may keep of its load. Daemons started across many reloads (objects come and
// go while the scripts change) keep only their own file's functions and globals, not
// every file their load compiled. A handler may still require a module lazily, at
// call time.
func TestDaemonsKeepOnlyTheirOwnCode(t *testing.T) {
	daemon := `local luaop = require("luaop")
luaop.daemon("example.com/v1/widgets", function(ctx)
  ctx.patch.status.up = true -- handed over at the first sleep: the daemon is parked
  while luaop.sleep(3600) do end
end, {id = "sleeper"})
`
	// A big file beside it: many functions, rewritten at every reload.
	handlers := func(rev int) string {
		var b strings.Builder
		fmt.Fprintf(&b, "-- revision %d\nlocal luaop = require(\"luaop\")\n", rev)
		for i := range 40 {
			fmt.Fprintf(&b, "local function helper%d(x) return x + %d + %d end\n", i, i, rev)
			fmt.Fprintf(&b, "luaop.on.update(\"example.com/v1/widgets\", function(ctx) return helper%d(1) end, {id = \"u%d\"})\n", i, i)
		}
		b.WriteString(`luaop.on.create("example.com/v1/widgets", function(ctx) return require("lib.util").twice(21) end, {id = "lazy"})` + "\n")
		return b.String()
	}
	util := `return { twice = function(x) return 2 * x end }`
	rt := loadedRuntime(t, Options{Shards: 1}, "daemon.lua", daemon, "handlers.lua", handlers(0), "lib/util.lua", util)
	if got := mustInvoke(t, rt, "lazy", createCause("lazy-uid")).Value; got != int64(42) {
		t.Fatalf("a module required at call time: %#v, want 42", got)
	}
	stop, closeStop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { closeStop(); wg.Wait() })
	var parked atomic.Int64
	startDaemon := func(uid string) {
		body := widgetObject(uid)
		spec := specOf(t, rt, "sleeper")
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = rt.RunDaemon(context.Background(), &causes.Call{Handler: spec, Cause: causes.Cause{Body: body},
				Daemon: &causes.DaemonLink{Stopped: stop, Latest: func() map[string]any { return body }, Flush: func(map[string]any) { parked.Add(1) }}})
		}()
	}
	waitParked := func(n int64) {
		deadline := time.Now().Add(time.Minute)
		for parked.Load() < n {
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d daemons parked", parked.Load(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	// Each daemon parks before the next load, so that it runs the load it started in.
	started := 0
	generations := func(from, n int) {
		for i := from; i < from+n; i++ {
			mustLoad(t, rt, "daemon.lua", daemon, "handlers.lua", handlers(i), "lib/util.lua", util)
			startDaemon(fmt.Sprintf("uid-%d", i))
			started++
			waitParked(int64(started))
		}
	}
	generations(1, 10)
	const n = 100
	per := heapGrowth(func() { generations(11, n) }) / n
	t.Logf("a daemon started in a load of its own keeps %s (with its goroutine's heap)", FormatBytes(uint64(max(per, 0))))
	if per > 40<<10 {
		t.Errorf("each daemon keeps %s of its load: more than its own file", FormatBytes(uint64(per)))
	}
}
