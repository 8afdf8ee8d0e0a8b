package luabind

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// Tests of calls sharing one Lua state: a call waiting in a blocking function (sleep,
// a Kubernetes API call) lets the other calls of its shard run, each call keeps its
// own ctx, and no caller hangs on a busy state.

// promptWait is how long a test waits for something that should happen at once; only
// failures wait that long.
const promptWait = 5 * time.Second

// channelLogger is a logger whose messages arrive on a channel: a handler announces with
// ctx.logger.info where it is.
func channelLogger() (*slog.Logger, chan string) {
	ch := make(chan string, 64)
	return slog.New(channelHandler{ch}), ch
}

type channelHandler struct{ ch chan string }

func (h channelHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h channelHandler) Handle(_ context.Context, r slog.Record) error {
	h.ch <- r.Message
	return nil
}
func (h channelHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h channelHandler) WithGroup(string) slog.Handler      { return h }

// expectLog waits for a message on ch.
func expectLog(t *testing.T, ch chan string, want string) {
	t.Helper()
	select {
	case got := <-ch:
		if got != want {
			t.Fatalf("log message %q, want %q", got, want)
		}
	case <-time.After(promptWait):
		t.Fatalf("no log message %q within %s", want, promptWait)
	}
}

// blockingKube is a cluster whose Get of the object named "block" waits until
// release is closed; other names answer at once with a ConfigMap of that name.
type blockingKube struct {
	Kube
	entered chan string // receives the name of every Get once it waits
	release chan struct{}
}

func newBlockingKube() *blockingKube {
	return &blockingKube{entered: make(chan string, 16), release: make(chan struct{})}
}

