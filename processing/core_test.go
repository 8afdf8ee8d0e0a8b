package processing

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

func TestCreateHandlerRunsOnceAndStoresItsResultAndDiffBase(t *testing.T) {
	h := newFakeHandlers()
	h.add(changeSpec("create_fn", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		call.Patch.Set([]string{"status", "phase"}, "Ready")
		return causes.Result{Value: map[string]any{"message": "hello"}}, nil
	})
	e := startEnv(t, h, Options{})
	e.create("w1", map[string]any{"size": int64(1)})
	e.eventually("the result in status and the diff-base stored", func() bool {
		u := e.get("w1")
		phase, _, _ := unstructured.NestedString(u.Object, "status", "phase")
		msg, _, _ := unstructured.NestedString(u.Object, "status", "create_fn", "message")
		_, stored := u.GetAnnotations()["luaop.dev/last-handled-configuration"]
		return phase == "Ready" && msg == "hello" && stored
	})
	e.clock.Step(6 * time.Second) // past the consistency timeout: a late repeat would show now
	e.stays("w1", "the create handler running twice", func() bool { return len(h.callsOf("create_fn", "w1")) > 1 })
	if !e.op.Synced() {
		t.Errorf("not synced after every object was handled")
	}
}

func TestUpdateHandlerGetsOldAndNewAndFieldHandlerItsField(t *testing.T) {
	h := newFakeHandlers()
	h.add(changeSpec("update_fn", causes.Update), nil)
	field := changeSpec("size_fn", causes.Create, causes.Update)
	field.Field = []string{"spec", "size"}
	h.add(field, nil)
	e := startEnv(t, h, Options{})
	e.create("w1", map[string]any{"size": int64(1), "color": "red"})
	e.eventually("the creation handled", func() bool {
		_, ok := e.annotations("w1")["luaop.dev/last-handled-configuration"]
		return ok && len(h.callsOf("size_fn", "w1")) == 1
	})
	e.patch("w1", `{"spec":{"color":"blue"}}`)
	e.eventually("the update handler ran", func() bool { return len(h.callsOf("update_fn", "w1")) == 1 })
	e.patch("w1", `{"spec":{"size":2}}`)
	e.eventually("the field handler ran for size", func() bool { return len(h.callsOf("size_fn", "w1")) == 2 })
	got := h.callsOf("size_fn", "w1")[1]
	if fmt.Sprint(got.old) != "1" || fmt.Sprint(got.new) != "2" {
		t.Errorf("field handler got old=%v new=%v, want 1 -> 2", got.old, got.new)
	}
	if n := len(h.callsOf("size_fn", "w1")); n != 2 {
		t.Errorf("the field handler ran %d times; the color change is not its field", n)
	}
}

func TestTemporaryErrorRetriesAfterItsDelayOnTheClock(t *testing.T) {
	h := newFakeHandlers()
	var attempts atomic.Int32
	h.add(changeSpec("flaky", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		if attempts.Add(1) == 1 {
			call.Patch.Set([]string{"status", "phase"}, "Waiting")
			return causes.Result{}, &causes.TemporaryError{Message: "not yet", Delay: 30 * time.Second}
		}
		return causes.Result{}, nil
	})
	e := startEnv(t, h, Options{})
	e.create("w1", map[string]any{"size": int64(1)})
	e.eventually("the retry recorded in the progress annotation", func() bool {
		rec, ok := state.NewAnnotationsProgress("luaop.dev").Fetch(e.get("w1").Object, "flaky")
		return ok && rec.Retries == 1 && rec.Delayed != nil
	})
	e.stays("w1", "a retry before the delay passed", func() bool { return attempts.Load() > 1 })
	e.clock.Step(31 * time.Second)
	e.eventually("the retry ran and the cause finished", func() bool {
		_, ok := e.annotations("w1")["luaop.dev/last-handled-configuration"]
		return attempts.Load() == 2 && ok
	})
	if got := h.callsOf("flaky", "w1")[1].retry; got != 1 {
		t.Errorf("second attempt saw retry=%d, want 1", got)
	}
	if _, ok := state.NewAnnotationsProgress("luaop.dev").Fetch(e.get("w1").Object, "flaky"); ok {
		t.Errorf("the progress record was not purged when the cause finished")
	}
}

