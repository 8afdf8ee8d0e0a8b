package peering

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	testingclock "k8s.io/utils/clock/testing"
)

// fakeWorker counts the workers working at once across operators: peering must
// never let two work on the same resources.
type fakeWorker struct {
	mu      sync.Mutex
	paused  bool
	reason  string
	pauses  int
	resumes int
	working *atomic.Int32
	overlap *atomic.Bool
	// late, when set, holds each Pause before it takes effect until it is closed
	// (the goroutine calling Pause scheduled late); pausing receives the context
	// of each Pause so held.
	late    chan struct{}
	pausing chan context.Context
	// returned counts the Pause calls that returned.
	returned int
}

func newWorker(working *atomic.Int32, overlap *atomic.Bool) *fakeWorker {
	return &fakeWorker{paused: true, working: working, overlap: overlap}
}

func (w *fakeWorker) Pause(ctx context.Context, reason string) error {
	w.mu.Lock()
	late, pausing := w.late, w.pausing
	w.mu.Unlock()
	if late != nil {
		pausing <- ctx
		<-late
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.returned++
	w.reason = reason
	if !w.paused {
		w.paused = true
		w.pauses++
		w.working.Add(-1)
	}
	return nil
}

func (w *fakeWorker) Resume() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.paused {
		w.paused = false
		w.resumes++
		if w.working.Add(1) > 1 {
			w.overlap.Store(true)
		}
	}
}

func (w *fakeWorker) counts() (pauses, resumes int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pauses, w.resumes
}

func (w *fakeWorker) isPaused() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.paused
}

type running struct {
	p      *Peering
	w      *fakeWorker
	cancel context.CancelFunc
	done   chan struct{}
}

func (r *running) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
}

type world struct {
	t       *testing.T
	client  *fake.Clientset
	clock   *testingclock.FakeClock
	working atomic.Int32
	overlap atomic.Bool
}

func newWorld(t *testing.T) *world {
	return &world{t: t, client: fake.NewClientset(), clock: testingclock.NewFakeClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))}
}

var widgetsScope = Scope{Resources: []string{"widgets.example.com"}}

func (w *world) start(identity, mode string, priority int, scope Scope) *running {
	w.t.Helper()
	return w.startWorker(identity, mode, priority, scope, newWorker(&w.working, &w.overlap))
}

