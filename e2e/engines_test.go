package e2e

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/testcluster"
)

// A daemon starts with its object, patches it while it runs, stops on deletion, and
// the finalizer holds the deletion until it has exited.
func TestDaemonStartsWithObjectAndStopsOnDeletion(t *testing.T) {
	ns := env.Namespace(t)
	op := startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.daemon("examples.luaop.dev/v1/widgets", function(ctx)
			local beats = 0
			while not ctx.stopped() do
				beats = beats + 1
				ctx.patch.status.beats = beats
				luaop.sleep(0.2)
			end
			ctx.logger.info("daemon saw the stop flag after", beats, "beats")
		end, { id = "heart" })
	`)})
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1}}")
	testcluster.Eventually(t, 10*time.Second, func() (bool, string) {
		st, _ := get(t, widgets, ns, "w").Object["status"].(map[string]any)
		b, _ := st["beats"].(int64)
		return b >= 3, fmt.Sprintf("waiting for 3 heartbeats, status %v", st)
	})
	if f := get(t, widgets, ns, "w").GetFinalizers(); len(f) != 1 {
		t.Fatalf("finalizers = %v: a daemon needs the finalizer", f)
	}
	deleteObject(t, ns, "w")
	waitGone(t, widgets, ns, "w")
	if !strings.Contains(op.Log.String(), "daemon saw the stop flag") {
		t.Errorf("the daemon did not exit through its stop flag before the object went:\n%s", op.Log.String())
	}
}

// A daemon that returns is not restarted; one that fails is, with its backoff.
func TestDaemonReturnIsFinalFailureRestarts(t *testing.T) {
	ns := env.Namespace(t)
	op := startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.daemon("examples.luaop.dev/v1/widgets", function(ctx)
			ctx.logger.info("once-daemon ran")
		end, { id = "once" })
		luaop.daemon("examples.luaop.dev/v1/widgets", function(ctx)
			ctx.memo.runs = (ctx.memo.runs or 0) + 1
			ctx.logger.info("flaky-daemon run", ctx.memo.runs)
			if ctx.memo.runs < 3 then error("crash " .. ctx.memo.runs) end
			while not ctx.stopped() do luaop.sleep(1) end
		end, { id = "flaky", backoff = 0.2 })
		luaop.on.update("examples.luaop.dev/v1/widgets", function(ctx) return ctx.spec.size end, { id = "seen" })
	`)})
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1}}")
	testcluster.Eventually(t, 10*time.Second, func() (bool, string) {
		return strings.Contains(op.Log.String(), "flaky-daemon run 3"), "waiting for the third run of the failing daemon"
	})
	mergePatch(t, widgets, ns, "w", `{"spec":{"size":2}}`) // new cycles must not restart "once"
	// The cycle of that change adjusts the daemons before it runs the update handler:
	// once its result is stored, a wrong restart would have happened.
	waitField(t, widgets, ns, "w", "status.seen", int64(2))
	logs := op.Log.String()
	if n := strings.Count(logs, "once-daemon ran"); n != 1 {
		t.Errorf("a daemon that returned ran %d times, want once", n)
	}
	if n := strings.Count(logs, "flaky-daemon run 4"); n != 0 {
		t.Errorf("the daemon was restarted although it is running")
	}
}