func TestDeletionHoldsTheFinalizerUntilTheDeleteHandlerSucceeded(t *testing.T) {
	h := newFakeHandlers()
	h.add(changeSpec("cleanup", causes.Delete), nil)
	e := startEnv(t, h, Options{})
	e.create("w1", map[string]any{"size": int64(1)})
	e.eventually("the finalizer added", func() bool { return slices.Contains(e.get("w1").GetFinalizers(), "luaop.dev/finalizer") })
	e.markDeleting("w1")
	e.eventually("the delete handler ran and released the finalizer", func() bool {
		return len(h.callsOf("cleanup", "w1")) == 1 && len(e.get("w1").GetFinalizers()) == 0
	})
	e.delete("w1")
	e.eventually("the object forgotten", func() bool { return e.op.objects.get(objectKey{widgets, "default", "w1"}) == nil })
}

func TestRawEventHandlersSeeEveryEventInOrder(t *testing.T) {
	h := newFakeHandlers()
	h.add(causes.Spec{ID: "spy", Kind: causes.KindEvent, Resource: widgets}, nil)
	e := startEnv(t, h, Options{})
	e.create("w1", map[string]any{"size": int64(1)})
	e.eventually("ADDED seen", func() bool { return len(h.callsOf("spy", "w1")) == 1 })
	e.patch("w1", `{"spec":{"size":2}}`)
	e.eventually("MODIFIED seen", func() bool { return len(h.callsOf("spy", "w1")) == 2 })
	e.delete("w1")
	e.eventually("DELETED seen", func() bool { return len(h.callsOf("spy", "w1")) == 3 })
	var types []string
	for _, c := range h.callsOf("spy", "w1") {
		types = append(types, c.eventType)
	}
	if fmt.Sprint(types) != "[ADDED MODIFIED DELETED]" {
		t.Errorf("event handler saw %v", types)
	}
}

// Defect 11.1: the core called the runtime's Forget (a shard lock) while holding its
// own lock, while a daemon held its shard and read its body (the core's lock): a
// deadlock. Here daemons read their body under the fake shard lock in a tight loop
// while their objects are deleted and re-created; the test fails on a timeout.
func TestNoDeadlockWhenObjectsAreRecreatedWhileTheirDaemonsReadTheirBody(t *testing.T) {
	h := newFakeHandlers()
	h.addDaemon(causes.Spec{ID: "monitor", Resource: widgets}, func(ctx context.Context, call causes.Call) error {
		for {
			h.shard.Lock()
			body := call.Daemon.Latest() // ctx.spec of a Lua daemon: under its shard's lock
			h.shard.Unlock()
			if body == nil {
				return nil
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-call.Daemon.Stopped.Done():
				return nil
			case <-time.After(time.Millisecond):
			}
		}
	})
	e := startEnv(t, h, Options{})
	// Paced on the informer: after each round, a barrier on the round's last object
	// waits for a cycle past it. The fake watch buffers 100 events and panics beyond
	// ("channel full"); unpaced, a writer far ahead of a starved informer (a loaded
	// machine) overflowed it. A deadlock shows as a barrier never passed.
	for round := 0; round < 30; round++ {
		for i := 0; i < 5; i++ {
			name := fmt.Sprintf("w%d", i)
			if round > 0 {
				e.delete(name)
			}
			e.create(name, map[string]any{"round": int64(round)})
		}
		time.Sleep(2 * time.Millisecond)
		e.settleIn(widgetsGVR, "w4")
	}
	e.eventually("one daemon per live object", func() bool { return e.op.daemons.count() == 5 })
}

