package processing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/luaop/luaop/processing/causes"
)

func retriesOf(calls []callRecord) string {
	var out []int
	for _, c := range calls {
		out = append(out, c.retry)
	}
	return fmt.Sprint(out)
}

func failing(err error) handlerFunc {
	return func(ctx context.Context, call causes.Call) (causes.Result, error) { return causes.Result{}, err }
}

// Issue 12.11: a failed timer ran again only at its next interval; kopf retries it
// after the handler's backoff, with ctx.retry counting the failures (0 after a
// success).
func TestTimerErrorRetriesAfterItsBackoffNotItsInterval(t *testing.T) {
	h := newFakeHandlers()
	n := 0
	h.add(causes.Spec{ID: "tick", Kind: causes.KindTimer, Resource: widgets, Interval: 10 * time.Second, Backoff: 3 * time.Second},
		func(ctx context.Context, call causes.Call) (causes.Result, error) {
			n++ // one object, one worker: never concurrent
			if n == 1 {
				return causes.Result{}, errBoom
			}
			return causes.Result{}, nil
		})
	e := startEnv(t, h, Options{})
	e.create("w1", nil)
	e.eventually("the first tick", func() bool { return len(h.callsOf("tick", "w1")) == 1 })
	e.stays("w1", "a retry before the backoff", func() bool { return len(h.callsOf("tick", "w1")) > 1 })
	e.clock.Step(3 * time.Second)
	e.eventually("the retry after the backoff", func() bool { return len(h.callsOf("tick", "w1")) == 2 })
	e.stays("w1", "a run before the interval after the success", func() bool { return len(h.callsOf("tick", "w1")) > 2 })
	e.clock.Step(3 * time.Second)
	e.stays("w1", "a run 3 s after the success", func() bool { return len(h.callsOf("tick", "w1")) > 2 })
	e.clock.Step(7 * time.Second)
	e.eventually("the next tick at the interval", func() bool { return len(h.callsOf("tick", "w1")) == 3 })
	if got := retriesOf(h.callsOf("tick", "w1")); got != "[0 1 0]" {
		t.Errorf("ctx.retry of the runs: %s, want [0 1 0]", got)
	}
}

// Issue 12.11: retries, timeout and errors are honoured by timers: a final failure
// waits for the interval, and the retry count starts again from 0.
func TestTimerRetriesTimeoutAndErrorsOptions(t *testing.T) {
	tests := []struct {
		name string
		spec causes.Spec
		err  error
		// steps of the clock (seconds) after the first run, and the runs expected
		// after each.
		steps []int
		runs  []int
		want  string
	}{
		{"retries=2 gives up at the second attempt",
			causes.Spec{Retries: 2}, errBoom, []int{1, 1, 9}, []int{2, 2, 3}, "[0 1 0]"},
		{"timeout=2.5 s gives up when the next attempt would be past it",
			causes.Spec{Timeout: 2500 * time.Millisecond}, errBoom, []int{1, 1, 1, 9}, []int{2, 3, 3, 4}, "[0 1 2 0]"},
		{"errors=permanent waits for the interval",
			causes.Spec{Errors: causes.ErrorsPermanent}, errBoom, []int{1, 9}, []int{1, 2}, "[0 0]"},
		{"errors=ignored counts as a success",
			causes.Spec{Errors: causes.ErrorsIgnored}, errBoom, []int{1, 9}, []int{1, 2}, "[0 0]"},
		{"a TemporaryError retries after its own delay",
			causes.Spec{}, &causes.TemporaryError{Message: "later", Delay: 2 * time.Second}, []int{1, 1}, []int{1, 2}, "[0 1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newFakeHandlers()
			spec := tt.spec
			spec.ID, spec.Kind, spec.Resource = "tick", causes.KindTimer, widgets
			spec.Interval, spec.Backoff = 10*time.Second, time.Second
			h.add(spec, failing(tt.err))
			e := startEnv(t, h, Options{})
			e.create("w1", nil)
			e.eventually("the first run", func() bool { return len(h.callsOf("tick", "w1")) == 1 })
			for i, step := range tt.steps {
				e.stays("w1", "an early run", func() bool { return len(h.callsOf("tick", "w1")) > tt.runs[max(i-1, 0)] && i > 0 })
				e.clock.Step(time.Duration(step) * time.Second)
				want := tt.runs[i]
				e.eventually(fmt.Sprintf("%d runs after step %d", want, i+1), func() bool { return len(h.callsOf("tick", "w1")) >= want })
				e.stays("w1", fmt.Sprintf("more than %d runs after step %d", want, i+1), func() bool { return len(h.callsOf("tick", "w1")) > want })
			}
			if got := retriesOf(h.callsOf("tick", "w1")); got != tt.want {
				t.Errorf("ctx.retry of the runs: %s, want %s", got, tt.want)
			}
		})
	}
}

