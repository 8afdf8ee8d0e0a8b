package processing

import (
	"context"
	"testing"
	"time"

	"github.com/luaop/luaop/processing/causes"
)

// A replica that lost its shard membership stops with no grace (Options.StopAtOnce):
// a cycle in flight is cancelled and writes nothing, where a plain stop lets it
// finish and store its handler's result within the shutdown grace period.
func TestStopAtOnceCancelsTheCyclesInFlightWithNoGrace(t *testing.T) {
	for _, tt := range []struct {
		name       string
		atOnce     bool
		wantStored bool
	}{
		{"a plain stop: the cycle in flight finishes and stores its result", false, true},
		{"stop at once: the cycle in flight is cancelled and writes nothing", true, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newFakeHandlers()
			entered, release := make(chan struct{}), make(chan struct{})
			defer close(release)
			h.add(changeSpec("slow", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
				close(entered)
				select {
				case <-release:
				case <-ctx.Done():
					return causes.Result{}, ctx.Err()
				}
				return causes.Result{Value: "done"}, nil
			})
			stopNow := make(chan struct{})
			opts := Options{ShutdownGracePeriod: time.Hour}
			if tt.atOnce {
				opts.StopAtOnce = stopNow
			}
			e := startEnv(t, h, opts)
			e.create("w1", nil)
			select {
			case <-entered:
			case <-time.After(20 * time.Second):
				t.Fatal("the handler never ran")
			}
			patchesBefore := e.patchesOf(widgetsGVR)
			if tt.atOnce {
				close(stopNow)
				e.stop()
			} else {
				e.stop()
				release <- struct{}{} // the handler returns within the grace period
			}
			e.shutdown() // fails the test when Start does not return (a grace of an hour)
			if n := e.patchesOf(widgetsGVR) - patchesBefore; tt.atOnce && n != 0 {
				t.Errorf("%d patches sent after the operator was told to stop writing at once", n)
			}
			st, _ := e.get("w1").Object["status"].(map[string]any)
			if stored := st["slow"] == "done"; stored != tt.wantStored {
				t.Errorf("the handler's result stored: %v, want %v (status %v)", stored, tt.wantStored, st)
			}
		})
	}
}