func (k *blockingKube) Get(ctx context.Context, _, _, _, name string) (map[string]any, error) {
	if name == "block" {
		k.entered <- name
		select {
		case <-k.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": name}}, nil
}

// waitEntered waits until a Get of "block" waits (what: who was to call it).
func (k *blockingKube) waitEntered(t *testing.T, what string) {
	t.Helper()
	select {
	case <-k.entered:
	case <-time.After(promptWait):
		t.Fatalf("%s was not called within %s", what, promptWait)
	}
}

func widgetBody(uid, name string) map[string]any {
	return map[string]any{"apiVersion": "example.com/v1", "kind": "Widget",
		"metadata": map[string]any{"name": name, "namespace": "ns", "uid": uid}}
}

type callResult struct {
	res   causes.Result
	patch *state.Patch
	err   error
}

// invokeAsync runs handler spec on body in a goroutine, under ctx.
func invokeAsync(ctx context.Context, rt *Runtime, spec causes.Spec, body map[string]any, logger *slog.Logger) chan callResult {
	done := make(chan callResult, 1)
	go func() {
		patch := state.NewPatch()
		res, err := rt.Invoke(ctx, causes.Call{Handler: spec, Cause: causes.Cause{Reason: causes.Update, Body: body}, Patch: patch, Logger: logger})
		done <- callResult{res, patch, err}
	}()
	return done
}

func resultOf(t *testing.T, what string, ch chan callResult) callResult {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		return r
	case <-time.After(promptWait):
		t.Fatalf("%s did not finish within %s: it waits behind another call of its Lua state", what, promptWait)
	}
	return callResult{}
}

// A handler sleeping on a shard does not hold it: a fast handler of another object on
// the same (single) shard runs and finishes while the slow one still sleeps. Decided
// by order, not by time: the slow handler sleeps until the fast one has run (a
// global of the shard's state), and the fast one reports that it ran while the slow
// one was sleeping. Were the shard held during the sleep, the fast call would never
// run and the slow one never end.
func TestSleepingHandlerDoesNotBlockItsShard(t *testing.T) {
	rt := loadedRuntime(t, Options{Shards: 1}, "s.lua", `local luaop = require("luaop")
local R = "example.com/v1/widgets"
luaop.on.update(R, function(ctx)
  SLOW = "sleeping"
  ctx.logger.info("sleeping")
  while not FAST_DONE do
    luaop.sleep(0.005)
  end
  SLOW = "done"
  return "slow done"
end, {id = "slow"})
luaop.on.update(R, function(ctx)
  FAST_DONE = true
  return "fast " .. ctx.name .. " while slow " .. tostring(SLOW)
end, {id = "fast"})
`)
	logger, logs := channelLogger()
	slow := invokeAsync(t.Context(), rt, specOf(t, rt, "slow"), widgetBody("ua", "a"), logger)
	expectLog(t, logs, "sleeping")
	fast := resultOf(t, "the fast handler of b", invokeAsync(t.Context(), rt, specOf(t, rt, "fast"), widgetBody("ub", "b"), nil))
	if want := "fast b while slow sleeping"; fast.res.Value != want {
		t.Errorf("fast handler returned %v, want %q: it did not run while the slow one slept", fast.res.Value, want)
	}
	if r := resultOf(t, "the sleeping handler", slow); r.res.Value != "slow done" {
		t.Errorf("slow handler returned %v", r.res.Value)
	}
}

// A handler waiting on the API server (here a Get that blocks until released) does
// not hold its shard, also when called through pcall, and gets its result after.
func TestKubeCallReleasesShard(t *testing.T) {
	kube := newBlockingKube()
	rt := loadedRuntime(t, Options{Shards: 1, Kube: kube}, "k.lua", `local luaop = require("luaop")
local R = "example.com/v1/widgets"
luaop.on.update(R, function(ctx)
  local ok, obj = pcall(luaop.kube.get, "v1", "ConfigMap", "ns", "block")
  return {ok = ok, got = obj.metadata.name, name = ctx.name}
end, {id = "get"})
luaop.on.update(R, function(ctx)
  local obj = luaop.kube.get("v1", "ConfigMap", "ns", "other")
  return "fast " .. ctx.name .. " " .. obj.metadata.name
end, {id = "fast"})
`)
	slow := invokeAsync(t.Context(), rt, specOf(t, rt, "get"), widgetBody("ua", "a"), nil)
	kube.waitEntered(t, "the handler's luaop.kube.get")
	fast := resultOf(t, "the handler of b while a waits on the API", invokeAsync(t.Context(), rt, specOf(t, rt, "fast"), widgetBody("ub", "b"), nil))
	if fast.res.Value != "fast b other" {
		t.Errorf("fast handler returned %v", fast.res.Value)
	}
	close(kube.release)
	r := resultOf(t, "the handler waiting on the API", slow)
	want := map[string]any{"ok": true, "got": "block", "name": "a"}
	if !reflect.DeepEqual(r.res.Value, want) {
		t.Errorf("handler returned %v, want %v", r.res.Value, want)
	}
}

// Two calls interleaved on one state (a parks in an API call, b runs meanwhile) each
// see their own ctx afterwards: name, uid, memo, patch, logger.
func TestInterleavedCallsKeepTheirOwnCtx(t *testing.T) {
	kube := newBlockingKube()
	rt := loadedRuntime(t, Options{Shards: 1, Kube: kube}, "i.lua", `local luaop = require("luaop")
luaop.on.update("example.com/v1/widgets", function(ctx)
  local before = ctx.name
  ctx.patch.status.first = ctx.name
  luaop.kube.get("v1", "ConfigMap", "ns", ctx.annotations.wait or "none")
  -- first reads after the wait (not cached before it)
  ctx.memo.n = (ctx.memo.n or 0) + 1
  ctx.patch.status.second = ctx.name
  ctx.logger.info("done " .. ctx.uid)
  return {before = before, after = ctx.name, uid = ctx.uid, memo = ctx.memo.n}
end, {id = "h"})
`)
	spec := specOf(t, rt, "h")
	bodyA := widgetBody("ua", "a")
	bodyA["metadata"].(map[string]any)["annotations"] = map[string]any{"wait": "block"}
	logA, logsA := channelLogger()
	logB, logsB := channelLogger()
	a := invokeAsync(t.Context(), rt, spec, bodyA, logA)
	<-kube.entered
	b := resultOf(t, "b while a is parked", invokeAsync(t.Context(), rt, spec, widgetBody("ub", "b"), logB))
	close(kube.release)
	ra := resultOf(t, "a", a)
	for _, c := range []struct {
		who  string
		r    callResult
		logs chan string
	}{{"a", ra, logsA}, {"b", b, logsB}} {
		uid := "u" + c.who
		want := map[string]any{"before": c.who, "after": c.who, "uid": uid, "memo": int64(1)}
		if !reflect.DeepEqual(c.r.res.Value, want) {
			t.Errorf("call of %s returned %v, want %v", c.who, c.r.res.Value, want)
		}
		wantPatch := map[string]any{"status": map[string]any{"first": c.who, "second": c.who}}
		if got := c.r.patch.Map(); !reflect.DeepEqual(got, wantPatch) {
			t.Errorf("patch of %s = %v, want %v", c.who, got, wantPatch)
		}
		expectLog(t, c.logs, "done "+uid)
	}
}

// runDaemonAsync runs daemon spec on body under ctx until it returns; flushes go to the returned func.
func runDaemonAsync(ctx context.Context, rt *Runtime, spec causes.Spec, body map[string]any, stop context.Context) (chan error, func() []map[string]any) {
	var mu sync.Mutex
	var flushed []map[string]any
	done := make(chan error, 1)
	go func() {
		done <- rt.RunDaemon(ctx, &causes.Call{Handler: spec, Cause: causes.Cause{Body: body},
			Logger: slog.Default(), Daemon: &causes.DaemonLink{Stopped: stop, Latest: func() map[string]any { return body },
				Flush: func(p map[string]any) { mu.Lock(); flushed = append(flushed, p); mu.Unlock() }}})
	}()
	return done, func() []map[string]any {
		mu.Lock()
		defer mu.Unlock()
		return append([]map[string]any(nil), flushed...)
	}
}

// stopAndWaitDaemon closes stop and waits for the sleeping daemon to return, without
// an error, as a stopped daemon does.
func stopAndWaitDaemon(t *testing.T, stop context.CancelFunc, done <-chan error) {
	t.Helper()
	stop()
	waitDaemonEnded(t, done, "the sleeping daemon woken by its stop")
}

// waitDaemonEnded waits for a daemon's end (what it is waiting for: what) and
// fails unless it ended without an error.
func waitDaemonEnded(t *testing.T, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: the daemon failed: %v", what, err)
		}
	case <-time.After(promptWait):
		t.Fatalf("%s: the daemon did not end", what)
	}
}

