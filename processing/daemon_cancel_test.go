package processing

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/luaop/luaop/processing/causes"
)

// kopf terminates a daemon in stages: its stop flag at once; its cancellation after
// cancellation_backoff (luaop: DaemonLink.Cancelled, which ends the daemon at its
// next blocking call); and cancellation_timeout after that, it gives up on it
// (luaop: its context ends, which interrupts its Lua wherever it is). On the fake
// clock: nothing moves before its time, the finalizer holds until the daemon exits.
func TestStoppedDaemonIsCancelledAfterItsBackoffAndEndedAfterItsTimeout(t *testing.T) {
	h := newFakeHandlers()
	var mu sync.Mutex
	when := map[string]time.Time{}
	var clk func() time.Time
	note := func(what string) {
		mu.Lock()
		defer mu.Unlock()
		if _, seen := when[what]; !seen {
			when[what] = clk()
		}
	}
	seen := func(what string) (time.Time, bool) { mu.Lock(); defer mu.Unlock(); at, ok := when[what]; return at, ok }
	h.addDaemon(causes.Spec{ID: "d", Resource: widgets, CancellationBackoff: 10 * time.Second, CancellationTimeout: 5 * time.Second},
		func(ctx context.Context, call causes.Call) error {
			// A daemon that never ends by itself: it ends with its context.
			note("started")
			<-call.Daemon.Stopped.Done()
			note("stopped")
			<-call.Daemon.Cancelled.Done()
			note("cancelled")
			<-ctx.Done()
			note("ended")
			return ctx.Err()
		})
	e := startEnv(t, h, Options{})
	clk = e.clock.Now
	e.create("w1", nil)
	e.eventually("the daemon runs", func() bool { _, ok := seen("started"); return ok })
	e.eventually("the finalizer is on", func() bool { return len(e.get("w1").GetFinalizers()) == 1 })
	t0 := e.clock.Now()
	e.markDeleting("w1")
	e.eventually("the daemon is stopped", func() bool { _, ok := seen("stopped"); return ok })
	e.clock.Step(10*time.Second - time.Millisecond)
	e.settleIn(widgetsGVR, "w1")
	if _, ok := seen("cancelled"); ok {
		t.Fatal("cancelled before its cancellation_backoff was over")
	}
	e.clock.Step(time.Millisecond)
	e.eventually("the daemon is cancelled", func() bool { _, ok := seen("cancelled"); return ok })
	e.clock.Step(5*time.Second - time.Millisecond)
	e.settleIn(widgetsGVR, "w1")
	if _, ok := seen("ended"); ok {
		t.Fatal("its context ended before its cancellation_timeout (after the backoff) was over")
	}
	if len(e.get("w1").GetFinalizers()) != 1 {
		t.Fatal("the finalizer went while the daemon still runs")
	}
	e.clock.Step(time.Millisecond)
	e.eventually("the daemon ends and the object goes", func() bool { return e.get("w1") == nil || len(e.get("w1").GetFinalizers()) == 0 })
	for what, want := range map[string]time.Duration{"stopped": 0, "cancelled": 10 * time.Second, "ended": 15 * time.Second} {
		if at, _ := seen(what); at.Sub(t0) != want {
			t.Errorf("%s %s after the deletion, want %s", what, at.Sub(t0), want)
		}
	}
}
