package scriptwatch

import (
	"context"
	"time"

	"github.com/luaop/luaop/luabind"
)

// ReloadEvent is one reload attempt.
type ReloadEvent struct {
	// Files changed since the previous content.
	Files  []string
	Report luabind.LoadReport
	// Err is the load's error (file:line); the previous scripts keep serving.
	Err error
	// Latency runs from the first file event of the burst to the new handlers being
	// active (the swap at the end of Report.Took), or the error being known.
	Latency time.Duration
	// Total runs from the first file event to the loader's return: Latency plus what
	// the loader does after the swap (the operator schedules a cycle for every
	// object, so that daemons and timers follow the new handlers).
	Total time.Duration
}

// Loader makes a script set current, atomically (operator.Operator.LoadScripts).
type Loader func(ctx context.Context, scripts []luabind.Script) (luabind.LoadReport, error)

// Reload loads every change into the operator until changes is closed or ctx done,
// and reports each attempt. A broken edit never stops it: the loader keeps the last
// good scripts, and the next save is tried again.
func Reload(ctx context.Context, changes <-chan Change, load Loader, report func(ReloadEvent)) {
	for {
		select {
		case <-ctx.Done():
			return
		case ch, ok := <-changes:
			if !ok {
				return
			}
			start := time.Now()
			rep, err := load(ctx, ch.Scripts)
			total := time.Since(ch.At)
			latency := total
			if err == nil && rep.Took > 0 {
				latency = min(start.Sub(ch.At)+rep.Took, total)
			}
			if report != nil {
				report(ReloadEvent{Files: ch.Files, Report: rep, Err: err, Latency: latency, Total: total})
			}
		}
	}
}
