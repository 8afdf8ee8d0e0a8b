package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/testcluster"
)

func mergePatch(t *testing.T, gvr schema.GroupVersionResource, ns, name, patch string) {
	t.Helper()
	if _, err := env.Dynamic.Resource(gvr).Namespace(ns).Patch(t.Context(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("patching %s/%s with %s: %v", ns, name, patch, err)
	}
}

func waitGone(t *testing.T, gvr schema.GroupVersionResource, ns, name string) {
	t.Helper()
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		_, err := env.Dynamic.Resource(gvr).Namespace(ns).Get(t.Context(), name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprintf("%s/%s still exists (err=%v)", ns, name, err)
	})
}

// An update handler gets old, new and the diff; the operator's own status writes and
// annotations never count as changes (no update cause from them).
func TestUpdateHandlerGetsOldNewDiff(t *testing.T) {
	ns := env.Namespace(t)
	op := startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx) return "created" end, { id = "made" })
		luaop.on.update("examples.luaop.dev/v1/widgets", function(ctx)
			local changes = {}
			for _, d in ipairs(ctx.diff) do
				table.insert(changes, d.op .. " " .. d.path .. " " .. tostring(d.old) .. "->" .. tostring(d.new))
			end
			ctx.logger.info("update seen")
			return { old = ctx.old.spec.size, new = ctx.new.spec.size, changes = table.concat(changes, ";") }
		end, { id = "changed" })
	`)})
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1}}")
	waitField(t, widgets, ns, "w", "status.made", "created")
	mergePatch(t, widgets, ns, "w", `{"spec":{"size":2}}`)
	obj := waitField(t, widgets, ns, "w", "status.changed.new", int64(2))
	got := obj.Object["status"].(map[string]any)["changed"].(map[string]any)
	if got["old"] != int64(1) || got["changes"] != "change spec.size 1->2" {
		t.Errorf("update handler saw %v, want old=1 and the one change spec.size 1->2", got)
	}
	// The operator handles one object's events in order, its own writes included: once
	// a later change is handled, the writes that handling size 2 cost have been seen,
	// and a run caused by them would be counted (or, had it been folded into the later
	// cycle, would show in that cycle's diff).
	mergePatch(t, widgets, ns, "w", `{"spec":{"size":3}}`)
	obj = waitField(t, widgets, ns, "w", "status.changed.new", int64(3))
	if got := obj.Object["status"].(map[string]any)["changed"].(map[string]any)["changes"]; got != "change spec.size 2->3" {
		t.Errorf("the second update saw the changes %q, want only spec.size 2->3", got)
	}
	if n := strings.Count(op.Log.String(), "update seen"); n != 2 {
		t.Errorf("the update handler ran %d times for 2 changes, want 2 (the operator's own writes must not be changes)", n)
	}
}

// A field handler runs only when its field changes, with that field's old/new.
func TestFieldHandlerRunsOnlyForItsField(t *testing.T) {
	ns := env.Namespace(t)
	op := startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.on.field("examples.luaop.dev/v1/widgets", "spec.size", function(ctx)
			ctx.logger.info("size field", tostring(ctx.old), "->", tostring(ctx.new))
			return { old = ctx.old, new = ctx.new }
		end, { id = "size" })
	`)})
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1, color: red}}")
	waitField(t, widgets, ns, "w", "status.size.new", int64(1))
	mergePatch(t, widgets, ns, "w", `{"spec":{"color":"blue"}}`)
	waitHandled(t, widgets, ns, "w", `{"spec":{"color":"blue","size":1}}`)
	mergePatch(t, widgets, ns, "w", `{"spec":{"size":5}}`)
	waitField(t, widgets, ns, "w", "status.size.old", int64(1))
	waitField(t, widgets, ns, "w", "status.size.new", int64(5))
	logs := op.Log.String()
	if n := strings.Count(logs, "size field"); n != 2 {
		t.Errorf("field handler ran %d times, want 2 (creation and the size change, not the color change):\n%s", n, logs)
	}
}

// Subhandlers: each has its own persisted progress; a failing one is retried without
// re-running the succeeded ones, and the parent finishes when all of them have.
func TestSubhandlersKeepTheirOwnProgress(t *testing.T) {
	ns := env.Namespace(t)
	op := startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx)
			for _, step in ipairs({"a", "b", "c"}) do
				ctx.subhandler(function(sub)
					sub.logger.info("step", step, "retry", sub.retry)
					if step == "b" and sub.retry == 0 then
						error(luaop.temporary_error("b needs a second try", 0.3))
					end
					sub.patch.status.steps[step] = "done"
				end, { id = step })
			end
		end, { id = "steps" })
	`)})
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1}}")
	waitField(t, widgets, ns, "w", "status.steps", map[string]any{"a": "done", "b": "done", "c": "done"})
	testcluster.Eventually(t, 10*time.Second, func() (bool, string) {
		obj := get(t, widgets, ns, "w")
		for k := range obj.GetAnnotations() {
			if strings.HasPrefix(k, "luaop.dev/steps") {
				return false, "progress of steps still stored: " + k
			}
		}
		if progress, _, _ := unstructured.NestedMap(obj.Object, "status", "luaop_dev", "progress"); len(progress) > 0 {
			return false, fmt.Sprintf("progress still stored: %v", progress)
		}
		_, handled := diffBaseOf(obj)
		return handled, "waiting for the cause to complete"
	})
	logs := op.Log.String()
	for _, want := range []string{"step a retry 0", "step b retry 0", "step b retry 1", "step c retry 0"} {
		if n := strings.Count(logs, want); n != 1 {
			t.Errorf("%q logged %d times, want once:\n%s", want, n, logs)
		}
	}
}
