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
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/luaop/luaop/processing/causes"
)

// a success is reported only once a write stored it. A write refused for
// another reason than its size (422), or without answer, must not have its
// success reported by the timers' write that follows the failure.
func TestAFailedWriteReportsNoSuccess(t *testing.T) {
	for name, fail := range map[string]error{
		"403":     apierrors.NewForbidden(schema.GroupResource{Resource: "widgets"}, "w", errors.New("rbac")),
		"unknown": io.ErrUnexpectedEOF,
	} {
		t.Run(name, func(t *testing.T) {
			var failures atomic.Int64
			h := newFakeHandlers()
			h.add(changeSpec("create_fn", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
				return causes.Result{Value: "done"}, nil
			})
			events := &eventLog{}
			post := true
			e := startEnvWith(t, h, Options{PostEvents: &post, Recorder: events}, func(dyn *dynamicfake.FakeDynamicClient) {
				dyn.PrependReactor("patch", "widgets", func(action clienttesting.Action) (bool, runtime.Object, error) {
					pa := action.(clienttesting.PatchAction)
					if strings.Contains(string(pa.GetPatch()), "create_fn") && failures.Add(1) <= 1 {
						return true, nil, fail
					}
					return false, nil, nil
				})
			})
			e.create("w", map[string]any{"size": int64(1)})
			e.eventually("the write failed", func() bool { return failures.Load() >= 1 })
			e.settleIn(widgetsGVR, "w")
			got := events.with("HandlerSucceeded", "create_fn")
			runs := len(h.callsOf("create_fn", "w"))
			t.Logf("after the failed write: runs=%d HandlerSucceeded=%q", runs, got)
			if runs == 1 && len(got) != 0 {
				t.Errorf("HandlerSucceeded posted for a run whose write failed: %q", got)
			}
			e.eventually("the handling retried", func() bool {
				e.clock.Step(time.Second)
				return failures.Load() >= 2 || len(h.callsOf("create_fn", "w")) >= 2
			})
			e.clock.Step(10 * time.Second)
			e.settleIn(widgetsGVR, "w")
			got = events.with("HandlerSucceeded", "create_fn")
			runs = len(h.callsOf("create_fn", "w"))
			t.Logf("end: runs=%d failures=%d HandlerSucceeded=%q ann=%v", runs, failures.Load(), got, e.annotations("w"))
			if len(got) != 1 {
				t.Errorf("HandlerSucceeded events: %d for %d runs, want one", len(got), runs)
			}
		})
	}
}

var _ = errors.New
