package e2e

import (
	"testing"

	"github.com/luaop/luaop/operator"
)

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
