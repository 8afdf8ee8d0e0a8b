package processing

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
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

// kopf, issue 33 7a: a resume half done (one resume handler succeeded, another
// retrying) when the object changes is superseded by the update. The resume handlers
// join it keeping their progress: the one that succeeded does not run again, the
// retrying one keeps its retries and delay; the update handler runs once, and the
// diff-base stored at the end is the new state (no second update on the same change).
func TestResumeHalfDoneIsSupersededByAnUpdateKeepingItsProgress(t *testing.T) {
	h := newFakeHandlers()
	h.add(changeSpec("resume_1", causes.Resume), nil)
	failures := 0
	h.add(changeSpec("resume_2", causes.Resume), func(context.Context, causes.Call) (causes.Result, error) {
		if failures++; failures == 1 {
			return causes.Result{}, &causes.TemporaryError{Message: "not yet", Delay: time.Minute}
		}
		return causes.Result{}, nil
	})
	h.add(changeSpec("update_fn", causes.Update), nil)
	obj := handledInAnnotations(t, widgetObject("w1", "uid-w1", map[string]any{"size": int64(1)}), nil)
	e := startEnv(t, h, Options{}, obj)
	e.eventually("resume_1 succeeded and resume_2 failed once", func() bool {
		return len(h.callsOf("resume_1", "w1")) == 1 && len(h.callsOf("resume_2", "w1")) == 1
	})
	e.settleIn(widgetsGVR, "w1")
	e.patch("w1", `{"spec":{"size":2}}`)
	e.eventually("the update handled", func() bool { return len(h.callsOf("update_fn", "w1")) == 1 })
	e.settleIn(widgetsGVR, "w1")
	if n := len(h.callsOf("resume_2", "w1")); n != 1 {
		t.Fatalf("resume_2 ran %d times before its delay was over, want 1 (its retry delay kept)", n)
	}
	e.clock.Step(time.Minute)
	e.eventually("resume_2 retried", func() bool { return len(h.callsOf("resume_2", "w1")) == 2 })
	e.stays("w1", "a handler running again", func() bool {
		return len(h.callsOf("update_fn", "w1")) != 1 || len(h.callsOf("resume_1", "w1")) != 1 || len(h.callsOf("resume_2", "w1")) != 2
	})
	if calls := h.callsOf("resume_2", "w1"); calls[1].retry != 1 {
		t.Errorf("resume_2's retry after the update is attempt %d, want 1 (its progress kept)", calls[1].retry)
	}
	base, _, _ := state.NewAnnotationsDiffBase("luaop.dev").Fetch(e.get("w1").Object)
	if size := base["spec"].(map[string]any)["size"]; size != int64(2) {
		t.Errorf("the diff-base holds size %v, want the new state's 2", size)
	}
	for _, id := range []string{"resume_1", "resume_2", "update_fn"} {
		if _, left := state.NewAnnotationsProgress("luaop.dev").Fetch(e.get("w1").Object, id); left {
			t.Errorf("the record of %s is left after the cause", id)
		}
	}
}

// kopf, issue 33 7f: a parent whose record is started afresh because its purpose
// changed (a handler of resume and update, its resume superseded by an update) keeps
// the subhandlers its earlier call registered: the cause's end purges their records
// too, even those the new call does not register.
func TestParentStartedAfreshKeepsItsEarlierSubhandlersForThePurge(t *testing.T) {
	h := newFakeHandlers()
	sub := func(id string) causes.Spec { return changeSpec("parent/"+id, causes.Resume, causes.Update) }
	h.add(changeSpec("parent", causes.Resume, causes.Update), func(_ context.Context, call causes.Call) (causes.Result, error) {
		if call.Cause.Reason == causes.Resume {
			return causes.Result{Subhandlers: []causes.Spec{sub("a"), sub("b")}}, nil
		}
		return causes.Result{Subhandlers: []causes.Spec{sub("c")}}, nil
	})
	h.mu.Lock()
	h.fns["parent/b"] = func(context.Context, causes.Call) (causes.Result, error) {
		return causes.Result{}, &causes.TemporaryError{Message: "not yet", Delay: time.Hour}
	}
	cTries := 0
	h.fns["parent/c"] = func(context.Context, causes.Call) (causes.Result, error) {
		if cTries++; cTries == 1 { // the update takes two cycles: the parent's new record is stored between
			return causes.Result{}, &causes.TemporaryError{Message: "not yet", Delay: time.Minute}
		}
		return causes.Result{}, nil
	}
	h.mu.Unlock()
	obj := handledInAnnotations(t, widgetObject("w1", "uid-w1", map[string]any{"size": int64(1)}), nil)
	e := startEnv(t, h, Options{Lifecycle: LifecycleAllAtOnce}, obj)
	progress := state.NewAnnotationsProgress("luaop.dev")
	e.eventually("the resume's children recorded, b retrying", func() bool {
		_, a := progress.Fetch(e.get("w1").Object, "parent/a")
		_, b := progress.Fetch(e.get("w1").Object, "parent/b")
		return a && b
	})
	e.patch("w1", `{"spec":{"size":2}}`)
	e.eventually("c failed once", func() bool { _, c := progress.Fetch(e.get("w1").Object, "parent/c"); return c })
	e.settleIn(widgetsGVR, "w1")
	e.clock.Step(time.Minute)
	e.eventually("the update handled, every record purged", func() bool {
		obj := e.get("w1").Object
		for _, id := range []string{"parent", "parent/a", "parent/b", "parent/c"} {
			if _, left := progress.Fetch(obj, id); left {
				return false
			}
		}
		base, _, _ := state.NewAnnotationsDiffBase("luaop.dev").Fetch(obj)
		return base["spec"].(map[string]any)["size"] == int64(2)
	})
}

