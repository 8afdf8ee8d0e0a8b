package luabind

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"github.com/luaop/luaop/luabind/internal/luaerr"
)

// The memory budget.
//
// gopher-lua has no allocation hook, so a script can grow the operator's heap without
// bound (s = s .. s, a table filled in a loop), and in a container that is an OOM kill
// of every object's handling. The budget bounds the Go heap while Lua runs:
//   - a watchdog goroutine runs while any Lua call is running (not parked in a
//     blocking function): every memTick it reads the heap's live-object bytes
//     (runtime/metrics, no stop-the-world). Above the budget it runs a GC (at most
//     every memGCEvery; after a GC that found mostly garbage, only once the heap grew
//     by another quarter of the budget) to tell garbage from live data, and if the
//     heap is still above, cancels the Lua call that has been running longest since it last took
//     its state in a blocking function (a preemption does not count: a memory bomb runs
//     without pause but for those; ordinary handlers are short):
//     gopher-lua checks the call's context between instructions, so the call fails
//     at its next instruction with ErrMemoryBudget, "memory budget exceeded", naming
//     file:line. Then it waits for that call to end before cancelling another.
//   - the error is an ordinary handler error: retried after the handler's backoff,
//     never in a tight loop; other objects keep being served.
//   - cheap guards stop the big single allocations the watchdog cannot interrupt:
//     string.rep, string.format, string.gsub and table.concat refuse results over
//     Options.MaxStringSize; luaop.json.decode and luaop.yaml.decode refuse documents
//     over MaxStringSize bytes or with more than maxDecodeValues values; the call
//     stack (sandbox.Options.CallStackSize) and data stack (threadRegistryMaxSize)
//     are bounded, so deep recursion fails with "stack overflow".
//
// What the budget cannot prevent: one instruction that allocates (s .. s of a large
// string, at most MaxStringSize: the patched gopher-lua bounds `..`) finishes before
// the cancellation is seen, so the heap may pass the budget by that instruction's
// allocation before the call stops; hence the default of half the memory limit. The budget counts the whole heap (informer caches included), not
// Lua alone: data a script keeps (in a memo or a global) stays counted after its call.

// ErrMemoryBudget is what errors.Is finds in the error of a call cancelled because
// the heap went over the memory budget.
var ErrMemoryBudget = errors.New("memory budget exceeded")

// DefaultFixedMemoryBudget is the budget when neither GOMEMLIMIT nor a container
// memory limit is known.
const DefaultFixedMemoryBudget = 1 << 30

const (
	memTick    = 5 * time.Millisecond
	memGCEvery = 100 * time.Millisecond
)

// DefaultMemoryBudget is the budget used when Options.MemoryBudget is 0, and where it
// comes from: half of GOMEMLIMIT when it is set, else half of the cgroup's memory
// limit (memory.max, or memory.limit_in_bytes of cgroup v1), else
// DefaultFixedMemoryBudget.
func DefaultMemoryBudget() (int64, string) {
	if limit := debug.SetMemoryLimit(-1); limit > 0 && limit < math.MaxInt64 {
		return limit / 2, "half of GOMEMLIMIT"
	}
	if limit, ok := cgroupMemoryLimit(); ok {
		return limit / 2, "half of the container's memory limit"
	}
	return DefaultFixedMemoryBudget, "fixed default (no GOMEMLIMIT, no container memory limit)"
}

func cgroupMemoryLimit() (int64, bool) {
	for _, p := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil || n <= 0 || n >= 1<<60 { // "max", or cgroup v1's "unlimited"
			continue
		}
		return n, true
	}
	return 0, false
}

// FormatBytes writes a size as people read it: 512.0 MiB.
func FormatBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// memWatch is the watchdog of one Runtime. mu guards every field below it; it is
// never held while calling out (a cancel function is called after unlocking).
type memWatch struct {
	budget uint64 // 0: no budget
	logger *slog.Logger
	heap   func() uint64 // the heap reading (heapObjects)
	// clock is the runtime's: the calls' deadlines are read on it (schedule.go).
	clock clock.PassiveClock
	// onStuck and onUnstuck are told (no lock held) of a call past its deadline
	// and stuckGrace, and of its end (stuck.go). Nil: not watched.
	onStuck, onUnstuck func(*memCall)
	// holders says who holds the data kept across calls (holders.go), for the
	// error of a call the budget cancelled; called with that call's shard lock
	// held. Nil: not said.
	holders func(*memCall) string

	mu      sync.Mutex
	active  map[*memCall]struct{}
	running bool // the watchdog goroutine runs
	// The watchdog goroutine's own (one runs at a time; handed over under mu):
	// lastGC is when it last ran a GC; floor is the heap that GC left when it was
	// under the budget (a false alarm: garbage), lowered when the heap is seen
	// lower, so that a heap whose live part sits near the budget is not collected
	// again until it grew by a quarter of the budget.
	lastGC time.Time
	floor  uint64
}

// memCall is one Lua call as the watchdog sees it (a handler call or a script load).
type memCall struct {
	what string // the handler's id, or "loading the scripts"
	// hit is set when the watchdog cancelled the call; heapAt is the reading then.
	hit    atomic.Bool
	heapAt atomic.Uint64
	// since and cancel are set by enter (mu held): the start of the current stretch
	// of Lua and the function ending its context; deadline is that context's. ran
	// is how long the stretch ran before the call was preempted (pause): its waits
	// for the state do not count, and a call preempted is still the one that ran
	// longest.
	since    time.Time
	ran      time.Duration
	cancel   context.CancelFunc
	deadline time.Time
	// sh is the shard the call runs on (nil: none known); stuck is set (mu held)
	// once the watchdog found it past its deadline (stuck.go).
	sh    *shard
	stuck bool
}