func (w *world) startWorker(identity, mode string, priority int, scope Scope, worker *fakeWorker) *running {
	w.t.Helper()
	p, err := New(w.client, worker, scope, Options{Namespace: "luaop-system", Prefix: "luaop.dev", Identity: identity, Mode: mode,
		Priority: priority, Clock: w.clock, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		w.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(w.t.Context())
	r := &running{p: p, w: worker, cancel: cancel, done: make(chan struct{})}
	go func() { defer close(r.done); _ = p.Run(ctx) }()
	w.t.Cleanup(func() { cancel(); <-r.done })
	return r
}

// peerLease writes the Lease of a peer of prefix luaop.dev on widgets, renewed now
// (on the fake clock), that no Peering of the test runs.
func (w *world) peerLease(holder string, priority int) *coordinationv1.Lease {
	w.t.Helper()
	l := &coordinationv1.Lease{}
	secs, renew := int32(15), metav1.NewMicroTime(w.clock.Now())
	l.Name, l.Namespace = LeaseName("luaop.dev", holder), "luaop-system"
	l.Labels = map[string]string{PrefixLabel: "luaop.dev"}
	l.Annotations = map[string]string{priorityAnnotation: strconv.Itoa(priority), resourcesAnnotation: "widgets.example.com", prefixAnnotation: "luaop.dev", modeAnnotation: "dev"}
	l.Spec = coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs, RenewTime: &renew}
	if _, err := w.client.CoordinationV1().Leases("luaop-system").Create(context.Background(), l, metav1.CreateOptions{}); err != nil {
		w.t.Fatal(err)
	}
	return l
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for: %s", what)
}

func (w *world) lease(name string) *coordinationv1.Lease {
	l, err := w.client.CoordinationV1().Leases("luaop-system").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return l
}

// A dev session (666) arriving while a run (0) works: the run pauses, says so, and
// only then the dev works; the dev's clean exit deletes its Lease and the run
// resumes. Never both at once.
func TestDevPausesRunAndRunResumesAfterACleanExit(t *testing.T) {
	w := newWorld(t)
	run := w.start("run-1", "run", RunPriority, widgetsScope)
	eventually(t, "run working", func() bool { return !run.w.isPaused() })

	dev := w.start("dev-1", "dev", DevPriority, widgetsScope)
	eventually(t, "dev working and run paused", func() bool { return !dev.w.isPaused() && run.w.isPaused() })
	if st := run.p.State(); !st.Paused || !strings.Contains(st.Reason, "paused in favour of dev-1 (priority 666, luaop dev") {
		t.Errorf("run's state = %+v", st)
	}
	if st := dev.p.State(); st.Paused || len(st.Peers) != 1 || st.Peers[0].Identity != "run-1" || !st.Peers[0].Paused {
		t.Errorf("dev's state = %+v", st)
	}
	if got := w.lease(run.p.lease).Annotations[pausedAnnotation]; got != "true" {
		t.Errorf("run's Lease says paused=%q", got)
	}

	// The operator's work ends before its peering stops (runOperator's order).
	_ = dev.w.Pause(t.Context(), "exiting")
	dev.stop(t)
	if w.lease(dev.p.lease) != nil {
		t.Error("dev's Lease is left after a clean exit")
	}
	eventually(t, "run working again", func() bool { return !run.w.isPaused() })
	if w.overlap.Load() {
		t.Error("two operators worked at once")
	}
	if pauses, resumes := run.w.counts(); pauses != 1 || resumes != 2 {
		t.Errorf("run paused %d and resumed %d times, want 1 and 2", pauses, resumes)
	}
}

// A higher-priority peer killed (its Lease left, no longer renewed) blocks until
// its lease expires; one lease duration later its Lease is deleted.
func TestAKilledPeerBlocksUntilItsLeaseExpires(t *testing.T) {
	w := newWorld(t)
	dead := w.peerLease("dev-killed", 666)
	run := w.start("run-1", "run", RunPriority, widgetsScope)
	eventually(t, "run paused in favour of the dead dev", func() bool {
		st := run.p.State()
		return st.Paused && strings.Contains(st.Reason, "dev-killed") && len(st.Peers) == 1
	})
	// 14 s later it still blocks (renewals on the fake clock keep coming).
	w.clock.Step(14 * time.Second)
	eventually(t, "run's renewals", func() bool { return w.clock.HasWaiters() })
	if !run.w.isPaused() {
		t.Fatal("run resumed before the dead peer's lease expired")
	}
	w.clock.Step(2 * time.Second)
	eventually(t, "run working once the lease expired", func() bool { return !run.w.isPaused() })
	w.clock.Step(15 * time.Second)
	eventually(t, "the dead peer's Lease deleted", func() bool { return w.lease(dead.Name) == nil })
}

// Two operators of the same priority on the same resources both pause, each
// warned with the other's name; when one leaves the other works.
func TestSamePriorityBothPause(t *testing.T) {
	w := newWorld(t)
	a := w.start("run-a", "run", 0, widgetsScope)
	eventually(t, "a working", func() bool { return !a.w.isPaused() })
	b := w.start("run-b", "run", 0, widgetsScope)
	eventually(t, "both paused, each naming the other", func() bool {
		return a.w.isPaused() && b.w.isPaused() && strings.Contains(a.p.State().Reason, "run-b") && strings.Contains(b.p.State().Reason, "run-a")
	})
	if _, resumes := b.w.counts(); resumes != 0 {
		t.Errorf("b worked %d time(s) before pausing", resumes)
	}
	b.stop(t)
	eventually(t, "a working again", func() bool { return !a.w.isPaused() })
}

// Operators serving other resources, or disjoint namespaces, do not pause.
func TestNoConflictNoPause(t *testing.T) {
	w := newWorld(t)
	a := w.start("run-a", "run", 0, Scope{Resources: []string{"widgets.example.com"}, Namespaces: []string{"team-a"}})
	b := w.start("dev-b", "dev", 666, Scope{Resources: []string{"widgets.example.com"}, Namespaces: []string{"team-b"}})
	c := w.start("dev-c", "dev", 666, Scope{Resources: []string{"gadgets.example.com"}})
	eventually(t, "all working", func() bool { return !a.w.isPaused() && !b.w.isPaused() && !c.w.isPaused() })
	// A reload widening b to all namespaces makes it conflict with a: a pauses.
	b.p.SetScope(Scope{Resources: []string{"widgets.example.com"}})
	eventually(t, "a paused in favour of b", func() bool { return a.w.isPaused() && !b.w.isPaused() })
}

// Leases that cannot be written (RBAC): the operator works alone and says why.
func TestForbiddenLeasesWorkAlone(t *testing.T) {
	w := newWorld(t)
	w.client.PrependReactor("create", "leases", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, "x", nil)
	})
	r := w.start("run-1", "run", 0, widgetsScope)
	eventually(t, "working alone", func() bool { return !r.w.isPaused() })
	if st := r.p.State(); !st.Alone || !strings.Contains(st.AloneReason, "grant get, list, watch, create, update and delete of leases") {
		t.Errorf("state = %+v", st)
	}
}