// Issue 12.11: a timer with idle and no interval runs once the object was idle that
// long, then again only after the next essential change and another idle period.
func TestIdleTimerWithoutIntervalRunsAfterEachQuietPeriod(t *testing.T) {
	h := newFakeHandlers()
	h.add(causes.Spec{ID: "quiet", Kind: causes.KindTimer, Resource: widgets, Idle: 5 * time.Second}, nil)
	e := startEnv(t, h, Options{})
	e.create("w1", map[string]any{"size": int64(1)})
	e.stays("w1", "a run before the object was idle", func() bool { return len(h.callsOf("quiet", "w1")) > 0 })
	e.clock.Step(5 * time.Second)
	e.eventually("the run after idle seconds", func() bool { return len(h.callsOf("quiet", "w1")) == 1 })
	e.clock.Step(20 * time.Second)
	e.stays("w1", "another run without a change", func() bool { return len(h.callsOf("quiet", "w1")) > 1 })
	e.patch("w1", `{"spec":{"size":2}}`)
	e.stays("w1", "a run right after the change", func() bool { return len(h.callsOf("quiet", "w1")) > 1 })
	e.clock.Step(3 * time.Second)
	e.stays("w1", "a run before idle seconds after the change", func() bool { return len(h.callsOf("quiet", "w1")) > 1 })
	e.clock.Step(2 * time.Second)
	e.eventually("a run idle seconds after the change", func() bool { return len(h.callsOf("quiet", "w1")) == 2 })
}

func daemonCounter(h *fakeHandlers, err error) (func() []int, daemonFunc) {
	var retries []int
	fn := func(ctx context.Context, call causes.Call) error {
		h.mu.Lock()
		retries = append(retries, call.Retry)
		h.mu.Unlock()
		return err
	}
	return func() []int {
		h.mu.Lock()
		defer h.mu.Unlock()
		return append([]int(nil), retries...)
	}, fn
}

// Issue 12.11: daemons honour retries (restarts allowed), timeout (total time) and
// errors (permanent: not restarted; ignored: counts as a success, not restarted).
func TestDaemonRetriesTimeoutAndErrorsOptions(t *testing.T) {
	tests := []struct {
		name string
		spec causes.Spec
		err  error
		runs int // runs in all, the clock stepping by the backoff
		want string
	}{
		{"retries=3 allows three runs", causes.Spec{Retries: 3}, errBoom, 3, "[0 1 2]"},
		{"timeout=5 s bounds the total time", causes.Spec{Timeout: 5 * time.Second}, errBoom, 3, "[0 1 2]"},
		{"errors=permanent is not restarted", causes.Spec{Errors: causes.ErrorsPermanent}, errBoom, 1, "[0]"},
		{"errors=ignored is not restarted", causes.Spec{Errors: causes.ErrorsIgnored}, errBoom, 1, "[0]"},
		{"a PermanentError is not restarted", causes.Spec{}, &causes.PermanentError{Message: "no"}, 1, "[0]"},
		{"errors=temporary restarts", causes.Spec{}, errBoom, 6, "[0 1 2 3 4 5]"},
	}
	for _, tt := range tests {
		for _, onCaller := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/done on the caller's goroutine=%v", tt.name, onCaller), func(t *testing.T) {
				h := newFakeHandlers()
				h.daemonsOnCaller = onCaller
				spec := tt.spec
				spec.ID, spec.Resource, spec.Backoff = "watcher", widgets, 2*time.Second
				runs, fn := daemonCounter(h, tt.err)
				h.addDaemon(spec, fn)
				e := startEnv(t, h, Options{})
				e.create("w1", nil)
				const steps = 6
				for i := 1; i <= steps; i++ {
					if i <= tt.runs {
						e.eventually(fmt.Sprintf("run %d", i), func() bool { return len(runs()) == i })
					}
					// No barrier (stays) here: daemons run and restart in their own
					// goroutines, outside the object's cycles.
					e.never("an early restart", func() bool { return len(runs()) > min(i, tt.runs) })
					if i < steps { // a last step would let one more run race the check below
						e.clock.Step(2 * time.Second)
					}
				}
				if got := fmt.Sprint(runs()); got != tt.want {
					t.Errorf("ctx.retry of the runs: %s, want %s", got, tt.want)
				}
			})
		}
	}
}

