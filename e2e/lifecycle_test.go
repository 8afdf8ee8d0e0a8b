package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/testcluster"
)

func deleteObject(t *testing.T, ns, name string) {
	t.Helper()
	if err := env.Dynamic.Resource(widgets).Namespace(ns).Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting %s/%s: %v", ns, name, err)
	}
}

// A delete handler makes the operator put its finalizer on the object; deletion
// waits for the handler, then the finalizer is released and the object goes.
func TestDeleteHandlerHoldsAndReleasesTheFinalizer(t *testing.T) {
	ns := env.Namespace(t)
	op := startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.on.delete("examples.luaop.dev/v1/widgets", function(ctx)
			if ctx.retry == 0 then
				error(luaop.temporary_error("not yet", 0.5))
			end
			ctx.logger.info("cleaned up after", ctx.name)
		end, { id = "cleanup" })
	`)})
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1}}")
	waitField(t, widgets, ns, "w", "metadata.finalizers", []any{"luaop.dev/finalizer"})
	deleteObject(t, ns, "w")
	// Held while the handler retries...
	obj := get(t, widgets, ns, "w")
	if obj.GetDeletionTimestamp() == nil {
		t.Fatalf("the object should be marked for deletion and held by the finalizer")
	}
	waitGone(t, widgets, ns, "w")
	if !strings.Contains(op.Log.String(), "cleaned up after w") {
		t.Errorf("the delete handler did not complete before the object went:\n%s", op.Log.String())
	}
}

// An optional delete handler needs no finalizer.
func TestOptionalDeleteHandlerAddsNoFinalizer(t *testing.T) {
	ns := env.Namespace(t)
	startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx) return "ok" end, { id = "made" })
		luaop.on.delete("examples.luaop.dev/v1/widgets", function(ctx) end, { id = "bye", optional = true })
	`)})
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1}}")
	obj := waitField(t, widgets, ns, "w", "status.made", "ok")
	if f := obj.GetFinalizers(); len(f) != 0 {
		t.Errorf("finalizers = %v, want none for an optional delete handler", f)
	}
	deleteObject(t, ns, "w")
	waitGone(t, widgets, ns, "w")
}

// A TemporaryError retries after its delay; progress is kept in annotations while
// retrying and purged once the cause is handled.
func TestTemporaryErrorRetriesAfterItsDelay(t *testing.T) {
	ns := env.Namespace(t)
	startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx)
			if ctx.retry < 2 then
				error(luaop.temporary_error("waiting for something, attempt " .. ctx.retry, 0.4))
			end
			return { attempts = ctx.retry + 1, runtime_ok = ctx.runtime >= 0.7 }
		end, { id = "flaky" })
	`)})
	start := time.Now()
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1}}")
	var sawProgress bool
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		obj := get(t, widgets, ns, "w")
		if rec, ok := progressOf(obj, "flaky"); ok && strings.Contains(rec, `"retries"`) {
			sawProgress = true
		}
		st, _ := obj.Object["status"].(map[string]any)
		_, progressLeft := progressOf(obj, "flaky")
		return st["flaky"] != nil && !progressLeft, "waiting for status.flaky and the progress annotation's purge"
	})
	obj := get(t, widgets, ns, "w")
	res := obj.Object["status"].(map[string]any)["flaky"].(map[string]any)
	if res["attempts"] != int64(3) || res["runtime_ok"] != true {
		t.Errorf("status.flaky = %v, want attempts=3 and a runtime covering both delays", res)
	}
	if took := time.Since(start); took < 800*time.Millisecond {
		t.Errorf("finished after %s: the two 0.4 s delays were not respected", took)
	}
	if !sawProgress {
		t.Log("note: the progress annotation was not caught between retries (timing)")
	}
}

// A PermanentError fails the handler for good: no retry, and the cause counts as
// handled (the diff-base is stored), so no endless loop.
func TestPermanentErrorIsNotRetried(t *testing.T) {
	ns := env.Namespace(t)
	op := startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx)
			ctx.logger.info("attempting")
			error(luaop.permanent_error("this can never work"))
		end, { id = "doomed" })
		luaop.on.update("examples.luaop.dev/v1/widgets", function(ctx) return ctx.spec.size end, { id = "later" })
	`)})
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1}}")
	waitHandled(t, widgets, ns, "w", `{"spec":{"size":1}}`)
	// One object's events are handled in order: once a later change is handled, a
	// retry of the creation's handler would already have run.
	mergePatch(t, widgets, ns, "w", `{"spec":{"size":2}}`)
	waitField(t, widgets, ns, "w", "status.later", int64(2))
	logs := op.Log.String()
	if n := strings.Count(logs, "attempting"); n != 1 {
		t.Errorf("the handler ran %d times, want 1", n)
	}
	if !strings.Contains(logs, "this can never work") {
		t.Errorf("the permanent failure's message is not in the log:\n%s", logs)
	}
}

