package processing

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/luaop/luaop/processing/causes"
)

// fixable is a handler that fails until fixed, as a developer's handler does until
// the fix is saved.
func fixable(fixed *atomic.Bool) handlerFunc {
	return func(ctx context.Context, call causes.Call) (causes.Result, error) {
		if !fixed.Load() {
			return causes.Result{}, errBoom
		}
		return causes.Result{Value: "fixed"}, nil
	}
}

// Issue 45: with RetryOnReload (luaop dev), a change handler waiting in its backoff
// after an error is retried at once when a reload changed its code; without it
// (luaop run), or when the reload left its code as it was, it waits for its backoff.
func TestRetryOnReloadRetriesAHandlerWhoseCodeChanged(t *testing.T) {
	for _, tt := range []struct {
		name          string
		retryOnReload bool
		newCode       string
		atOnce        bool
	}{
		{"dev, code changed", true, "code-v2", true},
		{"dev, code unchanged", true, "code-v1", false},
		{"run, code changed", false, "code-v2", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newFakeHandlers()
			var fixed atomic.Bool
			spec := changeSpec("create_fn", causes.Create)
			spec.CodeHash, spec.Backoff = "code-v1", time.Hour
			h.add(spec, fixable(&fixed))
			e := startEnv(t, h, Options{RetryOnReload: tt.retryOnReload})
			e.create("w1", nil)
			e.eventually("the first attempt", func() bool { return len(h.callsOf("create_fn", "w1")) == 1 })
			e.eventually("the object waiting on its backoff", func() bool {
				s := e.op.Snapshot()
				return len(s.Objects) == 1 && len(s.Objects[0].Handlers) == 1 && s.Objects[0].Handlers[0].State == "waiting"
			})
			fixed.Store(true)
			h.edit("create_fn", func(s *causes.Spec) { s.CodeHash = tt.newCode })
			e.op.Refresh() // what a reload does after the runtime's swap
			if tt.atOnce {
				e.eventually("the retry right after the reload", func() bool { return len(h.callsOf("create_fn", "w1")) == 2 })
				e.eventually("its success stored", func() bool { return e.get("w1").Object["status"] != nil })
				return
			}
			e.stays("w1", "a retry before the backoff", func() bool { return len(h.callsOf("create_fn", "w1")) > 1 })
			e.clock.Step(time.Hour)
			e.eventually("the retry after the backoff", func() bool { return len(h.callsOf("create_fn", "w1")) == 2 })
		})
	}
}

// A subhandler waiting after an error is retried at once when its parent's code
// changed: the parent, waiting for it, runs again and the subhandler with it.
func TestRetryOnReloadReachesSubhandlers(t *testing.T) {
	h := newFakeHandlers()
	var fixed atomic.Bool
	parent := changeSpec("parent", causes.Create)
	parent.CodeHash = "code-v1"
	h.add(parent, func(ctx context.Context, call causes.Call) (causes.Result, error) {
		child := changeSpec("parent/item", causes.Create)
		child.Backoff = time.Hour
		return causes.Result{Subhandlers: []causes.Spec{child}}, nil
	})
	h.mu.Lock()
	h.fns["parent/item"] = fixable(&fixed)
	h.mu.Unlock()
	e := startEnv(t, h, Options{RetryOnReload: true})
	e.create("w1", nil)
	e.eventually("the subhandler's first attempt", func() bool { return len(h.callsOf("parent/item", "w1")) == 1 })
	e.eventually("the parent waiting for it", func() bool {
		s := e.op.Snapshot()
		return len(s.Objects) == 1 && len(s.Objects[0].Handlers) == 1 && s.Objects[0].Handlers[0].State == "waiting"
	})
	fixed.Store(true)
	h.edit("parent", func(s *causes.Spec) { s.CodeHash = "code-v2" })
	e.op.Refresh()
	e.eventually("the subhandler retried right after the reload", func() bool { return len(h.callsOf("parent/item", "w1")) == 2 })
	e.eventually("the cause finished", func() bool { return len(e.op.Snapshot().Objects) == 0 })
}

// A timer waiting in its backoff after an error runs at once when its code changed.
func TestRetryOnReloadRunsATimerWhoseCodeChanged(t *testing.T) {
	h := newFakeHandlers()
	var fixed atomic.Bool
	h.add(causes.Spec{ID: "tick", Kind: causes.KindTimer, Resource: widgets, Interval: time.Hour, Backoff: 30 * time.Minute, CodeHash: "code-v1"}, fixable(&fixed))
	e := startEnv(t, h, Options{RetryOnReload: true})
	e.create("w1", nil)
	e.eventually("the first tick", func() bool { return len(h.callsOf("tick", "w1")) == 1 })
	e.stays("w1", "a retry before the backoff", func() bool { return len(h.callsOf("tick", "w1")) > 1 })
	fixed.Store(true)
	h.edit("tick", func(s *causes.Spec) { s.CodeHash = "code-v2" })
	e.op.Refresh()
	e.eventually("the retry right after the reload", func() bool { return len(h.callsOf("tick", "w1")) == 2 })
	if got := retriesOf(h.callsOf("tick", "w1")); got != "[0 1]" {
		t.Errorf("ctx.retry of the runs: %s, want [0 1]", got)
	}
}