// Issue 12.16: an object being deleted stays in the indexes until it is gone (kopf
// keeps it until the DELETED event).
func TestDeletingObjectStaysInTheIndexUntilItIsGone(t *testing.T) {
	h := newFakeHandlers()
	h.add(causes.Spec{ID: "by_name", Kind: causes.KindIndex, Resource: widgets}, func(ctx context.Context, call causes.Call) (causes.Result, error) {
		return causes.Result{Value: call.Cause.Body["metadata"].(map[string]any)["name"]}, nil
	})
	e := startEnv(t, h, Options{})
	e.create("w1", nil)
	indexed := func() bool {
		entries, _ := e.op.indexes.Lookup("by_name")
		return fmt.Sprint(entries[""]) == "[w1]"
	}
	e.eventually("the object indexed", indexed)
	e.markDeleting("w1")
	e.eventually("the deleting object re-indexed", func() bool { return len(h.callsOf("by_name", "w1")) >= 2 })
	e.stays("w1", "the object leaving the index while it is being deleted", func() bool { return !indexed() })
	e.delete("w1")
	e.eventually("the object left the index once gone", func() bool { return !indexed() })
}

// A sharp timer keeps to its schedule (first run + n intervals), whatever the
// delays: a late wake-up skips the ticks it missed instead of running them in a
// burst, and the next tick is back on the schedule. A timer that is not sharp
// runs an interval after its last run ended: a late run delays every later one.
// The e2e test only checks that timers keep running on a real server; the
// schedule is proved here, on the fake clock, with no time measured.
func TestSharpTimerKeepsItsScheduleAndOthersDrift(t *testing.T) {
	h := newFakeHandlers()
	h.add(causes.Spec{ID: "sharp", Kind: causes.KindTimer, Resource: widgets, Interval: 10 * time.Second, Sharp: true}, nil)
	h.add(causes.Spec{ID: "drifting", Kind: causes.KindTimer, Resource: widgets, Interval: 10 * time.Second}, nil)
	e := startEnv(t, h, Options{})
	e.create("w1", nil)
	runs := func(id string) int { return len(h.callsOf(id, "w1")) }
	e.eventually("the first run of both timers", func() bool { return runs("sharp") == 1 && runs("drifting") == 1 })
	// Late by 15 s (a loaded machine, a stopped process): both run once, not twice.
	e.clock.Step(25 * time.Second)
	e.eventually("the late run of both timers", func() bool { return runs("sharp") == 2 && runs("drifting") == 2 })
	e.stays("w1", "the missed ticks run in a burst", func() bool { return runs("sharp") > 2 || runs("drifting") > 2 })
	// 30 s after the first run: the sharp timer is back on its schedule; the other
	// one runs 10 s after its late run, at 35 s.
	e.clock.Step(5 * time.Second)
	e.eventually("the sharp timer's tick at 30 s", func() bool { return runs("sharp") == 3 })
	e.stays("w1", "the drifting timer runs before 35 s", func() bool { return runs("drifting") > 2 })
	e.clock.Step(5 * time.Second)
	e.eventually("the drifting timer's tick at 35 s", func() bool { return runs("drifting") == 3 })
	e.stays("w1", "the sharp timer runs off its schedule", func() bool { return runs("sharp") > 3 })
	e.clock.Step(5 * time.Second)
	e.eventually("the sharp timer's tick at 40 s", func() bool { return runs("sharp") == 4 })
	e.stays("w1", "the drifting timer runs before 45 s", func() bool { return runs("drifting") > 3 })
}

