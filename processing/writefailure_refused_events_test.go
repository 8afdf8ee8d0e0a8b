package processing

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// a write refused as too large drops what event handlers wrote in it
// (refuseWrites' doc); when the write of the failure records then gets no answer,
// keepTheirs sees only that error and hands the event handler's content back: it
// is sent again, and makes the handler's next run fail for good too.
func TestARefusedThenUnansweredWriteResendsNoEventHandlerContent(t *testing.T) {
	const limit = 50 << 10
	big := strings.Repeat("x", 60<<10)
	var events, bigSent, recordsFailed atomic.Int64
	h := newFakeHandlers()
	h.add(causes.Spec{ID: "spy", Kind: causes.KindEvent, Resource: widgets}, func(ctx context.Context, call causes.Call) (causes.Result, error) {
		if events.Add(1) == 1 {
			call.Patch.Set([]string{"spec", "fromEvent"}, big)
		}
		return causes.Result{}, nil
	})
	h.add(changeSpec("create_fn", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		call.Patch.Set([]string{"spec", "small"}, "y")
		return causes.Result{}, nil
	})
	e := startEnvWith(t, h, Options{}, func(dyn *dynamicfake.FakeDynamicClient) {
		refuseObjectsOver(limit, apierrors.NewInternalError(errors.New("etcdserver: request is too large")))(dyn)
		dyn.PrependReactor("patch", "widgets", func(action clienttesting.Action) (bool, runtime.Object, error) {
			p := string(action.(clienttesting.PatchAction).GetPatch())
			if strings.Contains(p, big) {
				bigSent.Add(1)
			}
			if strings.Contains(p, "refused to store") && recordsFailed.Add(1) == 1 {
				return true, nil, io.ErrUnexpectedEOF // not applied, no answer
			}
			return false, nil, nil
		})
	})
	e.create("w", map[string]any{"size": int64(1)})
	e.eventually("the failure records' write failed", func() bool { return recordsFailed.Load() >= 1 })
	for i := 0; i < 30; i++ {
		e.clock.Step(time.Second)
		e.settleIn(widgetsGVR, "w")
	}
	progress := state.NewAnnotationsProgress("luaop.dev")
	rec, _ := progress.Fetch(e.get("w").Object, "create_fn")
	t.Logf("runs=%d bigSent=%d record=%+v ann=%v", len(h.callsOf("create_fn", "w")), bigSent.Load(), rec, len(e.annotations("w")))
	if n := bigSent.Load(); n != 1 {
		t.Errorf("the event handler's refused content was sent %d times, want once (dropped after the refusal)", n)
	}
	if rec.Failure {
		t.Errorf("create_fn failed for good on its second run, for the event handler's content: %s", rec.Message)
	}
}
