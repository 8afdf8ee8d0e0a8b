package luabind

import (
	"context"
	"errors"
	"fmt"

	lua "github.com/luaop/luaop/third_party/gopher-lua"
)

// errClosed is returned by calls that start after Runtime.Close.
var errClosed = errors.New("the Lua runtime is closed")

// maxIdleThreads bounds the call threads a shard keeps for reuse. More may exist while
// that many calls are parked in blocking functions; the extra ones are dropped when
// their calls end.
const maxIdleThreads = 16

// lock takes the shard lock, or gives up when ctx ends first.
func (s *shard) lock(ctx context.Context) error {
	select {
	case s.sem <- struct{}{}:
	default:
		select {
		case s.sem <- struct{}{}:
		case <-s.stuck:
			return errStuck
		case <-ctx.Done():
			return fmt.Errorf("lua state %d stayed busy with other calls: %w", s.idx, ctx.Err())
		}
	}
	if s.closed {
		s.unlock()
		return errClosed
	}
	return nil
}

// relock takes the shard lock without a way out: used where the caller must get back
// into Lua (a blocking function returning, a staged load committing). Every holder
// releases it within a handler deadline, so the wait is bounded.
func (s *shard) relock() { s.sem <- struct{}{} }

func (s *shard) unlock() { <-s.sem }

// callThread is one coroutine thread of a shard's state (L.NewThread: its own stack
// and context, the shard's globals), on which one call runs at a time. Threads are
// pooled per shard: NewThread allocates a stack and registry, too much per call.
type callThread struct {
	L  *lua.LState
	cs *callState // the call running on this thread; nil when idle
	// cancel ends the thread's current deadline context.
	cancel context.CancelFunc
}

// Sizes of a call thread's stacks. gopher-lua's NewThread gives a thread the options
// of the state it is made from; the shard's main state (sandbox.NewState) runs only
// script loads, while every call and every daemon has a thread of its own, and a
// daemon parked in luaop.sleep holds its thread as long as it sleeps. So threads get
// smaller stacks than the main state, which both grow on demand:
//   - the data stack (gopher-lua's "registry", 16 bytes a slot) starts at
//     threadRegistrySize slots (a daemon parked in a sleep loop fits, no growth),
//     and grows to what is needed plus threadRegistryGrowStep slots, up to
//     threadRegistryMaxSize slots (2 MiB); beyond it the call fails with the Lua
//     error "registry overflow". It never shrinks: a pooled thread keeps what its
//     largest call needed. It grows to at least twice its size (a luaop patch of
//     gopher-lua, whose fixed step alone copied it quadratically: 300 MB of copies
//     for one unpack of 100,000 values). The max
//     bounds what a call can push at once (unpack, varargs: Lua 5.1 allows
//     about 8,000); recursion stays within it (the call stack's 256 frames of at
//     most 250 registers are 64K slots), and table.concat does not use it.
//   - the call stack (MinimizeStackMemory, inherited): segments of 8 frames added
//     as calls nest, up to the main state's CallStackSize frames (256); beyond it
//     the call fails with the Lua error "stack overflow".
//
// Measured by BenchmarkParkedDaemonMemory (luabind) and BenchmarkIdleDaemons (e2e,
// `make bench-daemons`); see BENCHMARKS.md.
const (
	threadRegistrySize     = 64
	threadRegistryGrowStep = 256
	threadRegistryMaxSize  = 128 * 1024
)

// newThread makes a call thread of the shard's state with the small stacks above.
// Shard lock held (the main state's Options are swapped around NewThread).
func (s *shard) newThread() *lua.LState {
	main := s.L.Options
	opts := main
	opts.RegistrySize = threadRegistrySize
	opts.RegistryGrowStep = threadRegistryGrowStep
	opts.RegistryMaxSize = threadRegistryMaxSize
	opts.MinimizeStackMemory = true
	s.L.Options = opts
	L, _ := s.L.NewThread() // the main state has no context: no cancel function
	s.L.Options = main
	return L
}

// getThread takes an idle thread or makes one. Shard lock held.
func (s *shard) getThread() *callThread {
	if n := len(s.idle); n > 0 {
		t := s.idle[n-1]
		s.idle[n-1] = nil
		s.idle = s.idle[:n-1]
		return t
	}
	L := s.newThread()
	t := &callThread{L: L}
	s.threads[L] = t
	return t
}