// A daemon waiting its initial delay holds no goroutine (the clock's timer and
// callbacks hold it), starts when the delay is over, and one stopped during the delay
// (its object being deleted) never runs and lets the finalizer go.
func TestDaemonsInTheirInitialDelayHoldNoGoroutine(t *testing.T) {
	h := newFakeHandlers()
	var mu sync.Mutex
	started := map[string]bool{}
	h.addDaemon(causes.Spec{ID: "late", Resource: widgets, InitialDelay: time.Hour}, func(ctx context.Context, call causes.Call) error {
		mu.Lock()
		started[call.Daemon.Name] = true
		mu.Unlock()
		<-call.Daemon.Stopped.Done()
		return nil
	})
	e := startEnv(t, h, Options{})
	const n = 60
	e.create("w0", nil)
	e.eventually("the first daemon registered", func() bool { return e.op.daemons.count() == 1 })
	base := runtime.NumGoroutine()
	for i := 1; i < n; i++ {
		e.create(fmt.Sprintf("w%d", i), nil)
	}
	e.eventually("every daemon registered", func() bool { return e.op.daemons.count() == n })
	e.eventually("no goroutine per waiting daemon", func() bool { return runtime.NumGoroutine() < base+n/2 })
	startedCount := func() int { mu.Lock(); defer mu.Unlock(); return len(started) }
	if got := startedCount(); got != 0 {
		t.Fatalf("%d daemons started before their initial delay", got)
	}
	e.markDeleting("w0")
	e.eventually("the daemon stopped in its delay let its object go", func() bool { return e.op.daemons.count() == n-1 })
	e.clock.Step(time.Hour)
	e.eventually("the others started once the delay was over", func() bool { return startedCount() == n-1 })
	mu.Lock()
	defer mu.Unlock()
	if started["w0"] {
		t.Error("the daemon stopped during its initial delay ran")
	}
}

// kopf checks a daemon's stop again after each wait: a daemon stopped while its
// initial delay is ending does not start. Stops and delays end together here, on
// purpose; each daemon either began its first attempt before its stop (it then sees
// the stop, maybe at its first line: a stop right after a start is a stop of a
// running daemon) or never begins. What must never happen, and is counted: a daemon
// whose stop came first running at all. The start and the stop are ordered by the
// daemon's own lock (daemonRun.begin), so the count is 0 whatever the scheduling
// (run it with -count=50 on a loaded machine).
func TestDaemonStoppedAsItsDelayEndsDoesNotStart(t *testing.T) {
	const rounds, n = 10, 30
	ranAfterStop, stoppedFirst := 0, 0
	for round := 0; round < rounds; round++ {
		h := newFakeHandlers()
		var mu sync.Mutex
		ran := map[context.Context]bool{} // by the daemon's Stopped context
		h.addDaemon(causes.Spec{ID: "d", Resource: widgets, InitialDelay: time.Minute}, func(ctx context.Context, call causes.Call) error {
			mu.Lock()
			ran[call.Daemon.Stopped] = true
			mu.Unlock()
			return nil
		})
		e := startEnv(t, h, Options{})
		var all []*daemonRun
		for i := 0; i < n; i++ {
			e.create(fmt.Sprintf("w%d", i), nil)
		}
		e.eventually("every daemon waiting its delay", func() bool { return e.op.daemons.count() == n && e.clock.Waiters() >= n })
		e.op.daemons.mu.Lock()
		for d := range e.op.daemons.running {
			all = append(all, d)
		}
		e.op.daemons.mu.Unlock()
		go e.clock.Step(time.Minute)
		for _, d := range all {
			d.stop(time.Hour, time.Hour)
		}
		// (Their objects' next cycles start new daemons, with a delay of their own.)
		e.eventually("every stopped daemon finished", func() bool {
			for _, d := range all {
				if !d.exited() {
					return false
				}
			}
			return true
		})
		e.shutdown()
		mu.Lock()
		for _, d := range all {
			d.mu.Lock()
			first := d.stoppedBeforeStart
			d.mu.Unlock()
			if first {
				stoppedFirst++
				if ran[d.stopped] {
					ranAfterStop++
				}
			}
		}
		mu.Unlock()
	}
	if ranAfterStop > 0 {
		t.Errorf("%d of the %d daemons stopped before they began ran anyway", ranAfterStop, stoppedFirst)
	}
	t.Logf("%d of %d daemons were stopped before their first attempt began", stoppedFirst, rounds*n)
}

