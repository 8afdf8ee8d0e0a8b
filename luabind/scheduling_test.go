package luabind

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/luaop/luaop/processing/causes"
)

// Tests of the shards' turns with real scripts (schedule.go): a runaway call does
// not hold up the other calls of its state, a call's deadline counts its own time,
// and what is never preempted. The order of events is forced (a Get that waits
// until the test opens its gate, messages the scripts log); time only bounds how
// long a failure waits.

// gatedKube is a cluster whose Get of a name that has a gate waits until the test
// opens it (or the call's context ends); other names answer at once.
type gatedKube struct {
	Kube
	mu      sync.Mutex
	gates   map[string]chan struct{}
	entered chan string // the name of every Get that waits at its gate
}

func newGatedKube(names ...string) *gatedKube {
	k := &gatedKube{gates: map[string]chan struct{}{}, entered: make(chan string, 16)}
	for _, n := range names {
		k.gates[n] = make(chan struct{})
	}
	return k
}

func (k *gatedKube) Get(ctx context.Context, _, _, _, name string) (map[string]any, error) {
	k.mu.Lock()
	gate := k.gates[name]
	k.mu.Unlock()
	if gate != nil {
		k.entered <- name
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": name}}, nil
}

func (k *gatedKube) Event(context.Context, map[string]any, string, string, string) error { return nil }

func (k *gatedKube) open(name string) { close(k.gates[name]) }

// waitAt waits until a Get of name waits at its gate.
func (k *gatedKube) waitAt(t *testing.T, name string) {
	t.Helper()
	select {
	case got := <-k.entered:
		if got != name {
			t.Fatalf("a Get of %q waits at its gate; want %q", got, name)
		}
	case <-time.After(promptWait):
		t.Fatalf("no Get of %q within %s", name, promptWait)
	}
}

// waitInLine waits until n calls wait for the only shard's state.
func waitInLine(t *testing.T, rt *Runtime, n int) {
	t.Helper()
	sh := rt.shardFor("any")
	for deadline := time.Now().Add(promptWait); sh.sched.waiting() != n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls wait for the state; want %d", sh.sched.waiting(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

const runawayScript = `local luaop = require("luaop")
local R = "example.com/v1/widgets"
luaop.on.update(R, function(ctx)
  ctx.logger.info("spinning")
  while true do end
end, {id = "spin"})
luaop.on.update(R, function(ctx)
  local obj = luaop.kube.get("v1", "ConfigMap", "ns", ctx.name)
  return "got " .. obj.metadata.name
end, {id = "get"})
luaop.on.update(R, function(ctx) return "fast " .. ctx.name end, {id = "fast"})
luaop.on.probe(function(ctx) return "alive" end, {id = "alive"})
`

// An endless loop on the only Lua state does not hold up the other calls: a call
// coming back from the API server, a new call of another object, a probe, each
// finishes while the loop still runs (before its deadline of 20 s), and none of
// them fails. Before preemption the first one failed with the loop's deadline
// (issue 51) and the second waited for it.
func TestRunawayCallDoesNotHoldUpItsState(t *testing.T) {
	kube := newGatedKube("a")
	rt := loadedRuntime(t, Options{Shards: 1, HandlerTimeout: 20 * time.Second, Kube: kube}, "s.lua", runawayScript)
	parked := invokeAsync(t.Context(), rt, specOf(t, rt, "get"), widgetBody("ua", "a"), nil)
	kube.waitAt(t, "a")

	logger, logs := channelLogger()
	spinCtx, stopSpin := context.WithCancel(t.Context())
	spin := invokeAsync(spinCtx, rt, specOf(t, rt, "spin"), widgetBody("us", "s"), logger)
	expectLog(t, logs, "spinning")

	kube.open("a") // a's answer comes back while the loop holds the state
	if r := resultOf(t, "the call coming back from the API server", parked); r.res.Value != "got a" {
		t.Errorf("the call coming back from the API server returned %v", r.res.Value)
	}
	if r := resultOf(t, "a new call of another object", invokeAsync(t.Context(), rt, specOf(t, rt, "fast"), widgetBody("ub", "b"), nil)); r.res.Value != "fast b" {
		t.Errorf("a new call of another object returned %v", r.res.Value)
	}
	if r := resultOf(t, "a probe", invokeAsync(t.Context(), rt, specOf(t, rt, "alive"), nil, nil)); r.res.Value != "alive" {
		t.Errorf("probe returned %v", r.res.Value)
	}
	select {
	case r := <-spin:
		t.Fatalf("the endless loop ended before its deadline: %v, %v", r.res.Value, r.err)
	default:
	}
	if got := collectBudgetMetrics(t, rt)["luaop_lua_preemptions_total"]; got < 1 {
		t.Errorf("luaop_lua_preemptions_total = %v, want the loop's preemptions", got)
	}
	stopSpin()
	if r := <-spin; r.err == nil {
		t.Errorf("the loop stopped by its caller's context returned %v", r.res.Value)
	}
}

// A CPU-bound call and the other calls of its state take turns: the long call
// spins until twenty calls of other objects, each coming back from the API server,
// have run. Without turns it could only have spun until its deadline.
func TestCPUBoundCallTakesTurnsWithItsState(t *testing.T) {
	const others = 20
	rt := loadedRuntime(t, Options{Shards: 1, HandlerTimeout: 20 * time.Second, Kube: newGatedKube()}, "s.lua", fmt.Sprintf(`local luaop = require("luaop")
local R = "example.com/v1/widgets"
local done = 0
luaop.on.update(R, function(ctx)
  ctx.logger.info("computing")
  local n = 0
  while done < %d do n = n + 1 end
  return "computed while the others ran"
end, {id = "compute"})
luaop.on.update(R, function(ctx)
  luaop.kube.get("v1", "ConfigMap", "ns", ctx.name)
  done = done + 1
  return "done " .. ctx.name
end, {id = "get"})
`, others))
	logger, logs := channelLogger()
	compute := invokeAsync(t.Context(), rt, specOf(t, rt, "compute"), widgetBody("uc", "c"), logger)
	expectLog(t, logs, "computing")
	calls := make([]chan callResult, others)
	for i := range calls {
		calls[i] = invokeAsync(t.Context(), rt, specOf(t, rt, "get"), widgetBody(fmt.Sprintf("u%d", i), fmt.Sprintf("o%d", i)), nil)
	}
	for i, c := range calls {
		if r := resultOf(t, fmt.Sprintf("call %d", i), c); r.res.Value != fmt.Sprintf("done o%d", i) {
			t.Errorf("call %d returned %v", i, r.res.Value)
		}
	}
	if r := resultOf(t, "the CPU-bound call", compute); r.res.Value != "computed while the others ran" {
		t.Errorf("the CPU-bound call returned %v", r.res.Value)
	}
}

// A call's deadline counts its own time: its Lua and its blocking functions, not
// its waits for the state. On a fake clock (the runtime's turns and deadlines),
// a call coming back from the API server while a load holds the state (a load is
// never preempted) waits an hour of the clock and still succeeds; a call whose
// own API call takes its whole budget fails with its deadline.
func TestDeadlineCountsTheCallsOwnTime(t *testing.T) {
	const budget = time.Minute
	newRT := func(t *testing.T, kube Kube) (*Runtime, *clocktesting.FakeClock) {
		clk := clocktesting.NewFakeClock(time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC))
		rt := newRuntime(Options{Shards: 1, HandlerTimeout: budget, Kube: kube, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, clk)
		t.Cleanup(rt.Close)
		mustLoad(t, rt, "s.lua", runawayScript)
		return rt, clk
	}
	t.Run("waiting for the state is not counted", func(t *testing.T) {
		kube := newGatedKube("a", "load")
		rt, clk := newRT(t, kube)
		parked := invokeAsync(t.Context(), rt, specOf(t, rt, "get"), widgetBody("ua", "a"), nil)
		kube.waitAt(t, "a")
		loaded := make(chan error, 1)
		go func() {
			_, err := rt.Load(t.Context(), scriptsOf("s.lua", runawayScript+`luaop.kube.get("v1", "ConfigMap", "ns", "load")`))
			loaded <- err
		}()
		kube.waitAt(t, "load") // the load holds the states: the objects' and the hooks'
		kube.waitAt(t, "load")
		kube.open("a")
		waitInLine(t, rt, 1) // a's deadline is paused
		clk.Step(time.Hour)
		kube.open("load")
		if err := <-loaded; err != nil {
			t.Fatalf("the load: %v", err)
		}
		if r := resultOf(t, "the call that waited for the load", parked); r.res.Value != "got a" {
			t.Errorf("the call that waited for the load returned %v", r.res.Value)
		}
	})
	t.Run("its own blocking function is counted", func(t *testing.T) {
		kube := newGatedKube("a")
		rt, clk := newRT(t, kube)
		parked := invokeAsync(t.Context(), rt, specOf(t, rt, "get"), widgetBody("ua", "a"), nil)
		kube.waitAt(t, "a")
		clk.Step(budget)
		select {
		case r := <-parked:
			if !errors.Is(r.err, context.DeadlineExceeded) || !strings.Contains(fmt.Sprint(r.err), "exceeded its 1m0s deadline") {
				t.Errorf("the call whose API call took its budget: %v, want its deadline", r.err)
			}
		case <-time.After(promptWait):
			t.Fatal("the call whose API call took its budget did not end")
		}
	})
}

// What is never preempted: a module's top level first required inside a call (a
// second require of the module must not find it half-way), and script loads (a
// load sees no other call). A call waiting behind either gives up with its own
// context's error, which names the busy state, not a deadline of its own. On a
// fake clock, so that the runaway holds the state for as long as the test wants.
func TestWhatIsNeverPreempted(t *testing.T) {
	for _, tt := range []struct {
		name      string
		handler   string // the runaway's handler body
		preempted bool
	}{
		{"an endless loop in a handler is preempted", `ctx.logger.info("running"); while true do end`, true},
		{"an endless loop in a module's top level is not", `ctx.logger.info("running"); return require("lib.spin")`, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC))
			rt := newRuntime(Options{Shards: 1, HandlerTimeout: time.Minute, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, clk)
			t.Cleanup(rt.Close)
			mustLoad(t, rt, "s.lua", `local luaop = require("luaop")
local R = "example.com/v1/widgets"
luaop.on.update(R, function(ctx) `+tt.handler+` end, {id = "runaway"})
luaop.on.update(R, function(ctx) return "fast " .. ctx.name end, {id = "fast"})
`, "lib/spin.lua", `print("in the module"); while true do end`)
			logger, logs := channelLogger()
			runCtx, stop := context.WithCancel(t.Context())
			runaway := invokeAsync(runCtx, rt, specOf(t, rt, "runaway"), widgetBody("ur", "r"), logger)
			expectLog(t, logs, "running")
			if !tt.preempted {
				expectLog(t, logs, "in the module")
			}
			clk.Step(firstSlice) // the runaway held the state for its slice
			// Behind a module's top level the call can only give up: its context is
			// short. Next to a preempted runaway it must get its turn, however
			// loaded the machine: its context does not end first.
			ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
			if tt.preempted {
				ctx, cancel = context.WithCancel(t.Context())
			}
			defer cancel()
			res, err := rt.Invoke(ctx, causes.Call{Handler: specOf(t, rt, "fast"), Cause: causes.Cause{Reason: causes.Update, Body: widgetBody("ub", "b")}})
			switch {
			case tt.preempted && (err != nil || res.Value != "fast b"):
				t.Errorf("a call next to a preempted runaway: %v, %v", res.Value, err)
			case !tt.preempted && (!errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "stayed busy with other calls")):
				t.Errorf("a call behind a module's top level: %v, %v; want its context's end, the state busy", res.Value, err)
			}
			stop()
			if r := <-runaway; r.err == nil || !strings.Contains(r.err.Error(), "cancelled") {
				t.Errorf("the runaway stopped by its caller: %v, %v", r.res.Value, r.err)
			}
		})
	}
}

