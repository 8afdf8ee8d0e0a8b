package processing

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/luaop/luaop/processing/causes"
)

// refuseOperatorPatches makes the fake server refuse every patch of the widgets but
// the tests' own barriers (settleIn) while refuse is set.
func refuseOperatorPatches(refuse *atomic.Bool) func(*dynamicfake.FakeDynamicClient) {
	return func(dyn *dynamicfake.FakeDynamicClient) {
		dyn.PrependReactor("patch", "widgets", func(a clienttesting.Action) (bool, runtime.Object, error) {
			p, _ := a.(clienttesting.PatchAction)
			if !refuse.Load() || p == nil || strings.Contains(string(p.GetPatch()), "testBarrier") {
				return false, nil, nil
			}
			return true, nil, apierrors.NewInternalError(errBoom)
		})
	}
}

// kopf's timers are tasks of their own (issue 33 7b): a cycle that fails on a
// framework error (here every write of the operator is refused, the finalizer's
// included, so the change handling never gets anywhere) does not stop the object's
// timers: they run on their schedule, and the failing part is retried on its
// backoff, not at every timer run.
func TestTimersRunWhileTheChangeHandlingFails(t *testing.T) {
	h := newFakeHandlers()
	h.add(changeSpec("create_fn", causes.Create), nil)
	h.add(causes.Spec{ID: "tick", Kind: causes.KindTimer, Resource: widgets, Interval: 10 * time.Second}, nil)
	var refuse atomic.Bool
	refuse.Store(true)
	counter := &patchCounter{}
	e := startEnvWith(t, h, Options{Observer: counter}, refuseOperatorPatches(&refuse))
	e.create("w1", nil)
	e.eventually("the timer's first run", func() bool { return len(h.callsOf("tick", "w1")) == 1 })
	for second := 1; second <= 30; second++ {
		e.clock.Step(time.Second)
		e.settleIn(widgetsGVR, "w1")
		if want := 1 + second/10; len(h.callsOf("tick", "w1")) != want {
			t.Fatalf("%d s after the creation the timer ran %d times, want %d (every 10 s)", second, len(h.callsOf("tick", "w1")), want)
		}
	}
	if n := len(h.callsOf("create_fn", "w1")); n != 0 {
		t.Errorf("the create handler ran %d times before the finalizer could be added", n)
	}
	// 30 s of 1, 2, 4, 8, 16 s backoffs: a handful of tries of the failing write, plus
	// one per timer run (its own write) and one per barrier (the barrier's event).
	if n := counter.patches.Load(); n > 30+4+8 {
		t.Errorf("%d writes tried in 30 s: the failing part is retried more often than its backoff and the events allow", n)
	}
	refuse.Store(false)
	e.clock.Step(5 * time.Minute) // past any backoff (at most 5 min)
	e.eventually("the creation handled once the server accepts", func() bool { return len(h.callsOf("create_fn", "w1")) == 1 })
}