// A change of the field a timer names (its field option), outside the essence
// (status.phase), resets its idle time as any essential change does: kopf adds the
// fields handlers name to the essence. (luabind sets NamedField for timers: its
// TestNamedFieldOfEveryKind.)
func TestIdleTimerIsResetByTheFieldItNames(t *testing.T) {
	h := newFakeHandlers()
	h.add(causes.Spec{ID: "quiet", Kind: causes.KindTimer, Resource: widgets, Idle: 5 * time.Second,
		NamedField: []string{"status", "phase"}}, nil)
	e := startEnv(t, h, Options{})
	e.create("w1", map[string]any{"size": int64(1)})
	e.patch("w1", `{"status":{"phase":"starting"}}`)
	e.settleIn(widgetsGVR, "w1")
	e.clock.Step(3 * time.Second)
	e.patch("w1", `{"status":{"phase":"running"}}`)
	e.settleIn(widgetsGVR, "w1")
	e.clock.Step(3 * time.Second) // 6 s since the object appeared, 3 s since its phase changed
	e.stays("w1", "a run 3 s after its field changed", func() bool { return len(h.callsOf("quiet", "w1")) > 0 })
	e.clock.Step(2 * time.Second)
	e.eventually("the run idle seconds after the field changed", func() bool { return len(h.callsOf("quiet", "w1")) == 1 })
}

// An index exists from the scripts' load on: a handler of another resource reading
// it before any object of the indexed resource went through a cycle (here: none
// exists) sees it empty. Seen on a real node: a Team created with its Tenant failed
// with "index not registered" and was retried a minute later.
func TestIndexWithoutObjectsIsEmptyNotUnregistered(t *testing.T) {
	h := newFakeHandlers()
	cms := causes.Resource{GroupVersionResource: configmapsGVR}
	h.add(causes.Spec{ID: "cms_by_name", Kind: causes.KindIndex, Resource: cms}, func(ctx context.Context, call causes.Call) (causes.Result, error) {
		return causes.Result{Value: call.Cause.Body["metadata"].(map[string]any)["name"]}, nil
	})
	var mu sync.Mutex
	var found []bool
	h.add(causes.Spec{ID: "reads_index", Kind: causes.KindChange, Resource: widgets, Reasons: []causes.Reason{causes.Create}}, func(ctx context.Context, call causes.Call) (causes.Result, error) {
		entries, ok := call.Indexes.Lookup("cms_by_name")
		mu.Lock()
		found = append(found, ok && len(entries) == 0)
		mu.Unlock()
		if !ok {
			return causes.Result{}, errors.New("index cms_by_name is not registered")
		}
		return causes.Result{}, nil
	})
	e := startEnv(t, h, Options{})
	e.create("w1", nil)
	runs := func() string {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprint(found)
	}
	e.eventually("the create handler's run", func() bool { return runs() != "[]" })
	e.stays("w1", "a second run (a retry)", func() bool { return runs() != "[true]" && runs() != "[false]" })
	if found := runs(); found != "[true]" {
		t.Errorf("the handler found the index (registered and empty) in its runs: %v, want [true] (one run)", found)
	}
}