// waitDaemonSleeps waits for the signal a daemon's Flush gives as it goes to sleep,
// and fails when the daemon ends first or never gets there.
func waitDaemonSleeps(t *testing.T, sleeping <-chan struct{}, done <-chan error) {
	t.Helper()
	select {
	case <-sleeping:
	case err := <-done:
		t.Fatalf("the daemon ended before it slept: %v", err)
	case <-time.After(promptWait):
		t.Fatal("the daemon did not reach its sleep")
	}
}

// A sleeping daemon (here through pcall, which a yield could not cross) releases its
// shard, has flushed its patch, and wakes with false when stopped.
func TestDaemonSleepReleasesShardAndFlushes(t *testing.T) {
	rt := loadedRuntime(t, Options{Shards: 1}, "d.lua", `local luaop = require("luaop")
local R = "example.com/v1/widgets"
luaop.daemon(R, function(ctx)
  ctx.patch.status.phase = "Watching"
  local ok, slept = pcall(luaop.sleep, 3600)
  ctx.patch.status.woke = {ok = ok, slept = slept, stopped = ctx.stopped()}
end, {id = "d"})
luaop.on.update(R, function(ctx) return "fast " .. ctx.name end, {id = "fast"})
`)
	stop, closeStop := context.WithCancel(context.Background())
	done, flushed := runDaemonAsync(t.Context(), rt, specOf(t, rt, "d"), widgetBody("ua", "a"), stop)
	deadline := time.Now().Add(promptWait)
	for len(flushed()) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := flushed(); len(got) != 1 || !reflect.DeepEqual(got[0], map[string]any{"status": map[string]any{"phase": "Watching"}}) {
		t.Fatalf("flushed %v before the sleep, want the phase once", got)
	}
	r := resultOf(t, "a handler of b while the daemon of a sleeps", invokeAsync(t.Context(), rt, specOf(t, rt, "fast"), widgetBody("ub", "b"), nil))
	if r.res.Value != "fast b" {
		t.Errorf("fast handler returned %v", r.res.Value)
	}
	stopAndWaitDaemon(t, closeStop, done)
	got := flushed()
	want := map[string]any{"status": map[string]any{"woke": map[string]any{"ok": true, "slept": false, "stopped": true}}}
	if len(got) != 2 || !reflect.DeepEqual(got[1], want) {
		t.Errorf("flushes %v; want the wake-up state last: %v", got, want)
	}
}

