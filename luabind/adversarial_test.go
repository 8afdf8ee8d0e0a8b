package luabind

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/luaop/luaop/luabind/adversary"
	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// Issue 34: every adversarial script fails its own call, at its deadline or at a
// limit, with file:line and a clear reason; the handler is stopped by the runtime's
// own checks (no state held past the deadline had to be replaced: the metric stays
// 0); objects of other shards are served while it runs, and its own shard and object
// right after. Peak memory is asserted on a real process (cmd/luaop
// TestAdversarialProcesses); how long the cases take, BenchmarkAdversarialScripts.
//
// Each case runs on a runtime of its own (adversarialRuntime), so that what one
// case leaves behind (a state replaced late, a stuck call) fails that case only,
// and under a deadline that does not depend on the machine's speed: a case a
// limit ends has a minute (a loaded machine or the race detector never lets the
// deadline come first), a case the deadline ends has a short one.
func TestAdversarialScripts(t *testing.T) {
	src, lines := adversary.Script(adversary.Cases)
	for _, c := range adversary.Cases {
		t.Run(c.ID, func(t *testing.T) {
			rt := adversarialRuntime(t, c, src)
			victim, bystander := uidsOnDifferentShards(t, rt)
			var wg sync.WaitGroup
			served := make(chan error, 1)
			stop := make(chan struct{})
			wg.Add(1)
			go func() { // another object, on another shard, while the attack runs
				defer wg.Done()
				for {
					_, _, err := invokeHandler(t, rt, "fine", createCause(bystander))
					select {
					case <-stop:
						served <- err
						return
					default:
					}
					if err != nil {
						served <- err
						return
					}
					time.Sleep(10 * time.Millisecond)
				}
			}()
			_, _, err := invokeHandler(t, rt, c.ID, createCause(victim))
			close(stop)
			wg.Wait()
			if err := <-served; err != nil {
				t.Errorf("another object was not served meanwhile: %v", err)
			}
			checkAdversarialError(t, c, lines, err)
			var se *ScriptError
			if errors.As(err, &se) && len(se.Traceback) > 8<<10 {
				t.Errorf("traceback of %d bytes", len(se.Traceback))
			}
			// The call ended by itself: none held its state past the deadline so
			// long that the runtime reported it and replaced the state.
			if got := collectBudgetMetrics(t, rt); got["luaop_lua_states_replaced_total"] != 0 || len(rt.Stuck()) != 0 {
				t.Errorf("the attack held its state past the deadline: metrics %v, stuck %v", got, rt.Stuck())
			}
			if res := mustInvoke(t, rt, "fine", createCause(victim)); res.Value != "fine" {
				t.Errorf("the object after the attack: %#v", res.Value)
			}
		})
	}
}

// Handler deadlines of the adversarial cases (adversarialRuntime).
const (
	// adversaryDeadline ends the cases that run until their deadline (Deadline).
	adversaryDeadline = 2 * time.Second
	// adversaryLimitDeadline is the deadline of the cases a limit ends: far past
	// the time any of them takes to reach its limit, even with the race detector
	// on a loaded machine, so that the limit ends them, not the deadline (their
	// error then names the limit, which the test asserts).
	adversaryLimitDeadline = time.Minute
)

// adversarialRuntime is a runtime of 2 shards of its own, loaded with the
// adversarial script src, whose handler deadline is c's (adversaryDeadline or
// adversaryLimitDeadline).
func adversarialRuntime(tb testing.TB, c adversary.Case, src string) *Runtime {
	tb.Helper()
	deadline := adversaryLimitDeadline
	if c.Deadline {
		deadline = adversaryDeadline
	}
	return loadedRuntime(tb, Options{Shards: 2, HandlerTimeout: deadline}, adversary.File, src)
}

// checkAdversarialError asserts that err is c's failure: c.Want at the case's
// line (lines, from adversary.Script), permanent when it is the result's.
func checkAdversarialError(tb testing.TB, c adversary.Case, lines map[string]int, err error) {
	tb.Helper()
	if err == nil {
		tb.Fatal("the attack returned without an error")
	}
	line := lines[c.ID]
	if c.Result {
		line--
	}
	where := fmt.Sprintf("%s:%d:", adversary.File, line)
	msg := err.Error()
	if !strings.Contains(msg, where) || !c.Stopped(msg) {
		tb.Errorf("error = %.400q, want %s and %q", msg, where, c.Want)
	}
	var pe *causes.PermanentError
	if c.Result && !errors.As(err, &pe) {
		tb.Errorf("not a permanent error (it would be retried): %T %v", err, err)
	}
}

// uidsOnDifferentShards finds two uids served by different object shards.
func uidsOnDifferentShards(t *testing.T, rt *Runtime) (string, string) {
	t.Helper()
	first := rt.shardFor("victim")
	for i := range 100 {
		uid := fmt.Sprintf("bystander-%d", i)
		if rt.shardFor(uid) != first {
			return "victim", uid
		}
	}
	t.Fatal("no uid on another shard")
	return "", ""
}

