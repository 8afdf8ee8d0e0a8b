package reloading

import (
	"context"
	"testing"
	"time"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/scriptwatch"
)

// sleepyOperator loads in Took and then works on after the swap, as the operator
// schedules a cycle for every object.
type sleepyOperator struct{ took, after time.Duration }

func (o sleepyOperator) LoadScripts(context.Context, []luabind.Script) (luabind.LoadReport, error) {
	time.Sleep(o.took)  // the load: Took
	time.Sleep(o.after) // what the loader does after the swap
	return luabind.LoadReport{Took: o.took}, nil
}
func (sleepyOperator) NoteReload([]string, error) {}
func (sleepyOperator) NoteLastGood(bool)          {}

// Latency ends when the new handlers are active (the end of the load's Took), not
// when the loader returns after scheduling work of its own; Total ends there.
func TestReloadLatencyEndsAtTheSwap(t *testing.T) {
	r := New(Options{Operator: sleepyOperator{took: 5 * time.Millisecond, after: 50 * time.Millisecond}})
	at := time.Now().Add(-30 * time.Millisecond) // the burst's first event, debounced
	ev := r.reload(t.Context(), scriptwatch.Change{At: at})
	if ev.Total < 85*time.Millisecond {
		t.Errorf("Total %s, want at least the debounce and the whole loader (85ms)", ev.Total)
	}
	if ev.Latency < 35*time.Millisecond || ev.Latency >= ev.Total-40*time.Millisecond {
		t.Errorf("Latency %s (Total %s): want the debounce plus Took, without the 50ms after the swap", ev.Latency, ev.Total)
	}
}
