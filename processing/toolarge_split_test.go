package processing

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// With a status subresource the cycle writes /status (results) first, then the
// object. When only the object's write is refused as too large, a handler whose only
// content (its result) went in the /status write, which was stored, is not blamed:
// its success is recorded and reported; the handler that wrote to the object fails.
func TestARefusalBlamesOnlyTheHandlersOfTheRefusedWrite(t *testing.T) {
	const limit = 50 << 10
	big := strings.Repeat("x", 60<<10)
	h := newFakeHandlers()
	h.add(changeSpec("small", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		return causes.Result{Value: "ok"}, nil
	})
	h.add(changeSpec("big", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		call.Patch.Set([]string{"spec", "data"}, big)
		return causes.Result{}, nil
	})
	h.add(changeSpec("third", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		return causes.Result{}, &causes.TemporaryError{Message: "not yet", Delay: time.Hour}
	})
	events := &eventLog{}
	post := true
	e := startEnvWith(t, h, Options{Lifecycle: LifecycleAllAtOnce, PostEvents: &post, Recorder: events},
		refuseObjectsOver(limit, apierrors.NewInternalError(errors.New("etcdserver: request is too large"))))
	e.create("w", map[string]any{"size": int64(1)})
	e.eventually("third ran", func() bool { return len(h.callsOf("third", "w")) == 1 })
	e.settleIn(widgetsGVR, "w")
	obj := e.get("w").Object
	rec, _ := state.NewAnnotationsProgress("luaop.dev").Fetch(obj, "small")
	st, _ := obj["status"].(map[string]any)
	if rec.Failure || !rec.Success || st["small"] != "ok" {
		t.Errorf("the handler whose result was stored: record %+v, status.small %v; want its success", rec, st["small"])
	}
	if got := events.with("HandlerFailed", "small"); len(got) != 0 {
		t.Errorf("HandlerFailed posted for the handler whose result was stored: %q", got)
	}
	if got := events.with("HandlerSucceeded", "small"); len(got) != 1 {
		t.Errorf("HandlerSucceeded events of small: %q, want one", got)
	}
	if bigRec, _ := state.NewAnnotationsProgress("luaop.dev").Fetch(obj, "big"); !bigRec.Failure {
		t.Errorf("the handler whose content was refused: record %+v, want a failure", bigRec)
	}
	if n := len(h.callsOf("small", "w")); n != 1 {
		t.Errorf("small ran %d times, want 1", n)
	}
}