// Defect 11.3: an object deleted and re-created under the same name before its
// worker ran kept its old daemon (running against the new object), leaked the
// readiness counters and the index entries, and never forgot the old memo.
func TestObjectRecreatedBeforeItsWorkerRanGoesThroughTheForgetPath(t *testing.T) {
	h := newFakeHandlers()
	release := make(chan struct{})
	var blocked atomic.Bool
	h.add(changeSpec("slow_create", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		if blocked.CompareAndSwap(false, true) {
			<-release // hold the object's worker while it is deleted and re-created
		}
		return causes.Result{}, nil
	})
	h.add(causes.Spec{ID: "by_size", Kind: causes.KindIndex, Resource: widgets}, func(ctx context.Context, call causes.Call) (causes.Result, error) {
		meta := call.Cause.Body["metadata"].(map[string]any)
		return causes.Result{Value: map[string]any{"uid": meta["uid"]}}, nil
	})
	var daemonsMu sync.Mutex
	daemonUIDs := map[string]string{} // uid -> "running" / "ended"
	h.addDaemon(causes.Spec{ID: "monitor", Resource: widgets}, func(ctx context.Context, call causes.Call) error {
		uid := call.Daemon.UID
		daemonsMu.Lock()
		daemonUIDs[uid] = "running"
		daemonsMu.Unlock()
		defer func() { daemonsMu.Lock(); daemonUIDs[uid] = "ended"; daemonsMu.Unlock() }()
		select {
		case <-ctx.Done():
		case <-call.Daemon.Stopped.Done():
		}
		return nil
	})
	first := widgetObject("w1", "uid-first", map[string]any{"size": int64(1)})
	e := startEnv(t, h, Options{}, first)
	e.eventually("the worker holds the first incarnation", func() bool { return blocked.Load() })
	e.delete("w1")
	second := e.create("w1", map[string]any{"size": int64(2)})
	close(release)

	e.eventually("the new incarnation handled, its daemon running, the old one ended", func() bool {
		daemonsMu.Lock()
		defer daemonsMu.Unlock()
		return daemonUIDs["uid-first"] == "ended" && daemonUIDs[second] == "running" &&
			len(h.callsOf("slow_create", "w1")) == 2
	})
	e.eventually("the old memo forgotten", func() bool { return slices.Contains(h.forgottenUIDs(), "uid-first") })
	if slices.Contains(h.forgottenUIDs(), second) {
		t.Errorf("the new incarnation's memo was forgotten")
	}
	entries, _ := e.op.indexes.Lookup("by_size")
	var uids []string
	for _, vs := range entries["uid"] {
		uids = append(uids, fmt.Sprint(vs))
	}
	if fmt.Sprint(uids) != "["+second+"]" {
		t.Errorf("index holds %v, want only the new incarnation %s", uids, second)
	}
	e.eventually("ready, nothing left pending", func() bool {
		initial, unindexed := e.op.ready.pending()
		return e.op.Synced() && initial == 0 && unindexed == 0
	})
	if n := e.op.daemons.count(); n != 1 {
		t.Errorf("%d daemons running for one live object", n)
	}
	// With an index registered, change handlers must not wait for indexing forever.
	e.patch("w1", `{"spec":{"size":3}}`)
	h.add(changeSpec("late_update", causes.Update), nil)
	e.op.Refresh()
	e.patch("w1", `{"spec":{"size":4}}`)
	e.eventually("an update handled after the churn", func() bool { return len(h.callsOf("late_update", "w1")) >= 1 })
}