func newMemWatch(budget int64, logger *slog.Logger, clk clock.PassiveClock) *memWatch {
	w := &memWatch{logger: logger, heap: heapObjects, clock: clk, active: map[*memCall]struct{}{}}
	if budget > 0 {
		w.budget = uint64(budget)
	}
	return w
}

// heapObjects reads the bytes of heap objects, live or not yet swept.
func heapObjects() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	return s[0].Value.Uint64()
}

// enter records that mc runs Lua from now on under ctx, ended by cancel.
func (w *memWatch) enter(mc *memCall, ctx context.Context, cancel context.CancelFunc) {
	if w == nil || (w.budget == 0 && w.onStuck == nil) {
		return
	}
	w.mu.Lock()
	mc.since, mc.cancel = w.clock.Now().Add(-mc.ran), cancel
	mc.deadline, _ = ctx.Deadline()
	w.active[mc] = struct{}{}
	if !w.running {
		w.running = true
		go w.loop()
	}
	w.mu.Unlock()
}

// leave records that mc stopped running Lua (ended, or parked in a blocking function).
func (w *memWatch) leave(mc *memCall) { w.stop(mc, false) }

// pause records that mc stopped running Lua for a while in the middle of a
// stretch: it was preempted, and goes on once it has its state back (enter).
func (w *memWatch) pause(mc *memCall) { w.stop(mc, true) }

func (w *memWatch) stop(mc *memCall, paused bool) {
	if w == nil || (w.budget == 0 && w.onStuck == nil) {
		return
	}
	w.mu.Lock()
	mc.ran = 0
	if _, active := w.active[mc]; active && paused {
		mc.ran = w.clock.Since(mc.since)
	}
	delete(w.active, mc)
	mc.cancel = nil
	wasStuck := mc.stuck
	mc.stuck = false
	w.mu.Unlock()
	if wasStuck && w.onUnstuck != nil {
		w.onUnstuck(mc)
	}
}

// checkStuck tells onStuck of the active calls past their deadline and stuckGrace
// (each once). mu not held.
func (w *memWatch) checkStuck() {
	if w.onStuck == nil {
		return
	}
	now := w.clock.Now()
	var stuck []*memCall
	w.mu.Lock()
	for mc := range w.active {
		if !mc.stuck && !mc.deadline.IsZero() && now.After(mc.deadline.Add(stuckGrace)) {
			mc.stuck = true
			stuck = append(stuck, mc)
		}
	}
	w.mu.Unlock()
	for _, mc := range stuck {
		w.onStuck(mc)
	}
}

// loop runs while calls are active.
func (w *memWatch) loop() {
	t := time.NewTicker(memTick)
	defer t.Stop()
	for range t.C {
		w.mu.Lock()
		if len(w.active) == 0 {
			w.running = false
			w.mu.Unlock()
			return
		}
		waiting := false // a cancelled call has not ended yet
		for mc := range w.active {
			if mc.hit.Load() {
				waiting = true
				break
			}
		}
		w.mu.Unlock()
		w.checkStuck()
		if waiting || w.budget == 0 {
			continue
		}
		heap := w.heap()
		w.floor = min(w.floor, heap) // the live heap shrank since
		if heap <= w.budget || heap < w.floor+w.budget/4 || time.Since(w.lastGC) < memGCEvery {
			continue
		}
		runtime.GC() // garbage is not over the budget; what survives this is
		w.lastGC = time.Now()
		if heap = w.heap(); heap <= w.budget {
			w.floor = heap
			continue
		}
		w.cancelOldest(heap)
	}
}

// cancelOldest cancels the active call running longest since it took its state
// back from a blocking function (the time it waited when preempted not counted).
func (w *memWatch) cancelOldest(heap uint64) {
	w.mu.Lock()
	var victim *memCall
	for mc := range w.active {
		if victim == nil || mc.since.Before(victim.since) {
			victim = mc
		}
	}
	var cancel context.CancelFunc
	if victim != nil {
		victim.heapAt.Store(heap)
		victim.hit.Store(true)
		cancel = victim.cancel
	}
	w.mu.Unlock()
	if cancel == nil {
		return
	}
	w.logger.Warn("memory budget exceeded: cancelling the Lua call running longest",
		"call", victim.what, "heap", FormatBytes(heap), "budget", FormatBytes(w.budget))
	cancel()
}

// budgetError is the error of a call the watchdog cancelled: where the script was
// stopped (file:line, from the Lua error) and why.
func (w *memWatch) budgetError(err error, mc *memCall) error {
	se := luaerr.WithCause(&ScriptError{
		Message: fmt.Sprintf("memory budget exceeded: the operator's heap reached %s, over the budget of %s for Lua calls (--lua-memory-budget), so this call was cancelled; a script that builds large strings or tables in a loop, or keeps them across calls, must bound them",
			FormatBytes(mc.heapAt.Load()), FormatBytes(w.budget))}, ErrMemoryBudget)
	if w.holders != nil {
		if who := w.holders(mc); who != "" {
			se.Message += "; " + who
		}
	}
	var orig *ScriptError
	if errors.As(luaerr.Translate(err), &orig) {
		se.File, se.Line, se.Traceback = orig.File, orig.Line, orig.Traceback
	}
	return se
}
