package processing

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// A cause whose last write the server refuses as too large ends in the next cycle;
// a change the user makes before that cycle is a change of its own: the update
// handler runs for it, once, from the essence the refused cycle handled (old size 1,
// new size 2), not taken as handled by the end of the create cause.
func TestAChangeMadeAfterARefusedFinalWriteIsHandled(t *testing.T) {
	const limit = 100 << 10
	big := strings.Repeat("x", 60<<10)
	h := newFakeHandlers()
	h.add(changeSpec("big", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		return causes.Result{Value: big}, nil
	})
	h.add(changeSpec("upd", causes.Update), nil)
	var refused atomic.Int32
	userChange := func(dyn *dynamicfake.FakeDynamicClient) {
		refuse := refuseObjectsOver(limit, apierrors.NewInternalError(errors.New("etcdserver: request is too large")))
		refuse(dyn)
		// Right after the first refusal, the user changes the object (before the
		// cycle the failure record's write starts).
		dyn.PrependReactor("patch", "widgets", func(action clienttesting.Action) (bool, runtime.Object, error) {
			a := action.(clienttesting.PatchAction)
			if !strings.Contains(string(a.GetPatch()), big) || refused.Add(1) != 1 {
				return false, nil, nil
			}
			obj, err := dyn.Tracker().Get(a.GetResource(), a.GetNamespace(), a.GetName())
			if err != nil {
				return false, nil, nil
			}
			u := obj.(*unstructured.Unstructured).DeepCopy()
			_ = unstructured.SetNestedField(u.Object, int64(2), "spec", "size")
			_ = dyn.Tracker().Update(a.GetResource(), u, a.GetNamespace())
			return false, nil, nil // on to the refusal
		})
	}
	e := startEnvWith(t, h, Options{}, userChange)
	e.create("w", map[string]any{"size": int64(1)})
	e.eventually("the refused write", func() bool { return refused.Load() >= 1 })
	e.settleIn(widgetsGVR, "w")
	e.clock.Step(2 * time.Minute)
	e.settleIn(widgetsGVR, "w")
	if n := len(h.callsOf("big", "w")); n != 1 {
		t.Errorf("the refused create handler ran %d times, want 1", n)
	}
	if n := len(h.callsOf("upd", "w")); n != 1 {
		t.Errorf("the update handler ran %d times for the user's change made after the refusal, want 1", n)
	}
	if _, ok := e.annotations("w")[state.LastHandledKey("luaop.dev")]; !ok {
		t.Error("no diff-base stored: the causes did not end")
	}
}