// Defect 11.4: "v1/cm" in one script and "v1/configmaps" in another made two
// informers and two queue keys for one object, breaking one worker per object.
func TestTwoSpellingsOfOneResourceShareOneWatcherAndOneWorker(t *testing.T) {
	h := newFakeHandlers()
	slow := func(ctx context.Context, call causes.Call) (causes.Result, error) {
		time.Sleep(20 * time.Millisecond) // long enough for an overlap to show
		return causes.Result{}, nil
	}
	h.add(causes.Spec{ID: "by_short_name", Kind: causes.KindChange, Resource: causes.Resource{GroupVersionResource: configmapsGVR.GroupVersion().WithResource("cm")}, Reasons: []causes.Reason{causes.Create}}, slow)
	h.add(causes.Spec{ID: "by_plural", Kind: causes.KindChange, Resource: causes.Resource{GroupVersionResource: configmapsGVR}, Reasons: []causes.Reason{causes.Create}}, slow)
	h.add(causes.Spec{ID: "by_kind", Kind: causes.KindEvent, Resource: causes.Resource{GroupVersionResource: configmapsGVR.GroupVersion().WithResource("ConfigMap")}}, nil)
	e := startEnv(t, h, Options{Workers: 8})
	cm := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "c1", "namespace": "default", "uid": "uid-c1"}, "data": map[string]any{"a": "b"}}}
	if _, err := e.dyn.Resource(configmapsGVR).Namespace("default").Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("both handlers ran once", func() bool {
		return len(h.callsOf("by_short_name", "c1")) == 1 && len(h.callsOf("by_plural", "c1")) == 1
	})
	e.staysIn(configmapsGVR, "c1", "a handler running twice", func() bool {
		return len(h.callsOf("by_short_name", "c1")) > 1 || len(h.callsOf("by_plural", "c1")) > 1
	})
	var added int
	for _, c := range h.callsOf("by_kind", "c1") {
		if c.eventType == "ADDED" {
			added++
		}
	}
	if added != 1 {
		t.Errorf("the event handler saw ADDED %d times", added)
	}
	h.mu.Lock()
	overlap := h.overlap
	h.mu.Unlock()
	if len(overlap) > 0 {
		t.Errorf("handlers of one object ran at the same time: %v", overlap)
	}
	watchers, _ := e.op.watchersSnapshot()
	if len(watchers) != 1 {
		t.Errorf("%d watchers for one resource spelled three ways", len(watchers))
	}
	if n := e.op.objects.len(); n != 1 {
		t.Errorf("%d keys for one object", n)
	}
}

// A slow handler of one object never delays another object (different workers).
func TestSlowHandlerOfOneObjectDoesNotDelayAnother(t *testing.T) {
	h := newFakeHandlers()
	release := make(chan struct{})
	h.add(changeSpec("create_fn", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		if call.Cause.Body["metadata"].(map[string]any)["name"] == "slow" {
			<-release
		}
		return causes.Result{}, nil
	})
	e := startEnv(t, h, Options{})
	e.create("slow", nil)
	e.eventually("the slow handler started", func() bool { return len(h.callsOf("create_fn", "slow")) == 1 })
	e.create("fast", nil)
	e.eventually("the fast object handled while the slow one waits", func() bool {
		_, ok := e.annotations("fast")["luaop.dev/last-handled-configuration"]
		return ok
	})
	close(release)
}

func TestDaemonPatchIsAppliedByTheObjectsWorker(t *testing.T) {
	h := newFakeHandlers()
	h.addDaemon(causes.Spec{ID: "reporter", Resource: widgets}, func(ctx context.Context, call causes.Call) error {
		call.Daemon.Flush(map[string]any{"status": map[string]any{"seen": call.Daemon.Latest()["spec"].(map[string]any)["size"]}})
		<-call.Daemon.Stopped.Done()
		return nil
	})
	e := startEnv(t, h, Options{})
	e.create("w1", map[string]any{"size": int64(7)})
	e.eventually("the daemon's patch applied", func() bool {
		v, _, _ := unstructured.NestedFieldNoCopy(e.get("w1").Object, "status", "seen")
		return fmt.Sprint(v) == "7"
	})
	e.eventually("the finalizer held for the daemon", func() bool {
		return slices.Contains(e.get("w1").GetFinalizers(), "luaop.dev/finalizer")
	})
	e.markDeleting("w1")
	e.eventually("the daemon stopped and the finalizer released", func() bool {
		return e.op.daemons.count() == 0 && len(e.get("w1").GetFinalizers()) == 0
	})
}