// Timers: a cadence, idle (only after N s without an essential change), and sharp.
// On the real server the test checks what a user sees: every timer keeps running,
// each with its own handler. Sharp versus drifting schedules are proved on the
// fake clock (processing: TestSharpTimerKeepsItsScheduleAndOthersDrift); measured
// intervals would depend on the machine's load.
func TestTimerCadenceIdleAndSharp(t *testing.T) {
	ns := env.Namespace(t)
	op := startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		local function recorder(name)
			return function(ctx)
				ctx.memo[name] = ctx.memo[name] or {}
				table.insert(ctx.memo[name], ctx.started)
				luaop.sleep(0.2) -- the run takes time
				ctx.logger.info(name .. " tick", #ctx.memo[name])
				ctx.patch.status[name] = { runs = #ctx.memo[name], handler = ctx.id }
			end
		end
		luaop.timer("examples.luaop.dev/v1/widgets", recorder("sharp"), { id = "sharp", interval = 0.5, sharp = true })
		luaop.timer("examples.luaop.dev/v1/widgets", recorder("drifting"), { id = "drifting", interval = 0.5 })
		luaop.timer("e2e.luaop.dev/v1/gadgets", function(ctx)
			ctx.logger.info("idle timer ran for", ctx.name)
			return "quiet now"
		end, { id = "idle", interval = 0.2, idle = 1.2 })
	`)})
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1}}")
	create(t, gadgets, ns, "{apiVersion: e2e.luaop.dev/v1, kind: Gadget, metadata: {name: g}, spec: {n: 0}}")
	// Keep changing the gadget for 1.5 s: its idle timer must not run meanwhile. The
	// sleeps are the scenario (changes closer together than the 1.2 s idle time); a
	// machine so loaded that two changes ended up farther apart proves nothing.
	longest, last := time.Duration(0), time.Now()
	for i := 1; i <= 6; i++ {
		time.Sleep(250 * time.Millisecond)
		mergePatch(t, gadgets, ns, "g", fmt.Sprintf(`{"spec":{"n":%d}}`, i))
		longest, last = max(longest, time.Since(last)), time.Now()
	}
	switch {
	case longest > time.Second:
		t.Logf("two changes were %s apart, close to the idle time: the idle check is skipped", longest)
	case strings.Contains(op.Log.String(), "idle timer ran"):
		t.Errorf("the idle timer ran while the object kept changing")
	}
	waitField(t, gadgets, ns, "g", "status.idle", "quiet now")

	testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
		st, _ := get(t, widgets, ns, "w").Object["status"].(map[string]any)
		s, _ := st["sharp"].(map[string]any)
		d, _ := st["drifting"].(map[string]any)
		sr, _ := s["runs"].(int64)
		dr, _ := d["runs"].(int64)
		return sr >= 5 && dr >= 5, fmt.Sprintf("waiting for 5 runs of each timer: %v", st)
	})
	st := get(t, widgets, ns, "w").Object["status"].(map[string]any)
	logs := op.Log.String()
	for _, name := range []string{"sharp", "drifting"} {
		if got := st[name].(map[string]any)["handler"]; got != name {
			t.Errorf("status.%s was written by handler %v, want %s", name, got, name)
		}
		if n := strings.Count(logs, name+" tick"); n < 5 {
			t.Errorf("the %s timer's handler logged %d ticks, want at least 5", name, n)
		}
	}
	if strings.Contains(logs, "timer failed") {
		t.Errorf("a timer failed:\n%s", logs)
	}
}

// An index built from one resource is read by another resource's handler.
func TestIndexLookupFromAnotherHandler(t *testing.T) {
	ns := env.Namespace(t)
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: red1}, spec: {color: red}}")
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: blue1}, spec: {color: blue}}")
	startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.index("examples.luaop.dev/v1/widgets", function(ctx)
			return { [ctx.spec.color] = ctx.name }
		end, { id = "by_color" })
		luaop.on.create("e2e.luaop.dev/v1/gadgets", function(ctx)
			local names = {}
			for _, n in ipairs(ctx.indexes.by_color[ctx.spec.color] or {}) do table.insert(names, n) end
			-- red2 is created while the operator runs: the handler waits (retries) until
			-- the index has it, instead of the test sleeping for it.
			if #names < 2 then error(luaop.temporary_error("red2 not indexed yet", 0.2)) end
			table.sort(names)
			return table.concat(names, ",")
		end, { id = "same_color" })
	`)})
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: red2}, spec: {color: red}}")
	create(t, gadgets, ns, "{apiVersion: e2e.luaop.dev/v1, kind: Gadget, metadata: {name: g}, spec: {color: red}}")
	waitField(t, gadgets, ns, "g", "status.same_color", "red1,red2")
}

// A startup handler that fails for good stops the start with a clear message (other
// errors are retried with the handler's backoff, as kopf retries its activities).
func TestFailingStartupStopsTheStart(t *testing.T) {
	ns := env.Namespace(t)
	op := env.StartOperatorAsync(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.on.startup(function(ctx) error(luaop.permanent_error("the license server is unreachable")) end, { id = "check" })
		luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx) end)
	`)})
	err := op.Wait(t, 10*time.Second)
	if err == nil || !strings.Contains(err.Error(), "startup handler check failed") || !strings.Contains(err.Error(), "license server is unreachable") {
		t.Fatalf("Start returned %v; want the startup handler's failure", err)
	}
}

// SIGTERM-like stop while daemons run: daemons stop, cleanup runs, nothing is left.
func TestCleanShutdownWhileDaemonsRun(t *testing.T) {
	ns := env.Namespace(t)
	before := runtime.NumGoroutine()
	op := startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.daemon("examples.luaop.dev/v1/widgets", function(ctx)
			while luaop.sleep(30) do end
			ctx.logger.info("daemon leaving", ctx.name)
		end, { id = "sleeper" })
		luaop.on.cleanup(function(ctx) ctx.logger.info("cleanup ran") end)
	`)})
	for i := 0; i < 5; i++ {
		create(t, widgets, ns, fmt.Sprintf("{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w%d}}", i))
	}
	testcluster.Eventually(t, 10*time.Second, func() (bool, string) {
		return strings.Count(op.Log.String(), "daemon started") == 5, "waiting for 5 daemons"
	})
	// No time bound on the stop: the daemons sleep 30 s at a time in an endless
	// loop, so "daemon leaving" is logged only if the stop woke them.
	if err := op.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	logs := op.Log.String()
	if n := strings.Count(logs, "daemon leaving"); n != 5 || !strings.Contains(logs, "cleanup ran") {
		t.Errorf("want 5 daemons leaving and the cleanup handler; log:\n%s", logs)
	}
	testcluster.Eventually(t, 5*time.Second, func() (bool, string) {
		n := runtime.NumGoroutine()
		return n <= before+5, fmt.Sprintf("%d goroutines left, %d before the operator", n, before)
	})
}

