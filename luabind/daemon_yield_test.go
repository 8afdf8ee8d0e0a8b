package luabind

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/luaop/luaop/luabind/internal/luaerr"
	"github.com/luaop/luaop/processing/causes"
)

// daemonProbe starts daemons and records, for each, its flushes and how it ended.
type daemonProbe struct {
	mu      sync.Mutex
	flushes map[string][]map[string]any // by uid
	ended   map[string][]error          // by uid: done's errors (more than one is a bug)
	endedCh chan string
}

func newDaemonProbe() *daemonProbe {
	return &daemonProbe{flushes: map[string][]map[string]any{}, ended: map[string][]error{}, endedCh: make(chan string, 1024)}
}

// start calls StartDaemon and reports whether done was called before it returned.
func (p *daemonProbe) start(ctx context.Context, rt *Runtime, spec causes.Spec, uid string, stop context.Context) (endedFirst bool) {
	body := widgetBody(uid, "w-"+uid)
	var returned atomic.Bool
	var endedBeforeReturn atomic.Bool
	rt.StartDaemon(ctx, &causes.Call{Handler: spec, Cause: causes.Cause{Body: body}, Logger: slog.Default(),
		Daemon: &causes.DaemonLink{Stopped: stop, Latest: func() map[string]any { return body },
			Flush: func(patch map[string]any) {
				p.mu.Lock()
				p.flushes[uid] = append(p.flushes[uid], patch)
				p.mu.Unlock()
			}}},
		func(err error) {
			if !returned.Load() {
				endedBeforeReturn.Store(true)
			}
			p.mu.Lock()
			p.ended[uid] = append(p.ended[uid], err)
			p.mu.Unlock()
			p.endedCh <- uid
		})
	returned.Store(true)
	return endedBeforeReturn.Load()
}

// wait waits for n daemons to end.
func (p *daemonProbe) wait(t *testing.T, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		select {
		case <-p.endedCh:
		case <-time.After(promptWait):
			t.Fatalf("%d of %d daemons ended; the others did not", i, n)
		}
	}
}

func (p *daemonProbe) result(uid string) (flushes []map[string]any, ended []error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]map[string]any(nil), p.flushes[uid]...), append([]error(nil), p.ended[uid]...)
}

// A daemon sleeping at the top level of its Lua holds no goroutine: StartDaemon
// returns once it sleeps (with its patch flushed), however many sleep, and a stop
// resumes each where it slept, its locals intact, to end once.
func TestSleepingDaemonsHoldNoGoroutine(t *testing.T) {
	rt := loadedRuntime(t, Options{Shards: 2}, "d.lua", `local luaop = require("luaop")
luaop.daemon("example.com/v1/widgets", function(ctx)
  local name = ctx.name
  local woken = 0
  ctx.patch.status.phase = "sleeping"
  while luaop.sleep(3600) do woken = woken + 1 end
  ctx.patch.status.woke = {name = name, woken = woken, stopped = ctx.stopped()}
end, {id = "d"})
`)
	spec := specOf(t, rt, "d")
	stop, closeStop := context.WithCancel(context.Background())
	p := newDaemonProbe()
	const n = 200
	runtime.GC()
	before := runtime.NumGoroutine()
	started := make(chan bool)
	go func() {
		for i := range n {
			started <- p.start(t.Context(), rt, spec, fmt.Sprintf("u%d", i), stop)
		}
	}()
	for i := range n {
		select {
		case endedFirst := <-started:
			if endedFirst {
				t.Fatalf("daemon %d ended before it slept", i)
			}
		case <-time.After(promptWait):
			t.Fatalf("StartDaemon of daemon %d did not return while it sleeps: the sleep holds its goroutine", i)
		}
	}
	if grown := runtime.NumGoroutine() - before; grown >= n/2 {
		t.Errorf("%d goroutines more with %d sleeping daemons: they hold one each", grown, n)
	}
	for i := range n {
		flushes, ended := p.result(fmt.Sprintf("u%d", i))
		if len(flushes) != 1 || len(ended) != 0 {
			t.Fatalf("daemon %d: flushes %v, ended %v; want its patch flushed as it sleeps", i, flushes, ended)
		}
	}
	closeStop()
	p.wait(t, n)
	for i := range n {
		uid := fmt.Sprintf("u%d", i)
		flushes, ended := p.result(uid)
		if len(ended) != 1 || ended[0] != nil {
			t.Errorf("daemon %s ended %v; want once, without an error", uid, ended)
		}
		want := fmt.Sprint(map[string]any{"name": "w-" + uid, "woken": int64(0), "stopped": true})
		if len(flushes) != 2 || fmt.Sprint(flushes[1]["status"].(map[string]any)["woke"]) != want {
			t.Errorf("daemon %s flushed %v; want a last flush of %s", uid, flushes, want)
		}
	}
}