func TestTimerRunsOnItsIntervalOnTheClock(t *testing.T) {
	h := newFakeHandlers()
	h.add(causes.Spec{ID: "tick", Kind: causes.KindTimer, Resource: widgets, Interval: 10 * time.Second}, func(ctx context.Context, call causes.Call) (causes.Result, error) {
		return causes.Result{Value: "ticked"}, nil
	})
	e := startEnv(t, h, Options{})
	e.create("w1", nil)
	e.eventually("the first tick", func() bool { return len(h.callsOf("tick", "w1")) == 1 })
	e.stays("w1", "a tick before the interval", func() bool { return len(h.callsOf("tick", "w1")) > 1 })
	e.clock.Step(10 * time.Second)
	e.eventually("the second tick after the interval", func() bool { return len(h.callsOf("tick", "w1")) == 2 })
	v, _, _ := unstructured.NestedString(e.get("w1").Object, "status", "tick")
	if v != "ticked" {
		t.Errorf("the timer's result is not in status: %q", v)
	}
}

// A reload that shortens a timer's interval takes effect at once: the timer starts
// over with its new schedule instead of waiting out the old interval.
func TestTimerRescheduledWhenAReloadChangesItsInterval(t *testing.T) {
	h := newFakeHandlers()
	h.add(causes.Spec{ID: "tick", Kind: causes.KindTimer, Resource: widgets, Interval: time.Hour, CodeHash: "v1", EvalHash: "v1"}, nil)
	e := startEnv(t, h, Options{})
	e.create("w1", nil)
	e.eventually("the first tick", func() bool { return len(h.callsOf("tick", "w1")) == 1 })
	e.settleIn(widgetsGVR, "w1")
	h.edit("tick", func(s *causes.Spec) { s.Interval, s.CodeHash, s.EvalHash = 10*time.Second, "v2", "v2" })
	e.op.Refresh()
	e.eventually("a tick within the new interval", func() bool {
		e.clock.Step(10 * time.Second)
		return len(h.callsOf("tick", "w1")) >= 2
	})
	if elapsed := e.clock.Since(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)); elapsed >= time.Hour {
		t.Errorf("the second tick came after %v: the old interval was waited out", elapsed)
	}
}

// Readiness is derived from keys: an object of the initial listing deleted before
// its worker ran does not keep the operator unready forever.
func TestReadinessFollowsTheKeysOfTheInitialListing(t *testing.T) {
	h := newFakeHandlers()
	gate := make(chan struct{})
	h.add(changeSpec("create_fn", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		<-gate
		return causes.Result{}, nil
	})
	var objs []*unstructured.Unstructured
	for i := 0; i < 6; i++ {
		objs = append(objs, widgetObject(fmt.Sprintf("w%d", i), fmt.Sprintf("uid-%d", i), nil))
	}
	e := startEnv(t, h, Options{Workers: 2}, objs...)
	var openGate sync.Once
	t.Cleanup(func() { openGate.Do(func() { close(gate) }) }) // a failed check lets the operator stop
	// The barrier: the listing is in (every watcher synced) and both workers are
	// held in a handler until the gate opens, so no cycle can finish and nothing
	// can make the operator ready before the check.
	e.eventually("the listing in and both workers held in a handler", func() bool {
		watchers, _ := e.op.watchersSnapshot()
		for _, w := range watchers {
			if !w.synced() {
				return false
			}
		}
		return len(watchers) > 0 && len(h.callsOf("create_fn", "")) == 2
	})
	if e.op.Synced() {
		t.Fatal("ready before the initial objects were handled")
	}
	e.delete("w5")
	e.delete("w4")
	openGate.Do(func() { close(gate) })
	e.eventually("ready once every listed object was handled or is gone", e.op.Synced)
}