// A daemon waiting on the API server does not hold its shard either.
func TestDaemonKubeCallReleasesShard(t *testing.T) {
	kube := newBlockingKube()
	rt := loadedRuntime(t, Options{Shards: 1, Kube: kube}, "d.lua", `local luaop = require("luaop")
local R = "example.com/v1/widgets"
luaop.daemon(R, function(ctx)
  local obj = luaop.kube.get("v1", "ConfigMap", "ns", "block")
  ctx.patch.status.got = obj.metadata.name
end, {id = "d"})
luaop.on.update(R, function(ctx) return "fast " .. ctx.name end, {id = "fast"})
`)
	done, flushed := runDaemonAsync(t.Context(), rt, specOf(t, rt, "d"), widgetBody("ua", "a"), context.Background())
	<-kube.entered
	r := resultOf(t, "a handler of b while the daemon of a waits on the API", invokeAsync(t.Context(), rt, specOf(t, rt, "fast"), widgetBody("ub", "b"), nil))
	if r.res.Value != "fast b" {
		t.Errorf("fast handler returned %v", r.res.Value)
	}
	close(kube.release)
	waitDaemonEnded(t, done, "its API call returned")
	if got := flushed(); len(got) != 1 || !reflect.DeepEqual(got[0], map[string]any{"status": map[string]any{"got": "block"}}) {
		t.Errorf("flushes %v, want the final patch", got)
	}
}

// A daemon's deadline bounds each stretch of Lua between two waits, not its life:
// it may sleep past the handler deadline, and an endless loop still fails it.
func TestDaemonDeadlinePerStretch(t *testing.T) {
	rt := loadedRuntime(t, Options{Shards: 1, HandlerTimeout: 200 * time.Millisecond}, "d.lua", `local luaop = require("luaop")
luaop.daemon("example.com/v1/widgets", function(ctx)
  for i = 1, 3 do luaop.sleep(0.15) end -- 450ms in all
  ctx.patch.status.slept = true
  while true do end
end, {id = "d"})
`)
	done, flushed := runDaemonAsync(t.Context(), rt, specOf(t, rt, "d"), widgetBody("ua", "a"), context.Background())
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "deadline") {
			t.Fatalf("daemon: err = %v, want its deadline after the endless loop", err)
		}
	case <-time.After(promptWait):
		t.Fatal("the looping daemon was not stopped by its deadline")
	}
	if got := flushed(); len(got) != 1 {
		t.Errorf("flushes %v: want the patch written after sleeping past the deadline", got)
	}
}

// Close works while a daemon is parked in a sleep, and Forget and new calls do not
// hang: a daemon asleep at its top level (yielded) ends at once with the closed
// error; one parked where it cannot yield (its goroutine waits) fails when woken,
// instead of running on a closed state. The daemon is known to be parked when it
// hands its patch to Flush: sleep does that with the shard released, just before it
// waits.
func TestCloseWithParkedDaemon(t *testing.T) {
	for _, tt := range []struct{ name, sleep string }{
		{"yielded", "luaop.sleep(3600)"},
		{"blocked in a metamethod", "setmetatable({}, {__index = function() return luaop.sleep(3600) end}).x"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rt := loadedRuntime(t, Options{Shards: 1}, "d.lua", `local luaop = require("luaop")
luaop.daemon("example.com/v1/widgets", function(ctx)
  ctx.patch.status.phase = "parking"
  while `+tt.sleep+` do end
end, {id = "d"})
`)
			stop, closeStop := context.WithCancel(context.Background())
			defer closeStop()
			parked := make(chan struct{}, 1)
			done := make(chan error, 1)
			body := widgetBody("ua", "a")
			go rt.StartDaemon(t.Context(), &causes.Call{Handler: specOf(t, rt, "d"), Cause: causes.Cause{Body: body},
				Logger: slog.Default(), Daemon: &causes.DaemonLink{Stopped: stop, Latest: func() map[string]any { return body },
					Flush: func(map[string]any) { parked <- struct{}{} }}}, func(err error) { done <- err })
			waitDaemonSleeps(t, parked, done)
			rt.Close()
			rt.Forget("ua")
			if tt.name != "yielded" {
				select {
				case err := <-done:
					t.Fatalf("the parked daemon returned before it was woken: %v", err)
				default:
				}
				closeStop()
			}
			select {
			case err := <-done:
				if !errors.Is(err, errClosed) && (err == nil || !strings.Contains(err.Error(), errClosed.Error())) {
					t.Errorf("the daemon ended with %v; want %v", err, errClosed)
				}
			case <-time.After(promptWait):
				t.Fatal("the daemon hangs after Close")
			}
			if _, err := rt.Invoke(t.Context(), causes.Call{Handler: specOf(t, rt, "d"), Cause: causes.Cause{Body: widgetBody("ub", "b")}}); !errors.Is(err, errClosed) {
				t.Errorf("a call after Close: err = %v, want %v", err, errClosed)
			}
		})
	}
}

