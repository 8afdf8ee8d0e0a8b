package processing

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/luaop/luaop/processing/causes"
)

// patchCounter counts the patches the operator sends (Observer).
type patchCounter struct{ patches atomic.Int64 }

func (c *patchCounter) EventReceived(string, string)     {}
func (c *patchCounter) PatchSent(string, string, string) { c.patches.Add(1) }

func temporaryFailure(delay time.Duration) handlerFunc {
	return func(context.Context, causes.Call) (causes.Result, error) {
		return causes.Result{}, &causes.TemporaryError{Message: "not yet", Delay: delay}
	}
}

// kopf writes a handler's record only when it changed (progression.State.store
// compares it with what the object held). A handler waiting for its delay has an
// unchanged record: the cycles that other events give the object write nothing. (On
// the fake API server, which gives even a patch that changes nothing a new
// resourceVersion, every such write made a new event, so a new cycle: the object
// never settled at GOMAXPROCS=1.)
func TestRecordsOfHandlersWaitingForTheirDelayAreNotWrittenAgain(t *testing.T) {
	h := newFakeHandlers()
	h.add(changeSpec("slow", causes.Create), temporaryFailure(time.Hour))
	h.add(changeSpec("quick", causes.Create), nil)
	counter := &patchCounter{}
	e := startEnv(t, h, Options{Observer: counter})
	e.create("w1", nil)
	e.eventually("both handlers ran", func() bool {
		return len(h.callsOf("slow", "w1")) == 1 && len(h.callsOf("quick", "w1")) == 1
	})
	e.settleIn(widgetsGVR, "w1")
	written := counter.patches.Load()
	for range 3 {
		e.settleIn(widgetsGVR, "w1") // a change outside the essence: an event, a cycle
	}
	if n := counter.patches.Load() - written; n != 0 {
		t.Errorf("%d patches while nothing changed but the test's own status writes: a record written again unchanged", n)
	}
	if n := len(h.callsOf("slow", "w1")); n != 1 {
		t.Errorf("the waiting handler ran %d times before its delay, want 1", n)
	}
}