func TestPanicInTheCoreIsContainedToItsObject(t *testing.T) {
	h := newFakeHandlers()
	h.add(changeSpec("create_fn", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		if call.Cause.Body["metadata"].(map[string]any)["name"] == "bad" {
			panic("a bug")
		}
		return causes.Result{}, nil
	})
	e := startEnv(t, h, Options{})
	e.create("bad", nil)
	e.create("good", nil)
	e.eventually("the good object handled", func() bool {
		_, ok := e.annotations("good")["luaop.dev/last-handled-configuration"]
		return ok
	})
}

// Stopping finishes the cycles in flight only: queued objects are left for the next
// start (a replica that lost its lease must stop handling at once).
func TestShutdownLeavesQueuedObjectsForTheNextStart(t *testing.T) {
	h := newFakeHandlers()
	var stopping atomic.Bool
	var lateStarts atomic.Int32
	h.add(changeSpec("create_fn", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		if stopping.Load() {
			lateStarts.Add(1)
		}
		time.Sleep(50 * time.Millisecond)
		return causes.Result{}, nil
	})
	var objs []*unstructured.Unstructured
	for i := 0; i < 20; i++ {
		objs = append(objs, widgetObject(fmt.Sprintf("w%02d", i), fmt.Sprintf("uid-%d", i), nil))
	}
	e := startEnv(t, h, Options{Workers: 2}, objs...)
	e.eventually("the first handlers started", func() bool { return len(h.callsOf("create_fn", "")) >= 1 })
	stopping.Store(true)
	e.shutdown()
	if n := lateStarts.Load(); n > 2 {
		t.Errorf("%d handlers started after the stop with 2 workers: the queue was drained instead of left", n)
	}
}

// A watch that stays behind the operator's own write past the consistency timeout
// must not make a succeeded handler run again when something else wakes the object:
// a timer (cycles that write nothing) or a daemon's write. kopf handles the stale
// body then and runs the handler a second time; the patch's response is newer than
// anything the watch delivered, so that is the body handled until the watch catches up.
func TestAWatchLatePastTheConsistencyTimeoutRunsNothingTwice(t *testing.T) {
	for _, wake := range []string{"timer", "daemon"} {
		t.Run(wake, func(t *testing.T) {
			var holding atomic.Bool
			holding.Store(true)
			poke := make(chan int)
			h := newFakeHandlers()
			h.add(changeSpec("create_fn", causes.Create), nil)
			h.add(changeSpec("update_fn", causes.Update), nil)
			if wake == "timer" {
				h.add(causes.Spec{ID: "tick", Kind: causes.KindTimer, Resource: widgets, Interval: time.Second}, nil)
			} else {
				h.addDaemon(causes.Spec{ID: "writer", Resource: widgets}, func(ctx context.Context, call causes.Call) error {
					for {
						select {
						case n := <-poke:
							call.Daemon.Flush(map[string]any{"status": map[string]any{"pokes": int64(n)}})
						case <-call.Daemon.Stopped.Done():
							return nil
						}
					}
				})
			}
			e := startEnvWith(t, h, Options{ConsistencyTimeout: 5 * time.Second},
				holdBackWatch(func(u *unstructured.Unstructured) bool {
					_, handled := u.GetAnnotations()["luaop.dev/last-handled-configuration"]
					return holding.Load() && handled // a finalizer's write is delivered
				}))
			e.create("w1", map[string]any{"size": int64(1)})
			e.eventually("the creation handled and written", func() bool {
				_, stored := e.annotations("w1")["luaop.dev/last-handled-configuration"]
				return stored && len(h.callsOf("create_fn", "w1")) == 1
			})
			// The watch never delivers that write; time passes well beyond the timeout
			// while the object is woken again and again.
			for n := 1; wake == "daemon" && n <= 3; n++ {
				e.clock.Step(6 * time.Second)
				poke <- n
				e.eventually("the daemon's write applied", func() bool {
					// The deadline is set when the last write's response arrives, which
					// may be after the step above: keep the clock moving.
					e.clock.Step(time.Second)
					v, _, _ := unstructured.NestedFieldNoCopy(e.get("w1").Object, "status", "pokes")
					return fmt.Sprint(v) == fmt.Sprint(n)
				})
			}
			// No barrier here (stays): the watch never delivers the operator's own
			// write, so the object always waits for it; the clock moves on at every
			// look instead.
			e.never("the create handler running twice", func() bool {
				e.clock.Step(time.Second)
				return len(h.callsOf("create_fn", "w1")) > 1
			})
			if wake == "timer" && len(h.callsOf("tick", "w1")) < 5 {
				t.Fatalf("the timer ran %d times: the object was not woken past the timeout", len(h.callsOf("tick", "w1")))
			}
			if n := len(h.callsOf("update_fn", "w1")); n != 0 {
				t.Fatalf("the update handler ran %d times: the operator's own write was taken for a change", n)
			}
			// The watch catches up; a real change is handled once, as an update.
			holding.Store(false)
			e.patch("w1", `{"spec":{"size":2}}`)
			e.eventually("the update handled", func() bool { return len(h.callsOf("update_fn", "w1")) == 1 })
			e.clock.Step(6 * time.Second)
			e.stays("w1", "a second run of either handler", func() bool {
				return len(h.callsOf("create_fn", "w1")) > 1 || len(h.callsOf("update_fn", "w1")) > 1
			})
		})
	}
}

