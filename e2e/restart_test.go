package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/testcluster"
)

const twoStepScript = `
	local luaop = require("luaop")
	luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx)
		ctx.logger.info("first ran")
		return "done"
	end, { id = "first" })
	luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx)
		ctx.logger.info("second attempt", ctx.retry)
		if ctx.retry == 0 then error(luaop.temporary_error("later", 1.5)) end
		return "done"
	end, { id = "second" })
	luaop.on.resume("examples.luaop.dev/v1/widgets", function(ctx)
		ctx.logger.info("resumed", ctx.name)
	end, { id = "resumer" })
`

// An operator stopped midway resumes from the progress stored on the object: a
// succeeded handler is not run again, a pending one runs when its delay is over.
func TestRestartMidwayResumesProgress(t *testing.T) {
	ns := env.Namespace(t)
	first := startWith(t, ns, operator.Options{Scripts: script(twoStepScript)})
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1}}")
	testcluster.Eventually(t, 10*time.Second, func() (bool, string) {
		rec, _ := progressOf(get(t, widgets, ns, "w"), "second")
		return strings.Contains(rec, `"retries":1`), "waiting for the second handler's first failure to be stored: " + rec
	})
	if err := first.Stop(); err != nil {
		t.Fatalf("stopping the first operator: %v", err)
	}

	second := startWith(t, ns, operator.Options{Scripts: script(twoStepScript)})
	waitField(t, widgets, ns, "w", "status.second", "done")
	logs := second.Log.String()
	if strings.Contains(logs, "first ran") {
		t.Errorf("the succeeded handler ran again after the restart:\n%s", logs)
	}
	if !strings.Contains(logs, "second attempt 1") {
		t.Errorf("the pending handler did not resume with retry 1:\n%s", logs)
	}
	// kopf never mixes resume handlers into a creation, not even one resumed after a
	// restart (issue 12.7): the unfinished cause here is the creation.
	if n := strings.Count(logs, "resumed w"); n != 0 {
		t.Errorf("the resume handler ran %d times with the resumed creation, want none (kopf):\n%s", n, logs)
	}
}

// Objects fully handled before a restart get a resume cause, once, and no creation.
func TestResumeAfterRestartRunsOnceAndNoCreate(t *testing.T) {
	ns := env.Namespace(t)
	first := startWith(t, ns, operator.Options{Scripts: script(twoStepScript)})
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1}}")
	waitField(t, widgets, ns, "w", "status.second", "done")
	if err := first.Stop(); err != nil {
		t.Fatal(err)
	}
	second := startWith(t, ns, operator.Options{Scripts: script(twoStepScript)})
	testcluster.Eventually(t, 10*time.Second, func() (bool, string) {
		return strings.Contains(second.Log.String(), "resumed w"), "waiting for the resume handler"
	})
	mergePatch(t, widgets, ns, "w", `{"metadata":{"labels":{"touched":"yes"}}}`)
	waitHandled(t, widgets, ns, "w", `{"metadata":{"labels":{"touched":"yes"}},"spec":{"size":1}}`)
	logs := second.Log.String()
	if n := strings.Count(logs, "resumed w"); n != 1 {
		t.Errorf("resume ran %d times, want once", n)
	}
	if strings.Contains(logs, "first ran") || strings.Contains(logs, "second attempt") {
		t.Errorf("create handlers ran again after the restart:\n%s", logs)
	}
}

// A burst of quick updates to one object: every handler run sees a body at least as
// new as the previous run's (never older than the operator's own last patch), and
// the final state is handled.
func TestBurstOfUpdatesNeverSeesStaleBodies(t *testing.T) {
	ns := env.Namespace(t)
	op := startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.on.update("examples.luaop.dev/v1/widgets", function(ctx)
			local rv = tonumber(ctx.meta.resourceVersion)
			local c = ctx.spec.counter
			if ctx.memo.rv and rv <= ctx.memo.rv then
				ctx.logger.error("STALE body", rv, "after", ctx.memo.rv)
			end
			if ctx.memo.counter and c < ctx.memo.counter then
				ctx.logger.error("STALE counter", c, "after", ctx.memo.counter)
			end
			ctx.memo.rv, ctx.memo.counter = rv, c
			ctx.memo.runs = (ctx.memo.runs or 0) + 1
			return { counter = c, runs = ctx.memo.runs }
		end, { id = "upd" })
	`)})
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {counter: 0}}")
	waitHandled(t, widgets, ns, "w", `{"spec":{"counter":0}}`)
	for i := 1; i <= 200; i++ {
		mergePatch(t, widgets, ns, "w", fmt.Sprintf(`{"spec":{"counter":%d}}`, i))
	}
	obj := waitField(t, widgets, ns, "w", "status.upd.counter", int64(200))
	if logs := op.Log.String(); strings.Contains(logs, "STALE") {
		t.Errorf("a handler ran on a stale body:\n%s", logs)
	}
	runs := obj.Object["status"].(map[string]any)["upd"].(map[string]any)["runs"]
	t.Logf("200 updates handled in %v handler runs", runs)
}