// A pause whose Worker.Pause had not yet taken effect when the decision turned to
// work again (its goroutine scheduled late) must not take effect after the
// Resume: the operator would stay paused, handling nothing, while peering (the
// Lease, /debug, the view) says it works.
func TestAPauseThatBeginsLateDoesNotOutliveTheResume(t *testing.T) {
	w := newWorld(t)
	worker := newWorker(&w.working, &w.overlap)
	run := w.startWorker("run-1", "run", RunPriority, widgetsScope, worker)
	eventually(t, "run working", func() bool { return !worker.isPaused() })
	worker.mu.Lock()
	worker.late, worker.pausing = make(chan struct{}), make(chan context.Context, 8)
	worker.mu.Unlock()

	dev := w.peerLease("dev-1", DevPriority)
	var pauseCtx context.Context
	select {
	case pauseCtx = <-worker.pausing:
	case <-time.After(10 * time.Second):
		t.Fatal("run did not start pausing for dev-1")
	}
	// dev-1 goes before run's Pause took effect: run is to work again.
	if err := w.client.CoordinationV1().Leases("luaop-system").Delete(t.Context(), dev.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the pause called off", func() bool { return pauseCtx.Err() != nil })
	// Time for a loop that does not wait for the late Pause to resume meanwhile.
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) && run.p.State().Paused {
		time.Sleep(2 * time.Millisecond)
	}
	close(worker.late)
	eventually(t, "the late Pause returned and peering says run works", func() bool {
		worker.mu.Lock()
		returned := worker.returned
		worker.mu.Unlock()
		return returned >= 1 && !run.p.State().Paused
	})
	if worker.isPaused() {
		t.Fatal("the worker is paused while peering says run works: the late Pause landed after the Resume")
	}
}

// The Lease says "not paused" before the operator works: when that write fails (a
// passing API error), the operator stays paused and tries again at the next
// renewal; working while its Lease still says "paused", a higher-priority peer
// arriving meanwhile would start at once, and both would handle the same objects.
func TestNoWorkWhileTheLeaseStillSaysPaused(t *testing.T) {
	w := newWorld(t)
	var failUpdates atomic.Bool
	var failed atomic.Int32
	w.client.PrependReactor("update", "leases", func(clienttesting.Action) (bool, runtime.Object, error) {
		if failUpdates.Load() {
			failed.Add(1)
			return true, nil, apierrors.NewInternalError(errors.New("etcd leader changed"))
		}
		return false, nil, nil
	})
	dev := w.peerLease("dev-1", DevPriority)
	run := w.start("run-1", "run", RunPriority, widgetsScope)
	eventually(t, "run paused in favour of dev-1, its Lease saying so", func() bool {
		l := w.lease(run.p.lease)
		return run.p.State().Paused && strings.Contains(run.p.State().Reason, "dev-1") && l != nil && l.Annotations[pausedAnnotation] == "true"
	})

	failUpdates.Store(true)
	if err := w.client.CoordinationV1().Leases("luaop-system").Delete(t.Context(), dev.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "run trying to say it works", func() bool { return failed.Load() > 0 })
	time.Sleep(100 * time.Millisecond) // time to resume wrongly
	if !run.w.isPaused() {
		t.Fatalf("run works while its Lease says paused=%q", w.lease(run.p.lease).Annotations[pausedAnnotation])
	}

	failUpdates.Store(false)
	w.clock.Step(5 * time.Second) // the next renewal
	eventually(t, "run working once its Lease says so", func() bool {
		return !run.w.isPaused() && w.lease(run.p.lease).Annotations[pausedAnnotation] == "false"
	})
}