// Handler options: retries bound the attempts of arbitrary errors (with backoff).
func TestRetriesLimitTurnsIntoFailure(t *testing.T) {
	ns := env.Namespace(t)
	op := startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx)
			ctx.logger.info("try", ctx.retry)
			error("boom")
		end, { id = "limited", retries = 2, backoff = 0.2 })
	`)})
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1}}")
	waitHandled(t, widgets, ns, "w", `{"spec":{"size":1}}`)
	logs := op.Log.String()
	if n := strings.Count(logs, "msg=\"try "); n != 2 {
		t.Errorf("the handler ran %d times, want 2 (retries = 2)", n)
	}
	if !strings.Contains(logs, "exceeded its 2 retries") || !strings.Contains(logs, "test.lua:5") {
		t.Errorf("want the retry limit and the error's file:line in the log:\n%s", logs)
	}
}

// Without a status subresource the result is patched with the object.
func TestStatusWithoutSubresource(t *testing.T) {
	ns := env.Namespace(t)
	startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.on.create("e2e.luaop.dev/v1/gadgets", function(ctx)
			ctx.patch.metadata.labels.seen = "yes"
			return { ok = true }
		end, { id = "g" })
	`)})
	create(t, gadgets, ns, "{apiVersion: e2e.luaop.dev/v1, kind: Gadget, metadata: {name: g1}, spec: {a: 1}}")
	obj := waitField(t, gadgets, ns, "g1", "status.g.ok", true)
	if obj.GetLabels()["seen"] != "yes" {
		t.Errorf("labels = %v, want the label written through ctx.patch", obj.GetLabels())
	}
}

// A CRD whose status schema prunes the handler's result: reported once, clearly,
// and the handler is not re-run in a loop.
func TestPrunedStatusIsReportedOnceNotRetried(t *testing.T) {
	ns := env.Namespace(t)
	op := startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.on.create("e2e.luaop.dev/v1/strictthings", function(ctx)
			ctx.logger.info("strict run")
			ctx.patch.status.phase = "Ready"
			return { detail = "pruned by the schema" }
		end, { id = "strict" })
		luaop.on.update("e2e.luaop.dev/v1/strictthings", function(ctx)
			ctx.patch.status.phase = "Changed"
		end, { id = "later" })
	`)})
	for i := 0; i < 2; i++ {
		create(t, strictThings, ns, fmt.Sprintf("{apiVersion: e2e.luaop.dev/v1, kind: StrictThing, metadata: {name: s%d}, spec: {a: 1}}", i))
	}
	waitField(t, strictThings, ns, "s0", "status.phase", "Ready")
	waitField(t, strictThings, ns, "s1", "status.phase", "Ready")
	// One object's events are handled in order: once a later change of each is
	// handled, a re-run of its creation's handler (a loop on the pruned result) would
	// already have run.
	for _, name := range []string{"s0", "s1"} {
		mergePatch(t, strictThings, ns, name, `{"spec":{"a":2}}`)
	}
	waitField(t, strictThings, ns, "s0", "status.phase", "Changed")
	waitField(t, strictThings, ns, "s1", "status.phase", "Changed")
	logs := op.Log.String()
	if n := strings.Count(logs, "strict run"); n != 2 {
		t.Errorf("the handler ran %d times for 2 objects, want 2", n)
	}
	if n := strings.Count(logs, "dropped status.strict"); n != 1 {
		t.Errorf("the pruning was reported %d times, want once:\n%s", n, logs)
	}
	if !strings.Contains(logs, "x-kubernetes-preserve-unknown-fields") {
		t.Errorf("the report should say what to add to the schema:\n%s", logs)
	}
}

// Raw event handlers see every event with its type.
func TestEventHandlerSeesEveryEvent(t *testing.T) {
	ns := env.Namespace(t)
	op := startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.on.event("examples.luaop.dev/v1/widgets", function(ctx)
			ctx.logger.info("event", ctx.type, ctx.spec.size)
		end, { id = "spy" })
	`)})
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1}}")
	mergePatch(t, widgets, ns, "w", `{"spec":{"size":2}}`)
	deleteObject(t, ns, "w")
	testcluster.Eventually(t, 10*time.Second, func() (bool, string) {
		logs := op.Log.String()
		return strings.Contains(logs, "event ADDED 1") && strings.Contains(logs, "event MODIFIED 2") && strings.Contains(logs, "event DELETED 2"),
			"want ADDED 1, MODIFIED 2 and DELETED 2 in the log"
	})
}