// Woken by its timer, a yielded daemon continues where it slept: locals, upvalues
// and ctx.memo intact, each stretch under a deadline of its own.
func TestYieldedDaemonContinuesAfterItsTimer(t *testing.T) {
	rt := loadedRuntime(t, Options{Shards: 1, HandlerTimeout: time.Second}, "d.lua", `local luaop = require("luaop")
luaop.daemon("example.com/v1/widgets", function(ctx)
  local n, trace = 0, {}
  local function step() n = n + 1; trace[#trace + 1] = n end
  ctx.memo.runs = (ctx.memo.runs or 0) + 1
  repeat
    step()
    ctx.patch.status.n = n
  until not luaop.sleep(0.001) or n == 5
  ctx.patch.status.trace = table.concat(trace, ",")
  ctx.patch.status.runs = ctx.memo.runs
end, {id = "d"})
`)
	p := newDaemonProbe()
	for round := 1; round <= 2; round++ {
		p.start(t.Context(), rt, specOf(t, rt, "d"), "ua", context.Background())
		p.wait(t, 1)
	}
	flushes, ended := p.result("ua")
	if len(ended) != 2 || ended[0] != nil || ended[1] != nil {
		t.Fatalf("ended %v; want two clean runs", ended)
	}
	last := flushes[len(flushes)-1]["status"].(map[string]any)
	if last["trace"] != "1,2,3,4,5" || last["runs"] != int64(2) {
		t.Errorf("last flush %v; want trace 1,2,3,4,5, the memo counting 2 runs", last)
	}
	if len(flushes) != 12 { // five sleeps (n = 1..5 flushed at each) and the end, per run
		t.Errorf("%d flushes, want 12: %v", len(flushes), flushes)
	}
}

