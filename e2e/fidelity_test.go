package e2e

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/testcluster"
)

// Issue 12.2: luaop adds and removes only its own finalizer, from the object as it is
// now. Here another controller removes its finalizer while luaop's delete handler runs
// (after luaop read the object): a write of the whole list as luaop last saw it would
// bring the other finalizer back and block the deletion forever.
func TestFinalizerOfAnotherControllerIsNotResurrectedWhenOursIsReleased(t *testing.T) {
	ns := env.Namespace(t)
	startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.on.delete("examples.luaop.dev/v1/widgets", function(ctx)
			-- the other controller finishes its cleanup meanwhile
			local _, err = luaop.kube.patch("examples.luaop.dev/v1", "Widget", ctx.namespace, ctx.name,
				{ metadata = { finalizers = { "luaop.dev/finalizer" } } })
			if err then error(err) end
		end, { id = "cleanup" })
	`)})
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w, finalizers: [other.example.com/keep]}, spec: {size: 1}}")
	waitField(t, widgets, ns, "w", "metadata.finalizers", []any{"other.example.com/keep", "luaop.dev/finalizer"})
	deleteObject(t, ns, "w")
	waitGone(t, widgets, ns, "w")
}

// Issue 12.1, as it was reported: a field handler on spec.size and an update handler
// (lifecycle asap), a daemon writing the object's status all the time, and sequential
// patches of spec.size. Every run of the field handler must start from the value it
// last handled (a change never swallowed), and the final value must be handled.
func TestSpecChangesUnderConcurrentDaemonWritesAreNeverSwallowed(t *testing.T) {
	ns := env.Namespace(t)
	op := startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.on.field("examples.luaop.dev/v1/widgets", "spec.size", function(ctx)
			ctx.logger.info("size " .. tostring(ctx.old) .. " -> " .. tostring(ctx.new))
			return ctx.new
		end, { id = "size" })
		luaop.on.update("examples.luaop.dev/v1/widgets", function(ctx) return ctx.spec.size end, { id = "whole" })
		luaop.daemon("examples.luaop.dev/v1/widgets", function(ctx)
			local n = 0
			while luaop.sleep(0.05) do
				n = n + 1
				ctx.patch.status.beat = n
			end
		end, { id = "heartbeat" })
	`)})
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 0}}")
	waitHandled(t, widgets, ns, "w", `{"spec":{"size":0}}`)
	const last = 40
	for i := 1; i <= last; i++ {
		patch := fmt.Sprintf(`{"spec":{"size":%d}}`, i)
		if _, err := env.Dynamic.Resource(widgets).Namespace(ns).Patch(t.Context(), "w", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(i%4) * 15 * time.Millisecond) // some patches land mid-cause, some between
	}
	waitField(t, widgets, ns, "w", "status.size", int64(last))
	waitField(t, widgets, ns, "w", "status.whole", int64(last))

	runs := regexp.MustCompile(`msg="size (\S+) -> (\S+)"`).FindAllStringSubmatch(op.Log.String(), -1)
	handled := "nil" // what the field handler last handled as new
	var seen []string
	for _, r := range runs {
		seen = append(seen, r[1]+"->"+r[2])
		if r[1] != handled {
			t.Errorf("the field handler ran %s -> %s, but it last handled %s: the change to %s was swallowed", r[1], r[2], handled, handled)
		}
		handled = r[2]
	}
	if handled != strconv.Itoa(last) {
		t.Errorf("the final value %d never reached the field handler (last %s)", last, handled)
	}
	if len(runs) < 2 || !slices.IsSorted(seen) && strings.Count(strings.Join(seen, " "), "->") == 0 {
		t.Errorf("too few runs to mean anything: %v", seen)
	}
	t.Logf("%d patches reached the field handler in %d runs", last, len(runs))
}

// Issue 12.4 with the real Lua filters: a script whose only handler is on.field with a
// value filter handles its objects (prematch looks at the handler's field, old or
// new, and leaves out the old/new filters, as kopf).
func TestFieldHandlerWithAValueFilterAloneHandlesItsObjects(t *testing.T) {
	ns := env.Namespace(t)
	op := startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.on.field("examples.luaop.dev/v1/widgets", "spec.mode", function(ctx)
			ctx.logger.info("mode " .. tostring(ctx.old) .. " -> " .. tostring(ctx.new))
			return ctx.new
		end, { id = "mode", value = "on" })
	`)})
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1, mode: off}}")
	mergePatch(t, widgets, ns, "w", `{"spec":{"mode":"on"}}`)
	waitField(t, widgets, ns, "w", "status.mode", "on")
	mergePatch(t, widgets, ns, "w", `{"spec":{"mode":"off"}}`)
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		return strings.Contains(op.Log.String(), `msg="mode on -> off"`), "waiting for the change away from on (value matches the old value)"
	})
}