// Handler outcomes are posted as Kubernetes Events on the object.
func TestHandlerOutcomesArePostedAsEvents(t *testing.T) {
	ns := env.Namespace(t)
	startWith(t, ns, postingEvents(script(`
		local luaop = require("luaop")
		luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx)
			if ctx.retry == 0 then error(luaop.temporary_error("warming up", 0.2)) end
			luaop.info(ctx.body, "Custom", "hello from the script")
		end, { id = "evented" })
	`)))
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1}}")
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		list, err := env.Kube.CoreV1().Events(ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		seen := map[string]bool{}
		for _, e := range list.Items {
			if e.InvolvedObject.Name == "w" {
				seen[e.Reason] = true
			}
		}
		return seen["HandlerRetrying"] && seen["HandlerSucceeded"] && seen["Custom"],
			fmt.Sprintf("events seen: %v; want HandlerRetrying, HandlerSucceeded and Custom", seen)
	})
}

// Issue 12, item 3: what a handler wrote to ctx.patch before raising is applied
// (kopf): the object shows status.phase "Waiting" while the handler retries.
func TestPatchWrittenBeforeATemporaryErrorIsApplied(t *testing.T) {
	ns := env.Namespace(t)
	startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx)
			ctx.patch.status.phase = "Waiting"
			ctx.patch.status.attempt = ctx.retry
			if ctx.retry < 2 then
				error(luaop.temporary_error("not ready yet", 1))
			end
			ctx.patch.status.phase = "Ready"
		end, { id = "wait" })
	`)})
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1}}")
	waitField(t, widgets, ns, "w", "status.phase", "Waiting")
	waitField(t, widgets, ns, "w", "status.attempt", int64(1))
	waitField(t, widgets, ns, "w", "status.phase", "Ready")
}

// A deletion's cause carries the state last handled and the current one, as kopf's:
// a field delete handler sees its field in both, and its subhandler filtering on
// another field sees the whole object (it saw none, and never ran).
func TestFieldDeleteHandlerAndItsSubhandlerSeeTheObject(t *testing.T) {
	ns := env.Namespace(t)
	op := startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		local W = "examples.luaop.dev/v1/widgets"
		luaop.on.update(W, function(ctx) return ctx.spec.size end, { id = "seen" })
		luaop.on.delete(W, function(ctx)
			ctx.subhandler(function(sub) sub.logger.info("subhandler saw mode", sub.spec.mode) end,
				{ id = "fast", field = "spec.mode", value = "fast" })
			ctx.logger.info("delete handler saw size", ctx.old, "->", ctx.new)
		end, { id = "cleanup", field = "spec.size" })
	`)})
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1, mode: fast}}")
	waitField(t, widgets, ns, "w", "metadata.finalizers", []any{"luaop.dev/finalizer"})
	mergePatch(t, widgets, ns, "w", `{"spec":{"size":2}}`)
	waitField(t, widgets, ns, "w", "status.seen", int64(2))
	deleteObject(t, ns, "w")
	waitGone(t, widgets, ns, "w")
	logs := op.Log.String()
	for _, want := range []string{"delete handler saw size 2 -> 2", "subhandler saw mode fast"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the log lacks %q:\n%s", want, logs)
		}
	}
}

// What a daemon returns is stored at status.<id>, as kopf delivers a daemon's result.
func TestDaemonResultIsStoredInStatus(t *testing.T) {
	ns := env.Namespace(t)
	startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.daemon("examples.luaop.dev/v1/widgets", function(ctx)
			luaop.sleep(0.1)
			return { checked = ctx.name }
		end, { id = "probe" })
	`)})
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1}}")
	waitField(t, widgets, ns, "w", "status.probe", map[string]any{"checked": "w"})
}