// Where a yield cannot cross Go frames (pcall, xpcall, a Lua iterator or a
// metamethod the VM calls), luaop.sleep blocks instead: the daemon works the same,
// it only keeps its goroutine while it sleeps (StartDaemon returns when it ends).
func TestDaemonSleepWhereItCannotYield(t *testing.T) {
	tests := []struct{ name, sleep string }{
		{"top level", `luaop.sleep(0.001)`},
		{"pcall", `assert(pcall(luaop.sleep, 0.001))`},
		{"xpcall", `assert(xpcall(function() luaop.sleep(0.001) end, function(e) return e end))`},
		{"Lua iterator", `for _ in function(_, i) if not i then luaop.sleep(0.001); return 1 end end do end`},
		{"__index metamethod", `local t = setmetatable({}, {__index = function(_, k) luaop.sleep(0.001); return k end}); assert(t.x == "x")`},
		{"table.sort comparator", `local t = {3, 1, 2}; table.sort(t, function(a, b) luaop.sleep(0.001); return a < b end); assert(t[1] == 1)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt := loadedRuntime(t, Options{Shards: 1}, "d.lua", `local luaop = require("luaop")
luaop.daemon("example.com/v1/widgets", function(ctx)
  local n = 0
  for i = 1, 3 do
    `+tt.sleep+`
    n = n + 1
  end
  ctx.patch.status.n = n
end, {id = "d"})
`)
			p := newDaemonProbe()
			endedFirst := p.start(t.Context(), rt, specOf(t, rt, "d"), "ua", context.Background())
			p.wait(t, 1)
			flushes, ended := p.result("ua")
			if len(ended) != 1 || ended[0] != nil {
				t.Fatalf("ended %v; want once, without an error", ended)
			}
			if got := flushes[len(flushes)-1]["status"].(map[string]any)["n"]; got != int64(3) {
				t.Errorf("n = %v, want 3", got)
			}
			if yields := tt.name == "top level"; endedFirst == yields {
				t.Errorf("done called before StartDaemon returned: %v; want %v (a sleep that yields returns at once)", endedFirst, !yields)
			}
		})
	}
}

// An error raised after a yield names its file and line, as one raised before the
// first sleep does: errors that carry no location of their own (error(table), a
// luaop error object) take it from the traceback.
func TestDaemonErrorAfterASleepNamesFileAndLine(t *testing.T) {
	tests := []struct{ name, raise, message string }{
		{"error(string)", `error("boom")`, "boom"},
		{"error(table)", `error({message = "boom"})`, "boom"},
		{"a runtime error", `local x = nil; return x.field`, "attempt to index"},
		{"luaop.PermanentError-like table without a message", `error({code = 3})`, "code"},
	}
	for _, tt := range tests {
		for _, sleeps := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/after a sleep=%v", tt.name, sleeps), func(t *testing.T) {
				sleep := ""
				if sleeps {
					sleep = "luaop.sleep(0)"
				}
				rt := loadedRuntime(t, Options{Shards: 1}, "d.lua", `local luaop = require("luaop")
luaop.daemon("example.com/v1/widgets", function(ctx)
  `+sleep+`
  `+tt.raise+`
end, {id = "d"})
`)
				err := rt.RunDaemon(t.Context(), &causes.Call{Handler: specOf(t, rt, "d"), Cause: causes.Cause{Body: widgetBody("ua", "a")},
					Logger: slog.Default(), Daemon: &causes.DaemonLink{Stopped: context.Background()}})
				var se *luaerr.ScriptError
				if !errors.As(err, &se) {
					t.Fatalf("err = %v (%T), want a script error", err, err)
				}
				if se.File != "d.lua" || se.Line != 4 || !strings.Contains(se.Message, tt.message) {
					t.Errorf("error at %s:%d %q; want d.lua:4 and %q", se.File, se.Line, se.Message, tt.message)
				}
			})
		}
	}
}

// A daemon over the memory budget when it went to sleep fails as it wakes: the
// budget's cancellation is not lost with the stretch's deadline that the sleep
// ended (for a yielded daemon as for one blocked inside pcall, see
// TestDaemonOverBudgetCannotEscapeThroughPcall).
func TestYieldedDaemonOverBudgetFailsAsItWakes(t *testing.T) {
	rt := New(Options{Shards: 1, HandlerTimeout: time.Hour})
	defer func() {
		if !t.Failed() { // when the daemon escaped it spins for ever: reported, not hung on
			rt.Close()
		}
	}()
	mustLoad(t, rt, "d.lua", `local luaop = require("luaop")
luaop.daemon("example.com/v1/widgets", function(ctx)
  ctx.patch.status.phase = "sleeping"
  luaop.sleep(0)
  while true do end
end, {id = "d"})
`)
	sh := rt.shards[0].Load()
	body := widgetBody("ua", "a")
	done := make(chan error, 1)
	rt.StartDaemon(t.Context(), &causes.Call{Handler: specOf(t, rt, "d"), Cause: causes.Cause{Body: body},
		Logger: slog.Default(), Daemon: &causes.DaemonLink{Stopped: context.Background(), Latest: func() map[string]any { return body },
			Flush: func(map[string]any) {
				// Sleeping, the shard released: mark the call over the budget, as
				// the memory watch does when the whole runtime is over it.
				sh.relock()
				for _, th := range sh.threads {
					if th.cs != nil && th.cs.daemon {
						th.cs.mem.hit.Store(true)
					}
				}
				sh.unlock()
			}}}, func(err error) { done <- err })
	select {
	case err := <-done:
		if !errors.Is(err, ErrMemoryBudget) && (err == nil || !strings.Contains(err.Error(), ErrMemoryBudget.Error())) {
			t.Fatalf("daemon ended with %v, want the memory budget error", err)
		}
		if se := (*luaerr.ScriptError)(nil); !errors.As(err, &se) || se.File != "d.lua" || se.Line != 4 {
			t.Errorf("the budget error is located at %+v; want d.lua:4 (the sleep)", se)
		}
	case <-time.After(promptWait):
		t.Fatal("the daemon woke over the budget and ran on without a deadline")
	}
}

// Sleeping daemons, handler calls and a reload on one shard at once: every daemon
// wakes and sleeps many times (yielding and blocking) with other calls running and
// parking in between, the reload
// changes what new calls run but not the running daemons, and each daemon ends once
// with its own count. Run with -race.
func TestYieldingDaemonsInterleaveWithCallsAndAReload(t *testing.T) {
	const script = `local luaop = require("luaop")
luaop.daemon("example.com/v1/widgets", function(ctx)
  local uid, n = ctx.uid, 0
  while n < 30 do
    -- Half the sleeps yield, half block (inside pcall), as daemons may mix them.
    if n % 2 == 0 then luaop.sleep(0) else assert(pcall(luaop.sleep, 0)) end
    n = n + 1
    ctx.memo.seen = n
  end
  ctx.patch.status.done = {uid = uid, n = n, version = VERSION}
end, {id = "d"})
luaop.on.create("example.com/v1/widgets", function(ctx) luaop.sleep(0); return VERSION end, {id = "c"})
`
	rt := loadedRuntime(t, Options{Shards: 1}, "d.lua", "VERSION = 1\n"+script)
	p := newDaemonProbe()
	const daemons = 20
	for i := range daemons {
		p.start(t.Context(), rt, specOf(t, rt, "d"), fmt.Sprintf("u%d", i), context.Background())
	}
	var wg sync.WaitGroup
	var calls, reloaded atomic.Int64
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				res, err := rt.Invoke(t.Context(), causes.Call{Handler: specOf(t, rt, "c"), Cause: causes.Cause{Body: widgetBody(fmt.Sprintf("c%d-%d", w, i), "c")}})
				if err != nil {
					t.Errorf("a call beside the daemons: %v", err)
					return
				}
				if v, _ := res.Value.(int64); v < 1 || v > 2 {
					t.Errorf("a call returned %v; want 1 or 2", res.Value)
				}
				calls.Add(1)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		mustLoad(t, rt, "d.lua", "VERSION = 2\n"+script)
		reloaded.Store(1)
	}()
	p.wait(t, daemons)
	wg.Wait()
	for i := range daemons {
		uid := fmt.Sprintf("u%d", i)
		flushes, ended := p.result(uid)
		if len(ended) != 1 || ended[0] != nil {
			t.Errorf("daemon %s ended %v; want once, cleanly", uid, ended)
			continue
		}
		got := fmt.Sprint(flushes[len(flushes)-1]["status"].(map[string]any)["done"])
		if want := fmt.Sprint(map[string]any{"uid": uid, "n": int64(30), "version": int64(1)}); got != want {
			t.Errorf("daemon %s ended with %s; want %s (its own count, the code it started with)", uid, got, want)
		}
	}
	res, err := rt.Invoke(t.Context(), causes.Call{Handler: specOf(t, rt, "c"), Cause: causes.Cause{Body: widgetBody("after", "c")}})
	if err != nil || res.Value != int64(2) || calls.Load() != 200 || reloaded.Load() != 1 {
		t.Errorf("after the storm: %v, %v, %d calls, reloaded %d; want the reloaded code (2), 200 calls", res.Value, err, calls.Load(), reloaded.Load())
	}
}

// processing starts a daemon without a body of its own (it reads the newest through
// Latest): its identity comes from the link, also once Latest has nothing (its object
// gone, or re-created under its name), and so does its memo.
func TestDaemonWithoutABodyReadsItsIdentityFromTheLink(t *testing.T) {
	rt := loadedRuntime(t, Options{Shards: 2}, "d.lua", `local luaop = require("luaop")
luaop.daemon("example.com/v1/widgets", function(ctx)
  ctx.memo.before = ctx.spec.size
  ctx.patch.status.phase = "sleeping" -- flushed as it sleeps: the test's object is then gone
  luaop.sleep(0)
  ctx.patch.status.seen = {name = ctx.name, namespace = ctx.namespace, uid = ctx.uid, size = ctx.spec.size or "gone", memo = ctx.memo.before}
end, {id = "d"})
`)
	body := widgetBody("ua", "a")
	body["spec"] = map[string]any{"size": int64(3)}
	var gone atomic.Bool
	var flushed []map[string]any
	err := rt.RunDaemon(t.Context(), &causes.Call{Handler: specOf(t, rt, "d"), Logger: slog.Default(),
		Daemon: &causes.DaemonLink{Stopped: context.Background(), UID: "ua", Name: "a", Namespace: "ns",
			Latest: func() map[string]any {
				if gone.Load() {
					return nil
				}
				return body
			},
			Flush: func(p map[string]any) { flushed = append(flushed, p); gone.Store(true) }}})
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprint(map[string]any{"name": "a", "namespace": "ns", "uid": "ua", "size": "gone", "memo": int64(3)})
	if got := fmt.Sprint(flushed[len(flushed)-1]["status"].(map[string]any)["seen"]); got != want {
		t.Errorf("the daemon saw %s; want %s", got, want)
	}
}

// gateKube is a cluster whose Get of a name waits until that name's gate opens.
type gateKube struct {
	Kube
	entered chan string
	mu      sync.Mutex
	gates   map[string]chan struct{}
}

func newGateKube() *gateKube {
	return &gateKube{entered: make(chan string, 16), gates: map[string]chan struct{}{}}
}

func (k *gateKube) gate(name string) chan struct{} {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.gates[name] == nil {
		k.gates[name] = make(chan struct{})
	}
	return k.gates[name]
}

func (k *gateKube) Get(ctx context.Context, _, _, _, name string) (map[string]any, error) {
	k.entered <- name
	select {
	case <-k.gate(name):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": name}}, nil
}

func (k *gateKube) waitEntered(t *testing.T, name string) {
	t.Helper()
	select {
	case got := <-k.entered:
		if got != name {
			t.Fatalf("%s waits; want %s", got, name)
		}
	case <-time.After(promptWait):
		t.Fatalf("%s was not called within %s", name, promptWait)
	}
}

// A handler call that parks while a daemon is parked in a blocking function keeps
// the state's "current thread" of that moment (the daemon's) and puts it back when
// it continues, after the daemon went on to yield: resuming the daemon must not
// depend on it. The order is forced: daemon parks, handler parks, daemon continues
// and yields, handler continues and ends, daemon is woken.
func TestDaemonResumesAfterACallParkedBesideIt(t *testing.T) {
	kube := newGateKube()
	rt := loadedRuntime(t, Options{Shards: 1, Kube: kube}, "d.lua", `local luaop = require("luaop")
luaop.daemon("example.com/v1/widgets", function(ctx)
  assert(pcall(luaop.kube.get, "v1", "ConfigMap", "ns", "daemon"))
  ctx.patch.status.phase = "yielding"
  local slept = luaop.sleep(3600)
  ctx.patch.status.woke = {slept = slept}
end, {id = "d"})
luaop.on.create("example.com/v1/widgets", function(ctx)
  luaop.kube.get("v1", "ConfigMap", "ns", "handler")
  return "done"
end, {id = "c"})
`)
	stop, closeStop := context.WithCancel(context.Background())
	body := widgetBody("ua", "a")
	flushed := make(chan map[string]any, 4)
	done := make(chan error, 1)
	go rt.StartDaemon(t.Context(), &causes.Call{Handler: specOf(t, rt, "d"), Cause: causes.Cause{Body: body}, Logger: slog.Default(),
		Daemon: &causes.DaemonLink{Stopped: stop, Latest: func() map[string]any { return body }, Flush: func(p map[string]any) { flushed <- p }}},
		func(err error) { done <- err })
	kube.waitEntered(t, "daemon")
	handler := make(chan error, 1)
	go func() {
		_, err := rt.Invoke(t.Context(), causes.Call{Handler: specOf(t, rt, "c"), Cause: causes.Cause{Body: widgetBody("ub", "b")}})
		handler <- err
	}()
	kube.waitEntered(t, "handler")
	close(kube.gate("daemon"))
	select {
	case <-flushed: // the daemon yielded in its sleep
	case <-time.After(promptWait):
		t.Fatal("the daemon did not reach its sleep")
	}
	close(kube.gate("handler"))
	if err := <-handler; err != nil {
		t.Fatalf("the handler: %v", err)
	}
	stopAndWaitDaemon(t, closeStop, done)
	if got := fmt.Sprint(<-flushed); got != fmt.Sprint(map[string]any{"status": map[string]any{"woke": map[string]any{"slept": false}}}) {
		t.Errorf("last flush %s; want woke.slept = false", got)
	}
}

// luaop.sleep gives every call shape the one value it returns, whether it yields or
// blocks (inside pcall), and a tail call sleeps and flushes like any other. (Each
// result is stored after the sleep: the sleep flushes ctx.patch and starts a new
// one, so a ctx.patch table fetched before it, as in ctx.patch.status.r =
// f(luaop.sleep(1)), is no longer the patch.)
func TestDaemonSleepResultsWhetherItYieldsOrBlocks(t *testing.T) {
	tests := []struct{ name, body, want string }{
		{"one result", `local a = luaop.sleep(0); ctx.patch.status.r = tostring(a)`, "true"},
		{"three results", `local x = 7; local a, b, c = luaop.sleep(0); ctx.patch.status.r = tostring(a)..","..tostring(b)..","..tostring(c)..","..x`, "true,nil,nil,7"},
		{"in a table", `local t = {luaop.sleep(0)}; ctx.patch.status.r = #t..","..tostring(t[1])`, "1,true"},
		{"select('#')", `local n = select("#", luaop.sleep(0)); ctx.patch.status.r = tostring(n)`, "1"},
		{"an argument in the middle", `local function f(a, b, c) return a..","..tostring(b)..","..c end; local r = f(1, luaop.sleep(0), 3); ctx.patch.status.r = r`, "1,true,3"},
		{"through a helper's tail call", `local function nap(s) return luaop.sleep(s) end; local r = tostring(nap(0))..","..tostring(nap(0)); ctx.patch.status.r = r`, "true,true"},
		{"a number in a string", `local r = tostring(luaop.sleep("0")); ctx.patch.status.r = r`, "true"},
	}
	for _, tt := range tests {
		for _, mode := range []string{"yields", "blocks"} {
			t.Run(tt.name+"/"+mode, func(t *testing.T) {
				body := tt.body
				if mode == "blocks" {
					body = "assert(pcall(function() " + body + " end))"
				}
				flushes, err := runDaemonBody(t, body)
				if err != nil || len(flushes) == 0 {
					t.Fatalf("flushes %v, err %v", flushes, err)
				}
				if got := fmt.Sprint(flushes[len(flushes)-1]["status"].(map[string]any)["r"]); got != tt.want {
					t.Errorf("got %s, want %s", got, tt.want)
				}
			})
		}
	}
	t.Run("return luaop.sleep(0) as the last statement", func(t *testing.T) {
		// The sleep flushes the patch; what the daemon then returns (the sleep's
		// true) is its result, at status.<id> (kopf delivers a daemon's result).
		flushes, err := runDaemonBody(t, `ctx.patch.status.r = "before"; return luaop.sleep(0)`)
		if err != nil || len(flushes) != 2 || flushes[0]["status"].(map[string]any)["r"] != "before" || flushes[1]["status"].(map[string]any)["d"] != true {
			t.Errorf("flushes %v, err %v; want the patch flushed by the sleep, then the result", flushes, err)
		}
	})
	t.Run("a bad argument names the script's line", func(t *testing.T) {
		_, err := runDaemonBody(t, `luaop.sleep({})`)
		var se *luaerr.ScriptError
		if !errors.As(err, &se) || se.File != "d.lua" || se.Line != 3 || !strings.Contains(se.Message, "number expected, got table") {
			t.Errorf("err = %v; want d.lua:3 and number expected, got table", err)
		}
	})
}

// runDaemonBody runs a daemon whose body is body (from line 3 of d.lua) to its end.
func runDaemonBody(t *testing.T, body string) ([]map[string]any, error) {
	t.Helper()
	rt := loadedRuntime(t, Options{Shards: 1}, "d.lua", `local luaop = require("luaop")
luaop.daemon("example.com/v1/widgets", function(ctx)
`+body+`
end, {id = "d"})
`)
	var flushes []map[string]any
	b := widgetBody("ua", "a")
	err := rt.RunDaemon(t.Context(), &causes.Call{Handler: specOf(t, rt, "d"), Cause: causes.Cause{Body: b}, Logger: slog.Default(),
		Daemon: &causes.DaemonLink{Stopped: context.Background(), Latest: func() map[string]any { return b },
			Flush: func(p map[string]any) { flushes = append(flushes, p) }}})
	return flushes, err
}

// A daemon that was blocked (inside pcall) when Close ran catches the closed error
// and goes on to sleep at its top level: it ends at once too, after its patch is
// handed over.
func TestDaemonSleepingAfterCloseEndsAtOnce(t *testing.T) {
	rt := loadedRuntime(t, Options{Shards: 1}, "d.lua", `local luaop = require("luaop")
luaop.daemon("example.com/v1/widgets", function(ctx)
  ctx.patch.status.phase = "blocked"
  pcall(luaop.sleep, 0.2)
  ctx.patch.status.phase = "after"
  luaop.sleep(3600)
end, {id = "d"})
`)
	flushed := make(chan map[string]any, 4)
	done := make(chan error, 1)
	body := widgetBody("ua", "a")
	go rt.StartDaemon(t.Context(), &causes.Call{Handler: specOf(t, rt, "d"), Cause: causes.Cause{Body: body},
		Logger: slog.Default(), Daemon: &causes.DaemonLink{Stopped: context.Background(), Latest: func() map[string]any { return body },
			Flush: func(p map[string]any) { flushed <- p }}}, func(err error) { done <- err })
	<-flushed
	rt.Close()
	select {
	case err := <-done:
		if !errors.Is(err, errClosed) {
			t.Errorf("the daemon ended with %v; want %v", err, errClosed)
		}
	case <-time.After(promptWait):
		t.Fatal("the daemon sleeps on after Close")
	}
	select {
	case p := <-flushed:
		if got := fmt.Sprint(p); got != fmt.Sprint(map[string]any{"status": map[string]any{"phase": "after"}}) {
			t.Errorf("flushed %s; want phase after", got)
		}
	default:
		t.Error("the patch written after Close was not handed over before the daemon ended")
	}
}

// Errors raised inside luaop.sleep or right after it (its deadline, a bad argument
// however it is called) name the script's line, not luaop's wrapper around it.
func TestErrorsAroundSleepNameTheScriptLine(t *testing.T) {
	t.Run("a handler sleeping past its deadline", func(t *testing.T) {
		rt := loadedRuntime(t, Options{Shards: 1, HandlerTimeout: 50 * time.Millisecond}, "h.lua", `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function(ctx)
  luaop.sleep(60)
end, {id = "c"})
`)
		_, err := rt.Invoke(t.Context(), causes.Call{Handler: specOf(t, rt, "c"), Cause: causes.Cause{Body: widgetBody("ua", "a")}})
		var se *luaerr.ScriptError
		if !errors.As(err, &se) || se.File != "h.lua" || se.Line != 3 || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err = %v (%+v); want the deadline at h.lua:3", err, se)
		}
	})
	// (A tail call, return luaop.sleep({}), has no caller's line to name: Lua drops
	// the calling frame.)
	for _, body := range []string{`local function nap(s) local r = luaop.sleep(s); return r end; nap({})`, `local ok, err = pcall(luaop.sleep, {}); error(err, 0)`} {
		t.Run(body, func(t *testing.T) {
			_, err := runDaemonBody(t, body)
			var se *luaerr.ScriptError
			if !errors.As(err, &se) || se.File != "d.lua" || se.Line != 3 || !strings.Contains(se.Message, "number expected, got table") {
				t.Errorf("err = %v; want d.lua:3 and number expected, got table", err)
			}
		})
	}
	t.Run("a hexadecimal string, as tonumber reads it", func(t *testing.T) {
		if _, err := runDaemonBody(t, `luaop.sleep("0x0")`); err != nil {
			t.Error(err)
		}
	})
}