// putThread returns a thread after its call. A thread whose call ended in a Go panic
// (reuse false) may hold a broken stack and is dropped. Shard lock held.
func (s *shard) putThread(t *callThread, reuse bool) {
	s.endCtx(t.cs)
	if t.cancel != nil {
		t.cancel()
		t.cancel = nil
	}
	t.cs = nil
	if reuse && !s.closed && len(s.idle) < maxIdleThreads {
		t.L.SetTop(0)
		t.L.RemoveContext()
		s.idle = append(s.idle, t)
		return
	}
	delete(s.threads, t.L)
}

// setDeadline gives the thread a new handler deadline under parent. Only the call
// thread's own context changes; threads of the scripts' own coroutines keep theirs.
func (s *shard) setDeadline(t *callThread, parent context.Context) context.Context {
	cctx, cancel := context.WithTimeout(parent, s.rt.opts.HandlerTimeout)
	t.L.SetContext(cctx)
	if t.cancel != nil {
		t.cancel()
	}
	t.cancel = cancel
	return cctx
}

// endStretch ends a daemon's handler deadline as it goes to sleep: the sleep waits
// under the daemon's own context, and blocking starts a new deadline when it wakes
// (before anything there may raise). Kept, the ended stretch's context, its timer and
// its entry among the daemon context's children would live through the whole sleep,
// and the timer would fire for nothing when the sleep outlasts the deadline. Shard
// lock held.
func (s *shard) endStretch(L *lua.LState, cs *callState) {
	t := s.threadOf(L)
	if t == nil || t.cancel == nil {
		return
	}
	t.cancel()
	t.cancel = nil
	t.L.SetContext(cs.ctx)
}

// threadOf finds the call thread L runs on: L itself, or, for a coroutine the
// script created and resumed, the call thread that resumed it.
func (s *shard) threadOf(L *lua.LState) *callThread {
	for l := L; l != nil; l = l.Parent {
		if t := s.threads[l]; t != nil {
			return t
		}
	}
	return nil
}

// callOf is the call running on L (nil while scripts load, on the main state).
func (s *shard) callOf(L *lua.LState) *callState {
	if t := s.threadOf(L); t != nil {
		return t.cs
	}
	return nil
}

// blocking runs wait with the shard released, so that other calls of the shard run
// meanwhile, and takes the shard back before returning to Lua. Every API function
// that waits (I/O, timers) goes through it. The rules for wait:
//   - it must not touch L or any Lua value: convert arguments before, push
//     results after;
//   - ctx is the call's context (its handler deadline; a sleeping daemon's own
//     context, its deadline ended by endStretch): wait must end with it.
//
// Not being a yield, this works inside pcall. While scripts load (on the main state,
// no call), the shard is not released: a load must see no other call.
func (s *shard) blocking(L *lua.LState, wait func(ctx context.Context)) {
	ctx := s.callContext(L)
	t := s.threadOf(L)
	if t == nil || t.cs == nil {
		wait(ctx)
		return
	}
	cs := t.cs
	s.rt.mem.leave(&cs.mem) // a parked call allocates nothing: never the one to cancel
	s.unlock()
	defer func() {
		s.relock()
		if cs.daemon {
			cs.logBytes, cs.logCapped = 0, false // its log budget too
			// A daemon's deadline bounds the Lua run between two waits. It is set
			// before the checks below may raise: a raise caught by pcall must not
			// leave the daemon running without one (its sleep ended the last).
			s.setDeadline(t, cs.ctx)
		}
		if s.closed { // Close ran while this call was parked (processing stops calls before)
			L.RaiseError("%s", errClosed.Error())
		}
		if cs.mem.hit.Load() {
			// Over the budget before it parked: the watch cancelled the context it
			// had then, which a daemon's new deadline replaced; cancelled too, the
			// raise cannot be caught (the next instruction fails), as for any call.
			t.cancel()
			L.RaiseError("%s", ErrMemoryBudget.Error())
		}
		s.rt.mem.enter(&cs.mem, t.L.Context(), t.cancel)
	}()
	wait(ctx)
}
