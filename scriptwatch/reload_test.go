package scriptwatch

import (
	"context"
	"testing"
	"time"

	"github.com/luaop/luaop/luabind"
)

// Latency ends when the new handlers are active (the end of the load's Took), not
// when the loader returns after scheduling work of its own; Total ends there.
func TestReloadLatencyEndsAtTheSwap(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	changes := make(chan Change, 1)
	events := make(chan ReloadEvent, 1)
	load := func(context.Context, []luabind.Script) (luabind.LoadReport, error) {
		time.Sleep(5 * time.Millisecond)  // the load: Took
		time.Sleep(50 * time.Millisecond) // what the loader does after the swap
		return luabind.LoadReport{Took: 5 * time.Millisecond}, nil
	}
	go Reload(ctx, changes, load, func(ev ReloadEvent) { events <- ev })
	at := time.Now().Add(-30 * time.Millisecond) // the burst's first event, debounced
	changes <- Change{At: at}
	ev := <-events
	if ev.Total < 85*time.Millisecond {
		t.Errorf("Total %s, want at least the debounce and the whole loader (85ms)", ev.Total)
	}
	if ev.Latency < 35*time.Millisecond || ev.Latency >= ev.Total-40*time.Millisecond {
		t.Errorf("Latency %s (Total %s): want the debounce plus Took, without the 50ms after the swap", ev.Latency, ev.Total)
	}
}