// holdingHandler is a logger that holds its caller (and so the caller's Lua
// state: loggers are written to under the shard lock) until the test releases it.
type holdingHandler struct {
	entered chan string
	release chan struct{}
}

func (h holdingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h holdingHandler) Handle(_ context.Context, r slog.Record) error {
	h.entered <- r.Message
	<-h.release
	return nil
}
func (h holdingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h holdingHandler) WithGroup(string) slog.Handler      { return h }

// A turn of a few instructions is never cut in two, however long it took on the
// clock (a loaded machine deschedules goroutines): a call holding the state past
// its slice while another waits, asked to give it back, runs the rest of its short
// stretch first. Without the floor of instructions (minTurnInstructions) the
// waiting call ran between two of its instructions and the first call read the
// other's write.
func TestShortTurnIsNeverCutInTwo(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC))
	rt := newRuntime(Options{Shards: 1, HandlerTimeout: time.Minute, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, clk)
	t.Cleanup(rt.Close)
	mustLoad(t, rt, "s.lua", `local luaop = require("luaop")
local R = "example.com/v1/widgets"
local shared
luaop.on.update(R, function(ctx)
  shared = "a"
  ctx.logger.info("holding")
  local x = 0
  for i = 1, 100 do x = x + i end
  return shared
end, {id = "short"})
luaop.on.update(R, function(ctx) shared = "b"; return "b ran" end, {id = "other"})
`)
	hold := holdingHandler{entered: make(chan string, 1), release: make(chan struct{})}
	short := invokeAsync(t.Context(), rt, specOf(t, rt, "short"), widgetBody("ua", "a"), slog.New(hold))
	select {
	case msg := <-hold.entered:
		if msg != "holding" {
			t.Fatalf("the short call logged %q", msg)
		}
	case <-time.After(promptWait):
		t.Fatal("the short call did not log")
	}
	other := invokeAsync(t.Context(), rt, specOf(t, rt, "other"), widgetBody("ub", "b"), nil)
	waitInLine(t, rt, 1)
	clk.Step(firstSlice) // the short call held the state for its slice: it is asked
	close(hold.release)
	if r := resultOf(t, "the short call", short); r.err != nil || r.res.Value != "a" {
		t.Errorf("the short call returned %v, %v; want \"a\": nothing ran in the middle of its turn", r.res.Value, r.err)
	}
	if r := resultOf(t, "the other call", other); r.err != nil || r.res.Value != "b ran" {
		t.Errorf("the other call returned %v, %v", r.res.Value, r.err)
	}
	if n := rt.preemptions.Load(); n != 0 {
		t.Errorf("%d preemptions, want none", n)
	}
}