// A module first required inside a handler runs its top level as part of that call:
// under the call's deadline (an endless loop fails the call instead of holding the
// Lua state for ever), and its blocking functions release the state like the call's
// own, so other objects' calls go on meanwhile. A second call requiring the module
// while the first one's load waits gets a clear error, not a "require loop".
func TestModuleRequiredInAHandlerRunsAsPartOfTheCall(t *testing.T) {
	kube := newBlockingKube()
	rt := loadedRuntime(t, Options{Shards: 1, HandlerTimeout: 300 * time.Millisecond, Kube: kube},
		"handlers.lua", `local luaop = require("luaop")
local R = "example.com/v1/widgets"
luaop.on.update(R, function(ctx) return require("lib.spin") end, {id = "spin"})
luaop.on.update(R, function(ctx) return require("lib.waits").value end, {id = "waits"})
luaop.on.update(R, function(ctx) return "fast " .. ctx.name end, {id = "fast"})
`,
		"lib/spin.lua", `while true do end`,
		"lib/waits.lua", `local luaop = require("luaop")
local cm = luaop.kube.get("v1", "ConfigMap", "ns", "block")
return { value = "loaded after " .. cm.metadata.name }
`)
	t.Run("deadline", func(t *testing.T) {
		_, _, err := invokeHandler(t, rt, "spin", createCause("u-spin"))
		if err == nil || !strings.Contains(err.Error(), "lib/spin.lua:1") {
			t.Fatalf("err = %v; want the call to fail at its deadline in lib/spin.lua:1", err)
		}
		// The state is free again: another call runs.
		if got := mustInvoke(t, rt, "fast", createCause("u-after")).Value; got != "fast w1" {
			t.Errorf("fast after the spinning module: %#v", got)
		}
	})
	t.Run("blocking releases the state", func(t *testing.T) {
		waits := invokeAsync(t.Context(), rt, specOf(t, rt, "waits"), widgetBody("u-waits", "a"), nil)
		kube.waitEntered(t, "the module's luaop.kube.get")
		// The module's load waits in luaop.kube.get: the only Lua state is free.
		r := resultOf(t, "fast while a module loads", invokeAsync(t.Context(), rt, specOf(t, rt, "fast"), widgetBody("u-b", "b"), nil))
		if r.res.Value != "fast b" {
			t.Errorf("fast = %#v", r.res.Value)
		}
		// A second call requiring the same module meanwhile.
		second := <-invokeAsync(t.Context(), rt, specOf(t, rt, "waits"), widgetBody("u-c", "c"), nil)
		if second.err == nil || !strings.Contains(second.err.Error(), "still being loaded by another call") {
			t.Errorf("second require during the load: err = %v", second.err)
		}
		close(kube.release)
		if got := resultOf(t, "the call loading the module", waits).res.Value; got != "loaded after block" {
			t.Errorf("waits = %#v", got)
		}
		// Loaded once: later calls get the same module at once.
		if got := mustInvoke(t, rt, "waits", createCause("u-d")).Value; got != "loaded after block" {
			t.Errorf("waits after the load = %#v", got)
		}
	})
}