// Loading: a file saved into the watched folder that nests too deep, or that is a
// large data table, fails (or succeeds) at once, naming file:line; the previous
// scripts keep serving. luaop check and the scripts guard compile the same way
// (scriptcheck's TestAdversarialLoadsCheck).
func TestAdversarialLoads(t *testing.T) {
	timeout := 5 * time.Second
	if raceDetector { // compiling the 589 KB data table is many times slower with it
		timeout = time.Minute
	}
	rt := loadedRuntime(t, Options{Shards: 2, HandlerTimeout: timeout}, "a.lua", `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function() return "a" end, {id = "a"})`)
	slow := loadedRuntime(t, Options{Shards: 2, HandlerTimeout: adversary.LongCompileDeadline}, "a.lua", `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function() return "a" end, {id = "a"})`)
	for _, c := range adversary.LoadCases {
		t.Run(c.Name, func(t *testing.T) {
			scripts := scriptsOf("a.lua", `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function() return "a" end, {id = "a"})`, "b.lua", c.Source())
			rt := rt
			if c.LongCompile {
				rt = slow
			}
			_, err := rt.Load(t.Context(), scripts)
			if c.Want == "" {
				if err != nil {
					t.Fatalf("refused: load %v", err)
				}
				return
			}
			where := fmt.Sprintf("b.lua:%d: ", c.Line)
			if err == nil || !strings.HasPrefix(err.Error(), where) || !strings.Contains(err.Error(), c.Want) {
				t.Errorf("load: %v, want %s...%s", err, where, c.Want)
			}
			if res := mustInvoke(t, rt, "a", createCause("u1")); res.Value != "a" {
				t.Errorf("the previous scripts stopped serving: %#v", res.Value)
			}
		})
	}
}

// Compiling is under the load's deadline: a file too large to compile in time fails
// the load with a clear error (the previous scripts keep serving), luaop check says
// so too (scriptcheck's TestCheckCompilesUnderTheLoadDeadline).
func TestCompileUnderTheLoadDeadline(t *testing.T) {
	var big strings.Builder
	for i := range 400_000 {
		fmt.Fprintf(&big, "local function f%d(ctx) return ctx.spec.size + %d end\n", i%150, i)
	}
	const deadline = 300 * time.Millisecond
	rt := loadedRuntime(t, Options{Shards: 1, HandlerTimeout: deadline}, "a.lua", `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function() return "a" end, {id = "a"})`)
	_, err := rt.Load(t.Context(), scriptsOf("big.lua", big.String()))
	if err == nil || !strings.Contains(err.Error(), "compiling big.lua exceeded the 300ms load deadline") {
		t.Fatalf("load = %v", err)
	}
	// The compiler stopped at the deadline by itself: the load's state was not
	// held past it (nothing reported, nothing replaced).
	if got := collectBudgetMetrics(t, rt); got["luaop_lua_states_replaced_total"] != 0 || len(rt.Stuck()) != 0 {
		t.Errorf("the load held its state past the deadline: metrics %v, stuck %v", got, rt.Stuck())
	}
	if res := mustInvoke(t, rt, "a", createCause("u1")); res.Value != "a" {
		t.Errorf("the previous scripts stopped serving: %#v", res.Value)
	}
}

// Thousands of subhandlers register, each under its own id (issue 34, item 10);
// that they do in linear time is BenchmarkRegisterSubhandlers5000 against
// BenchmarkRegisterSubhandlers20000.
func TestManySubhandlers(t *testing.T) {
	rt := loadedRuntime(t, Options{Shards: 1}, "sub.lua", `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function(ctx)
  for i = 1, 20000 do ctx.subhandler(function() end, {id = "s" .. i}) end
end, {id = "parent"})`)
	res := mustInvoke(t, rt, "parent", createCause("u1"))
	if len(res.Subhandlers) != 20000 || res.Subhandlers[19999].ID != "parent/s20000" {
		t.Fatalf("%d subhandlers", len(res.Subhandlers))
	}
}

func BenchmarkRegisterSubhandlers5000(b *testing.B)  { benchmarkRegisterSubhandlers(b, 5000) }
func BenchmarkRegisterSubhandlers20000(b *testing.B) { benchmarkRegisterSubhandlers(b, 20000) }

func benchmarkRegisterSubhandlers(b *testing.B, n int) {
	rt := loadedRuntime(b, Options{Shards: 1}, "sub.lua", fmt.Sprintf(`local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function(ctx)
  for i = 1, %d do ctx.subhandler(function() end, {id = "s" .. i}) end
end, {id = "parent"})`, n))
	call := causes.Call{Handler: specOf(b, rt, "parent"), Cause: createCause("u1")}
	for b.Loop() {
		if _, err := rt.Invoke(b.Context(), call); err != nil {
			b.Fatal(err)
		}
	}
	runtime.GC()
}

