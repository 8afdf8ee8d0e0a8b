package processing

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/luaop/luaop/processing/causes"
)

// a handler failed by its timeout (exhausted, before it runs) in the cycle
// whose write is refused as too large for another handler's result: its failure
// record is not written again with the refusal's records, so the next cycle fails it
// again and posts a second HandlerFailed.
func TestAHandlerOutOfTimeInARefusedCycleFailsOnce(t *testing.T) {
	const limit = 50 << 10
	big := strings.Repeat("x", 60<<10)
	var yCalls atomic.Int64
	h := newFakeHandlers()
	x := changeSpec("x", causes.Create)
	x.Timeout = 3 * time.Second
	h.add(x, func(ctx context.Context, call causes.Call) (causes.Result, error) {
		return causes.Result{}, &causes.TemporaryError{Message: "not yet", Delay: time.Second}
	})
	h.add(changeSpec("y", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		if yCalls.Add(1) == 1 {
			return causes.Result{}, &causes.TemporaryError{Message: "not yet", Delay: time.Second}
		}
		return causes.Result{Value: big}, nil
	})
	events := &eventLog{}
	post := true
	e := startEnvWith(t, h, Options{Lifecycle: LifecycleAllAtOnce, PostEvents: &post, Recorder: events},
		refuseObjectsOver(limit, apierrors.NewInternalError(errors.New("etcdserver: request is too large"))))
	e.create("w", map[string]any{"size": int64(1)})
	e.eventually("both ran once", func() bool { return len(h.callsOf("x", "w")) == 1 && yCalls.Load() == 1 })
	e.settleIn(widgetsGVR, "w")
	e.clock.Step(5 * time.Second)
	e.eventually("y ran again", func() bool { return yCalls.Load() == 2 })
	for i := 0; i < 5; i++ {
		e.settleIn(widgetsGVR, "w")
		e.clock.Step(time.Second)
	}
	got := events.with("HandlerFailed", "handler x timed out")
	t.Logf("x failures: %q; y failed: %d; annotations: %d", got, len(events.with("HandlerFailed", "handler y")), len(e.annotations("w")))
	if len(got) != 1 {
		t.Errorf("HandlerFailed for x's timeout posted %d times, want once", len(got))
	}
}