// kopf, issue 33 7c: a parent invoked while its subhandlers are pending has made an
// attempt (kopf's HandlerChildrenRetry is an outcome like any other): its ctx.retry
// counts up, and its retries bound how long its subhandlers may take.
func TestParentRetriesCountWhileItsSubhandlersArePending(t *testing.T) {
	h := newFakeHandlers()
	parent := changeSpec("parent", causes.Create)
	parent.Retries = 2
	h.add(parent, func(context.Context, causes.Call) (causes.Result, error) {
		return causes.Result{Subhandlers: []causes.Spec{changeSpec("parent/a", causes.Create)}}, nil
	})
	h.mu.Lock()
	h.fns["parent/a"] = temporaryFailure(time.Second)
	h.mu.Unlock()
	e := startEnv(t, h, Options{})
	e.create("w1", nil)
	e.eventually("the parent failed for good (the cause is done)", func() bool {
		e.clock.Step(time.Second) // the child's retries
		_, done := e.annotations("w1")[state.LastHandledKey("luaop.dev")]
		return done
	})
	var retries []int
	for _, c := range h.callsOf("parent", "w1") {
		retries = append(retries, c.retry)
	}
	if len(retries) != 2 || retries[0] != 0 || retries[1] != 1 {
		t.Errorf("the parent ran with ctx.retry %v, want [0 1]: two attempts, then its retries were spent", retries)
	}
}

// kopf's randomized lifecycle (issue 33 7d): one handler per cycle, chosen at random;
// each runs once, every one on a body of its own (the previous one's write).
func TestRandomizedLifecycleRunsOneHandlerPerCycle(t *testing.T) {
	h := newFakeHandlers()
	var mu sync.Mutex
	seenVersions := map[string]string{}
	for _, id := range []string{"a", "b", "c", "d"} {
		h.add(changeSpec(id, causes.Create), func(_ context.Context, call causes.Call) (causes.Result, error) {
			mu.Lock()
			defer mu.Unlock()
			seenVersions[call.Handler.ID] = call.Cause.Body["metadata"].(map[string]any)["resourceVersion"].(string)
			return causes.Result{Value: "done"}, nil
		})
	}
	e := startEnv(t, h, Options{Lifecycle: LifecycleRandomized})
	e.create("w1", nil)
	e.eventually("the creation handled", func() bool {
		_, done := e.annotations("w1")[state.LastHandledKey("luaop.dev")]
		return done
	})
	e.settleIn(widgetsGVR, "w1")
	versions := map[string]bool{}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range []string{"a", "b", "c", "d"} {
		if n := len(h.callsOf(id, "w1")); n != 1 {
			t.Errorf("%s ran %d times, want 1", id, n)
		}
		versions[seenVersions[id]] = true
	}
	if len(versions) != 4 {
		t.Errorf("the handlers ran on %d bodies, want 4 (one per cycle): %v", len(versions), seenVersions)
	}
}

// kopf's settings.execution.default_backoff (issue 33, 5): the delay after an
// arbitrary error for handlers that set no backoff of their own; one that sets its
// own keeps it.
func TestDefaultBackoffIsTheOperatorsSetting(t *testing.T) {
	h := newFakeHandlers()
	failing := func(context.Context, causes.Call) (causes.Result, error) { return causes.Result{}, errBoom }
	h.add(changeSpec("own", causes.Create), failing) // the harness gives it a backoff of 1 minute
	h.mu.Lock()
	h.specs = append(h.specs, changeSpec("default", causes.Create)) // no backoff: the operator's
	h.fns["default"] = failing
	h.mu.Unlock()
	e := startEnv(t, h, Options{DefaultBackoff: 5 * time.Second, Lifecycle: LifecycleAllAtOnce})
	e.create("w1", nil)
	e.eventually("both failed once", func() bool { return len(h.callsOf("own", "w1")) == 1 && len(h.callsOf("default", "w1")) == 1 })
	e.settleIn(widgetsGVR, "w1")
	e.clock.Step(5 * time.Second)
	e.eventually("the handler without a backoff retried after the default, 5 s", func() bool { return len(h.callsOf("default", "w1")) == 2 })
	e.stays("w1", "the handler with its own backoff retried before it", func() bool { return len(h.callsOf("own", "w1")) != 1 })
}
