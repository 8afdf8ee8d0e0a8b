package processing

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/luaop/luaop/processing/causes"
)

// waitingWorkers is how many workers hold a key until Resume.
func (o *Reactor) waitingWorkers() int {
	o.pause.mu.Lock()
	defer o.pause.mu.Unlock()
	return o.pause.waiting
}

// A paused Reactor (kopf's operator pause, driven by peering) takes no new work,
// stops its daemons and starts none, and keeps everything it knows; Resume handles
// what arrived meanwhile, once, and starts the daemons again.
func TestPauseStopsDaemonsAndNewWorkUntilResume(t *testing.T) {
	h := newFakeHandlers()
	h.add(changeSpec("on_create", causes.Create), nil)
	var mu sync.Mutex
	starts := map[string]int{}
	h.addDaemon(causes.Spec{ID: "monitor", Resource: widgets}, func(ctx context.Context, call causes.Call) error {
		mu.Lock()
		starts[call.Daemon.Name]++
		mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-call.Daemon.Stopped.Done():
			return nil
		}
	})
	e := startEnv(t, h, Options{})
	e.create("w1", map[string]any{"size": int64(1)})
	e.eventually("w1 created and its daemon running", func() bool {
		return len(h.callsOf("on_create", "w1")) == 1 && e.op.daemons.count() == 1
	})

	if err := e.op.Pause(t.Context(), "paused in favour of a test"); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if n := e.op.daemons.count(); n != 0 {
		t.Fatalf("%d daemon(s) still running after Pause returned", n)
	}
	if got := e.op.Snapshot().Paused; got != "paused in favour of a test" {
		t.Errorf("Snapshot().Paused = %q", got)
	}
	// New work arrives: the informer records it and a worker takes its key, but
	// holds it: no handler runs and no daemon starts.
	e.create("w2", map[string]any{"size": int64(2)})
	e.eventually("a worker holding w2's key while paused", func() bool { return e.op.waitingWorkers() >= 1 })
	if n := len(h.callsOf("on_create", "w2")); n != 0 {
		t.Fatalf("on_create ran %d time(s) on w2 while paused", n)
	}
	if n := e.op.daemons.count(); n != 0 {
		t.Fatalf("%d daemon(s) started while paused", n)
	}

	e.op.Resume()
	if paused, _ := e.op.Paused(); paused {
		t.Fatal("still paused after Resume")
	}
	e.settleIn(widgetsGVR, "w2")
	e.settleIn(widgetsGVR, "w1")
	e.eventually("both daemons running again", func() bool { return e.op.daemons.count() == 2 })
	if n := len(h.callsOf("on_create", "w2")); n != 1 {
		t.Errorf("on_create ran %d time(s) on w2 after Resume, want 1", n)
	}
	if n := len(h.callsOf("on_create", "w1")); n != 1 {
		t.Errorf("on_create ran %d time(s) on w1 in all, want 1 (its state is kept across the pause)", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if starts["w1"] != 2 || starts["w2"] != 1 {
		t.Errorf("daemon starts = %v, want w1: 2 (before and after the pause), w2: 1", starts)
	}
}

// Pause returns only once the cycle in flight has ended (its patch written): only
// then may another operator start on the same objects.
func TestPauseWaitsForTheCycleInFlight(t *testing.T) {
	h := newFakeHandlers()
	release := make(chan struct{})
	var running atomic.Bool
	h.add(changeSpec("slow", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		running.Store(true)
		<-release
		return causes.Result{Value: "done"}, nil
	})
	e := startEnv(t, h, Options{})
	e.create("w1", nil)
	e.eventually("the handler running", running.Load)

	paused := make(chan error, 1)
	go func() { paused <- e.op.Pause(t.Context(), "test") }()
	// Pause is under way (the gate is closed) while the handler still runs.
	e.eventually("the Reactor paused", func() bool { p, _ := e.op.Paused(); return p })
	select {
	case err := <-paused:
		t.Fatalf("Pause returned (%v) while a cycle was in flight", err)
	default:
	}
	close(release)
	select {
	case err := <-paused:
		if err != nil {
			t.Fatalf("Pause: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Pause did not return after the cycle ended")
	}
	if _, done := e.annotations("w1")["luaop.dev/last-handled-configuration"]; !done {
		t.Errorf("the cycle in flight did not write its patch before Pause returned: %v", e.annotations("w1"))
	}
	e.op.Resume()
}

// Pause with a context that ends first returns its error; the Reactor stays paused.
func TestPauseGivesUpWithItsContext(t *testing.T) {
	h := newFakeHandlers()
	release := make(chan struct{})
	defer close(release)
	var running atomic.Bool
	h.add(changeSpec("stuck", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		running.Store(true)
		<-release
		return causes.Result{}, nil
	})
	e := startEnv(t, h, Options{})
	e.create("w1", nil)
	e.eventually("the handler running", running.Load)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := e.op.Pause(ctx, "test"); err == nil {
		t.Fatal("Pause returned nil with a cycle in flight and its context done")
	}
	if p, _ := e.op.Paused(); !p {
		t.Fatal("not paused")
	}
}

// The gate is on every worker cycle: its cost, one worker and all of them at once.
func BenchmarkPauseGate(b *testing.B) {
	b.Run("serial", func(b *testing.B) {
		var g pauseGate
		for b.Loop() {
			g.enter()
			g.leave()
		}
	})
	b.Run("parallel", func(b *testing.B) {
		var g pauseGate
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				g.enter()
				g.leave()
			}
		})
	})
}