// cycleCounter counts cycles (reconciles) through the Observer's optional capability.
type cycleCounter struct{ cycles atomic.Int64 }

func (c *cycleCounter) EventReceived(string, string)                    {}
func (c *cycleCounter) PatchSent(string, string, string)                {}
func (c *cycleCounter) ReconcileStarted(string)                         { c.cycles.Add(1) }
func (c *cycleCounter) ReconcileFinished(string, string, time.Duration) {}
func (c *cycleCounter) MaxConcurrentReconciles(string, int)             {}

// A reload gives every object a cycle only when daemons, timers or indexes are (or
// were) registered: they follow the new handlers through it. Change handlers act on
// the next change anyway, so a reload of those alone queues nothing.
func TestRefreshQueuesObjectsOnlyForEngines(t *testing.T) {
	h := newFakeHandlers()
	h.add(changeSpec("create_fn", causes.Create), nil)
	counter := &cycleCounter{}
	qm := &recordingQueueMetrics{}
	e := startEnv(t, h, Options{Observer: counter, QueueMetrics: qm})
	// Refresh queues the objects it gives a cycle before it returns: with the
	// cycles settled (nothing queued), the adds it made are exact, no wait needed.
	queuedBy := func(refresh func()) int {
		before := qm.addsOf(ControllerName(widgets))
		refresh()
		return qm.addsOf(ControllerName(widgets)) - before
	}
	for i := range 5 {
		e.create(fmt.Sprintf("w%d", i), nil)
	}
	e.eventually("every object handled", func() bool { return len(h.callsOf("create_fn", "")) == 5 })
	// settle waits until the cycles of the handlers' own writes settle (no new one
	// for a few polls) and returns their count.
	settle := func() int64 {
		before, quiet := counter.cycles.Load(), 0
		e.eventually("the cycles settled", func() bool {
			time.Sleep(50 * time.Millisecond)
			now := counter.cycles.Load()
			if now != before {
				before, quiet = now, 0
				return false
			}
			quiet++
			return quiet >= 4
		})
		return before
	}
	settle() // nothing queued: what Refresh queues is counted exactly

	h.add(changeSpec("update_fn", causes.Update), nil) // a reload of change handlers only
	if n := queuedBy(e.op.Refresh); n != 0 {
		t.Errorf("a reload of change handlers queued %d objects, want none", n)
	}

	// A reload adding a delete handler: objects that do not change need its
	// finalizer all the same, or their deletion would not wait for it.
	h.add(changeSpec("delete_fn", causes.Delete), nil)
	e.op.Refresh()
	e.eventually("every object got the finalizer the new delete handler needs", func() bool {
		for i := range 5 {
			if u := e.get(fmt.Sprintf("w%d", i)); u == nil || len(u.GetFinalizers()) == 0 {
				return false
			}
		}
		return true
	})
	before := settle()

	var started atomic.Int64
	h.addDaemon(causes.Spec{ID: "watcher", Resource: widgets}, func(ctx context.Context, call causes.Call) error {
		started.Add(1)
		<-call.Daemon.Stopped.Done()
		return nil
	})
	e.op.Refresh()
	e.eventually("the new daemon started on every object", func() bool { return started.Load() == 5 })
	if got := counter.cycles.Load() - before; got < 5 {
		t.Errorf("%d cycles after a reload adding a daemon, want one per object (5)", got)
	}

	// A reload that leaves the daemon as it was (another file saved, lines moved):
	// its specs are equal, so no object needs a cycle and the daemons keep running.
	before = settle() // the daemons' cycles are over
	h.add(changeSpec("update2_fn", causes.Update), nil)
	h.edit("watcher", func(s *causes.Spec) { s.Source = "moved.lua:40" })
	if n := queuedBy(e.op.Refresh); n != 0 {
		t.Errorf("a reload that left the daemons unchanged queued %d objects, want none", n)
	}

	// Its filter edited (EvalHash) but not its code: every object gets a cycle (the
	// filter is evaluated again), the running daemons are kept.
	h.edit("watcher", func(s *causes.Spec) { s.EvalHash = "filter-v2" })
	e.op.Refresh()
	e.eventually("a cycle of every object after the daemon's filter changed", func() bool { return counter.cycles.Load()-before >= 5 })
	if got := started.Load(); got != 5 {
		t.Errorf("%d daemon starts after a reload that changed only its filter, want the 5 running ones kept", got)
	}

	// Its code edited (CodeHash): every daemon restarts with the new code.
	h.edit("watcher", func(s *causes.Spec) { s.CodeHash = "code-v2" })
	e.op.Refresh()
	e.eventually("every daemon restarted with its new code", func() bool { return started.Load() == 10 })
}

