package e2e

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/testcluster"
)

// An object deleted and re-created under its name while a handler of the old one is
// still running: the old cycle's patch must not land on the new object (it would
// mark it handled with the old essence, and the new creation would never be seen).
// The server refuses the patch because it carries the old incarnation's uid.
func TestObjectRecreatedWhileItsOldCycleRunsIsHandledAsNew(t *testing.T) {
	ns := env.Namespace(t)
	op := startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx)
			if ctx.spec.slow then
				ctx.logger.info("slow create started for", ctx.uid)
				luaop.sleep(2)
			end
			return { uid = ctx.uid, size = ctx.spec.size }
		end, { id = "made" })
	`)})
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1, slow: true}}")
	testcluster.Eventually(t, 10*time.Second, func() (bool, string) {
		return strings.Contains(op.Log.String(), "slow create started"), "waiting for the slow handler to start"
	})
	deleteObject(t, ns, "w")
	waitGone(t, widgets, ns, "w")
	second := create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 2}}")
	// Both incarnations share the object's key, handled by one worker at a time: the
	// new one's cycle runs only after the old cycle (its 2 s sleep, then its refused
	// patch) ended. Until the new one's result shows, the object never carries the old
	// one's result, not even for a moment.
	var obj *unstructured.Unstructured
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		obj = get(t, widgets, ns, "w")
		uid, _, _ := unstructured.NestedString(obj.Object, "status", "made", "uid")
		if uid != "" && uid != string(second.GetUID()) {
			t.Fatalf("the new object carries the old incarnation's result (uid %s)", uid)
		}
		return uid == string(second.GetUID()), "waiting for the new object's own result: status.made.uid is " + uid
	})
	if size, _, _ := unstructured.NestedFieldNoCopy(obj.Object, "status", "made", "size"); sameValue(size, 1) {
		t.Errorf("the new object carries the old one's result: %v", obj.Object["status"])
	}
}

// Two spellings of one resource in the scripts: one informer, one key, one worker;
// each handler runs once.
func TestTwoSpellingsOfOneResourceShareOneWorker(t *testing.T) {
	ns := env.Namespace(t)
	op := startWith(t, ns, operator.Options{Scripts: []luabind.Script{
		{Name: "a.lua", Source: []byte(`
			local luaop = require("luaop")
			luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx) luaop.sleep(0.2); return "a" end, { id = "by_plural" })
		`)},
		{Name: "b.lua", Source: []byte(`
			local luaop = require("luaop")
			luaop.on.create("examples.luaop.dev/v1/Widget", function(ctx) luaop.sleep(0.2); return "b" end, { id = "by_kind" })
			luaop.on.update("examples.luaop.dev/v1/Widget", function(ctx) return ctx.spec.size end, { id = "later" })
		`)},
	}})
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1}}")
	waitField(t, widgets, ns, "w", "status.by_plural", "a")
	waitField(t, widgets, ns, "w", "status.by_kind", "b")
	// One object's events are handled in order: once a later change is handled, any
	// run the creation would cause again has already happened and is counted below.
	mergePatch(t, widgets, ns, "w", `{"spec":{"size":2}}`)
	waitField(t, widgets, ns, "w", "status.later", int64(2))
	log := op.Log.String()
	for _, id := range []string{"by_plural", "by_kind"} {
		if n := strings.Count(log, `"handler succeeded" handler=`+id) + strings.Count(log, `"msg":"handler succeeded","handler":"`+id+`"`); n > 1 {
			t.Errorf("handler %s succeeded %d times for one creation", id, n)
		}
	}
	if n := strings.Count(log, "watching"); n != 1 {
		t.Errorf("%d watchers started for one resource spelled two ways:\n%s", n, log)
	}
}

// With a single Lua shard, a handler sleeping for one object does not hold up the
// handler of another object: luaop.sleep releases the shard.
func TestSleepingHandlerDoesNotDelayAnotherObjectOnItsShard(t *testing.T) {
	ns := env.Namespace(t)
	opts := operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx)
			if ctx.spec.slow then
				ctx.logger.info("slow handler sleeps")
				luaop.sleep(4)
			end
			return { at = os.time() }
		end, { id = "made" })
	`)}
	opts.Runtime.Shards = 1
	op := startWith(t, ns, opts)
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: slow}, spec: {size: 1, slow: true}}")
	testcluster.Eventually(t, 10*time.Second, func() (bool, string) {
		return strings.Contains(op.Log.String(), "slow handler sleeps"), "waiting for the slow object's handler to start sleeping"
	})
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: fast}, spec: {size: 1}}")
	testcluster.Eventually(t, 10*time.Second, func() (bool, string) {
		fast, err := env.Dynamic.Resource(widgets).Namespace(ns).Get(t.Context(), "fast", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		_, done, _ := unstructured.NestedFieldNoCopy(fast.Object, "status", "made")
		return done, "waiting for the fast object to be handled"
	})
	slow := get(t, widgets, ns, "slow")
	if _, done, _ := unstructured.NestedFieldNoCopy(slow.Object, "status", "made"); done {
		t.Errorf("the fast object was handled only after the slow one's 4 s sleep ended")
	}
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		slow := get(t, widgets, ns, "slow")
		_, done, _ := unstructured.NestedFieldNoCopy(slow.Object, "status", "made")
		return done, "waiting for the slow object to be handled after its sleep"
	})
}