// Pause and Resume called at once (Pause allows a Resume meanwhile) leave the gate
// and the daemon registry agreeing: a registry left paused by a Pause that ran
// past a Resume starts no daemon while the Reactor works again.
func TestPauseAndResumeAtOnceAgree(t *testing.T) {
	e := startEnv(t, newFakeHandlers(), Options{})
	for i := range 2000 {
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); _ = e.op.Pause(t.Context(), "test") }()
		go func() { defer wg.Done(); e.op.Resume() }()
		wg.Wait()
		gate, _ := e.op.Paused()
		e.op.daemons.mu.Lock()
		registry := e.op.daemons.paused
		e.op.daemons.mu.Unlock()
		if gate != registry {
			t.Fatalf("round %d: the gate is paused=%v, the daemon registry paused=%v", i, gate, registry)
		}
		e.op.Resume()
	}
}

// The events of a pause are the working peer's (kopf stops its watch streams while
// paused): a paused Reactor keeps none for its raw event handlers, which would
// otherwise run at Resume for every event the peer handled meanwhile (and keep
// every body of a long pause in memory).
func TestPausedReactorKeepsNoRawEventsForAfterTheResume(t *testing.T) {
	h := newFakeHandlers()
	h.add(causes.Spec{ID: "spy", Kind: causes.KindEvent, Resource: widgets}, nil)
	e := startEnv(t, h, Options{})
	e.create("w1", map[string]any{"size": int64(1)})
	e.eventually("ADDED seen", func() bool { return len(h.callsOf("spy", "w1")) == 1 })

	if err := e.op.Pause(t.Context(), "paused in favour of a test"); err != nil {
		t.Fatal(err)
	}
	e.patch("w1", `{"spec":{"size":2}}`)
	e.patch("w1", `{"spec":{"size":3}}`)
	rv := e.get("w1").GetResourceVersion()
	e.eventually("both changes delivered to the paused Reactor", func() bool {
		st := e.op.objects.get(objectKey{widgets, "default", "w1"})
		st.inbox.mu.Lock()
		defer st.inbox.mu.Unlock()
		return st.inbox.lastSeenVersion == rv
	})
	e.op.Resume()
	e.settleIn(widgetsGVR, "w1")
	var seen []string
	for _, c := range h.callsOf("spy", "w1") {
		seen = append(seen, c.eventType)
	}
	// ADDED before the pause, MODIFIED: the barrier's, after it.
	if fmt.Sprint(seen) != "[ADDED MODIFIED]" {
		t.Errorf("the event handler saw %v, want [ADDED MODIFIED]: the events of the pause were handed to it at Resume", seen)
	}
}