// A call that holds its state past its deadline (a Go function ignoring its context:
// every built-in is bounded, so a test stands one in) is reported (Stuck, the
// metrics) and its state replaced: another object of the same shard is served while
// it still runs (the stuck call has not returned yet); once it ends, nothing is
// reported any more.
func TestStuckStateIsReportedAndReplaced(t *testing.T) {
	release, started := make(chan struct{}), make(chan struct{}, 1)
	// A logger that blocks on "hang": a Go function ignoring the call's context,
	// as no built-in may.
	logger := slog.New(blockingHandler{msg: "hang", started: started, release: release})
	rt := newTestRuntime(t, Options{Shards: 1, HandlerTimeout: 300 * time.Millisecond, Logger: logger})
	mustLoad(t, rt, "h.lua", `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function(ctx) ctx.logger.info("hang") return "late" end, {id = "hang"})
luaop.on.create("example.com/v1/widgets", function(ctx) return "fine" end, {id = "fine"})`)
	hung := make(chan error, 1)
	go func() {
		_, _, err := invokeHandler(t, rt, "hang", createCause("u1"))
		hung <- err
	}()
	<-started
	// The same shard (there is one) serves another object meanwhile, on the state
	// that replaced the stuck one.
	res, _, err := invokeHandler(t, rt, "fine", createCause("u2"))
	if err != nil || res.Value != "fine" {
		t.Fatalf("another object: %#v, %v", res.Value, err)
	}
	select {
	case err := <-hung:
		t.Fatalf("the stuck call returned (%v) before its logger was released", err)
	default:
	}
	stuck := rt.Stuck()
	if len(stuck) != 1 || stuck[0].What != "hang" || !strings.Contains(stuck[0].String(), "Lua state 0 is held by hang") {
		t.Fatalf("stuck = %v", stuck)
	}
	if got := collectBudgetMetrics(t, rt); got["luaop_lua_states_stuck"] != 1 || got["luaop_lua_states_replaced_total"] != 1 {
		t.Errorf("metrics %v", got)
	}
	close(release)
	<-hung
	// The call gave its state back before it returned: nothing is stuck any more.
	if stuck := rt.Stuck(); len(stuck) != 0 {
		t.Fatalf("still stuck after the call ended: %v", stuck)
	}
	if got := collectBudgetMetrics(t, rt); got["luaop_lua_states_stuck"] != 0 {
		t.Errorf("metrics %v", got)
	}
	if res := mustInvoke(t, rt, "fine", createCause("u1")); res.Value != "fine" {
		t.Errorf("after: %#v", res.Value)
	}
}

// blockingHandler is a slog handler that blocks on the message msg until release.
type blockingHandler struct {
	msg              string
	started, release chan struct{}
}

func (h blockingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h blockingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.started <- struct{}{}
		<-h.release
	}
	return nil
}
func (h blockingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h blockingHandler) WithGroup(string) slog.Handler      { return h }

func collectBudgetMetrics(t *testing.T, rt *Runtime) map[string]float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	if err := reg.Register(rt.BudgetMetrics()); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch {
			case m.GetGauge() != nil:
				out[mf.GetName()] = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				out[mf.GetName()] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// How long each adversarial script's call takes to fail: at its deadline for those
// the deadline stops, far sooner for those a limit stops (TestAdversarialScripts
// checks what the user sees). Each call gets a fresh ctx.patch, as the processing
// core gives it, so that what a case writes there is converted (and refused) within
// the call, as in TestAdversarialScripts; every iteration's error is checked to be
// the case's, so that a limit case measures its limit, not its deadline.
func BenchmarkAdversarialScripts(b *testing.B) {
	src, lines := adversary.Script(adversary.Cases)
	for _, c := range adversary.Cases {
		b.Run(c.ID, func(b *testing.B) {
			rt := adversarialRuntime(b, c, src)
			handler := specOf(b, rt, c.ID)
			for b.Loop() {
				_, err := rt.Invoke(b.Context(), causes.Call{Handler: handler, Cause: createCause("victim"), Patch: state.NewPatch()})
				checkAdversarialError(b, c, lines, err)
			}
		})
	}
}

// How long each adversarial file takes to be loaded or refused
// (TestAdversarialLoads checks the answers).
func BenchmarkAdversarialLoads(b *testing.B) {
	rt := loadedRuntime(b, Options{Shards: 1, HandlerTimeout: time.Minute}, "a.lua", `return nil`)
	for _, c := range adversary.LoadCases {
		b.Run(c.Name, func(b *testing.B) {
			scripts := scriptsOf("b.lua", c.Source())
			for b.Loop() {
				_, _ = rt.Load(b.Context(), scripts)
			}
		})
	}
}

// A file too large to compile fails its load at the deadline (300ms here), not once
// compiled (TestCompileUnderTheLoadDeadline checks the error).
func BenchmarkCompileUnderTheLoadDeadline(b *testing.B) {
	var big strings.Builder
	for i := range 400_000 {
		fmt.Fprintf(&big, "local function f%d(ctx) return ctx.spec.size + %d end\n", i%150, i)
	}
	rt := loadedRuntime(b, Options{Shards: 1, HandlerTimeout: 300 * time.Millisecond}, "a.lua", `return nil`)
	scripts := scriptsOf("big.lua", big.String())
	for b.Loop() {
		if _, err := rt.Load(b.Context(), scripts); err == nil {
			b.Fatal("the load succeeded")
		}
	}
}
