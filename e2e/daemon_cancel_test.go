package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/testcluster"
)

// Issue 33, item 2: a daemon written as kopf's async daemons are, a loop that relies
// on its cancellation, used to spin once stopped (every luaop.sleep returned at
// once): 10,000 log lines and Event posts in the half second before its
// cancellation_timeout. Now the sleep that tells it of its stop returns false once,
// its next blocking call ends it: one more round, and the object goes at once.
func TestStoppedDaemonRelyingOnCancellationDoesNotSpin(t *testing.T) {
	ns := env.Namespace(t)
	op := startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.daemon("examples.luaop.dev/v1/widgets", function(ctx)
			while true do
				ctx.logger.info("tick")
				luaop.sleep(5)
			end
		end, { id = "ticker" })
	`)})
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1}}")
	testcluster.Eventually(t, 10*time.Second, func() (bool, string) {
		return strings.Contains(op.Log.String(), "tick"), "waiting for the daemon's first tick"
	})
	testcluster.Eventually(t, 10*time.Second, func() (bool, string) {
		return len(get(t, widgets, ns, "w").GetFinalizers()) == 1, "waiting for the finalizer (the daemon holds the deletion)"
	})
	before := strings.Count(op.Log.String(), "msg=tick")
	start := time.Now()
	deleteObject(t, ns, "w")
	waitGone(t, widgets, ns, "w")
	took := time.Since(start)
	testcluster.Eventually(t, 10*time.Second, func() (bool, string) {
		return strings.Contains(op.Log.String(), "daemon cancelled"), "waiting for the daemon's cancellation"
	})
	if after := strings.Count(op.Log.String(), "msg=tick") - before; after > 1 {
		t.Errorf("the stopped daemon went round %d times (logged tick %d times after the deletion), want at most once", after, after)
	}
	// Without the fix it was released only by its cancellation_timeout (60 s).
	if took > 30*time.Second {
		t.Errorf("the object went %s after its deletion: the daemon was not ended by its next blocking call", took)
	}
}