// Subhandlers' ids come from data (parent/<item>): their runs are reported with the
// top-level handler's id for metrics (HandlerRun.MetricID), nested ones too, so the
// series stay as many as the handlers.
func TestSubhandlerRunsAreLabelledWithTheTopLevelHandler(t *testing.T) {
	h := newFakeHandlers()
	sub := func(id string) causes.Spec { return changeSpec(id, causes.Create) }
	h.add(changeSpec("parent", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		return causes.Result{Subhandlers: []causes.Spec{sub("parent/item-a"), sub("parent/item-b")}}, nil
	})
	h.mu.Lock()
	h.fns["parent/item-b"] = func(ctx context.Context, call causes.Call) (causes.Result, error) {
		return causes.Result{Subhandlers: []causes.Spec{sub("parent/item-b/deep")}}, nil
	}
	h.mu.Unlock()
	var mu sync.Mutex
	metricIDs := map[string]string{} // handler id -> metric id
	e := startEnv(t, h, Options{OnHandlerRun: func(r HandlerRun) {
		mu.Lock()
		metricIDs[r.HandlerID] = r.MetricID
		mu.Unlock()
	}})
	e.create("w1", map[string]any{"size": int64(1)})
	e.eventually("the parent, its subhandlers and the nested one reported", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(metricIDs) == 4
	})
	mu.Lock()
	defer mu.Unlock()
	for id, metricID := range metricIDs {
		if metricID != "parent" {
			t.Errorf("run of %s reported for metrics as %q, want %q", id, metricID, "parent")
		}
	}
}