// kopf's strict check before an attempt (the time ran out while a timer or a daemon
// waited for its retry) quotes the last error, as a change handler's does, without
// the retry the error had asked for: the timer below fails once, the clock then
// passes its timeout before the retry.
func TestStrictCheckOfTimersAndDaemonsQuotesTheLastError(t *testing.T) {
	h := newFakeHandlers()
	h.add(causes.Spec{ID: "tick", Kind: causes.KindTimer, Resource: widgets, Interval: time.Minute, Backoff: time.Second, Timeout: 3 * time.Second},
		failing(&causes.TemporaryError{Message: "not ready", Delay: time.Second}))
	h.addDaemon(causes.Spec{ID: "watcher", Resource: widgets, Backoff: time.Second, Timeout: 3 * time.Second},
		func(context.Context, causes.Call) error { return errBoom })
	log := &jsonLog{}
	e := startEnv(t, h, Options{Logger: slog.New(slog.NewJSONHandler(log, nil))})
	e.create("w1", nil)
	failedWith := func(id string) string {
		for _, l := range log.lines() {
			if l["msg"] == "handler failed for good" && l["handler"] == id {
				return fmt.Sprint(l["error"])
			}
		}
		return ""
	}
	retried := func(id string) bool {
		for _, l := range log.lines() {
			if l["msg"] == "handler will be retried" && l["handler"] == id {
				return true
			}
		}
		return false
	}
	e.eventually("both failed once", func() bool { return retried("tick") && retried("watcher") })
	e.clock.Step(10 * time.Second)
	e.eventually("both gave up", func() bool { return failedWith("tick") != "" && failedWith("watcher") != "" })
	for id, want := range map[string]string{
		"tick":    "handler tick timed out after 3s (last error: not ready)",
		"watcher": "handler watcher timed out after 3s (last error: boom)",
	} {
		if got := failedWith(id); got != want {
			t.Errorf("%s's final failure: %q, want %q", id, got, want)
		}
	}
}

// Issue 45: a daemon that writes the same status at every luaop.sleep sends it once;
// the API server sees a write only when the daemon changes something.
func TestDaemonPatchIsSentOnlyWhenItChangesTheObject(t *testing.T) {
	h := newFakeHandlers()
	flushes := make(chan map[string]any)
	h.addDaemon(causes.Spec{ID: "reporter", Resource: widgets}, func(ctx context.Context, call causes.Call) error {
		for {
			select {
			case p := <-flushes:
				call.Daemon.Flush(p)
			case <-call.Daemon.Stopped.Done():
				return nil
			}
		}
	})
	e := startEnv(t, h, Options{})
	e.create("w1", map[string]any{"size": int64(1)})
	phase := func() string {
		v, _, _ := unstructured.NestedString(e.get("w1").Object, "status", "phase")
		return v
	}
	flushes <- map[string]any{"status": map[string]any{"phase": "Running"}}
	e.eventually("the daemon's first write", func() bool { return phase() == "Running" })
	e.settleIn(widgetsGVR, "w1")
	daemonWrites := func() int { return e.patchesOf(widgetsGVR) - e.barriers }
	before := daemonWrites()
	for range 3 {
		flushes <- map[string]any{"status": map[string]any{"phase": "Running", "gone": nil}}
		e.settleIn(widgetsGVR, "w1") // the flush came before the barrier's write
	}
	if n := daemonWrites() - before; n != 0 {
		t.Errorf("the daemon's unchanged status was written %d more time(s), want none", n)
	}
	flushes <- map[string]any{"status": map[string]any{"phase": "Degraded"}}
	e.eventually("the daemon's changed status written", func() bool { return phase() == "Degraded" })
	e.settleIn(widgetsGVR, "w1")
	if n := daemonWrites() - before; n != 1 {
		t.Errorf("the daemon's change took %d write(s), want 1", n)
	}
}