// Issue 12.16: an object being deleted stays in the indexes until it is gone (kopf
// keeps it until the DELETED event): handlers still find it while another finalizer
// holds it, and no longer once it is gone.
func TestDeletingObjectIsFoundInItsIndexUntilGone(t *testing.T) {
	ns := env.Namespace(t)
	op := startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		local R = "e2e.luaop.dev/v1/gadgets"
		luaop.index(R, function(ctx) return {[ctx.name] = ctx.spec.size} end, {id = "sizes"})
		luaop.on.delete(R, function(ctx)
			local found = ctx.indexes.sizes[ctx.name]
			ctx.logger.info("DELETE-SEES " .. tostring(found and #found or 0))
		end, {id = "cleanup"})
		luaop.on.event("v1/configmaps", function(ctx)
			if ctx.type == "DELETED" then return end
			local found = ctx.indexes.sizes[ctx.body.data.gadget]
			ctx.logger.info("LOOKUP " .. ctx.name .. " " .. tostring(found and #found or 0))
		end, {id = "lookup"})
	`)})
	create(t, gadgets, ns, "{apiVersion: e2e.luaop.dev/v1, kind: Gadget, metadata: {name: g, finalizers: [e2e.luaop.dev/hold]}, spec: {size: 3}}")
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		f := get(t, gadgets, ns, "g").GetFinalizers()
		return len(f) == 2, fmt.Sprintf("waiting for luaop's finalizer: %v", f)
	})
	if err := env.Dynamic.Resource(gadgets).Namespace(ns).Delete(t.Context(), "g", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	logged := func(what string) {
		t.Helper()
		testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
			return strings.Contains(op.Log.String(), what), "no log line " + what
		})
	}
	logged("DELETE-SEES 1")
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		f := get(t, gadgets, ns, "g").GetFinalizers()
		return len(f) == 1, fmt.Sprintf("waiting for luaop to release its finalizer: %v", f)
	})
	lookup := func(name string) {
		t.Helper()
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"gadget": "g"}}
		if _, err := env.Kube.CoreV1().ConfigMaps(ns).Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	lookup("while-deleting")
	logged("LOOKUP while-deleting 1")
	patchGadget(t, ns, "g", `{"metadata":{"finalizers":null}}`)
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		_, err := env.Dynamic.Resource(gadgets).Namespace(ns).Get(t.Context(), "g", metav1.GetOptions{})
		return err != nil, "the gadget is still there"
	})
	// The DELETED event reaches the operator some time after the gadget is gone:
	// look it up again (a new ConfigMap each time) until the index no longer has it.
	i := 0
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		i++
		name := fmt.Sprintf("after-gone-%d", i)
		lookup(name)
		logged("LOOKUP " + name + " ")
		return strings.Contains(op.Log.String(), "LOOKUP "+name+" 0"), "the index still finds the gone gadget"
	})
}

// Issue 12, item 10: what startup handlers leave in the operator memo is in every
// object's memo; a failing startup handler is retried before objects are handled.
func TestStartupMemoReachesObjectHandlers(t *testing.T) {
	ns := env.Namespace(t)
	startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.on.startup(function(ctx)
			ctx.memo.tries = (ctx.memo.tries or 0) + 1
			if ctx.retry < 1 then error(luaop.temporary_error("database not ready", 0.2)) end
			ctx.memo.config = {greeting = "hello"}
		end, { id = "boot" })
		luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx)
			return ctx.memo.config.greeting .. " after " .. ctx.memo.tries
		end, { id = "greet" })
	`)})
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1}}")
	waitField(t, widgets, ns, "w", "status.greet", "hello after 2")
}
