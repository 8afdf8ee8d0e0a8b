package luabind

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	lua "github.com/luaop/luaop/third_party/gopher-lua"

	"github.com/luaop/luaop/handling"
	"github.com/luaop/luaop/luabind/internal/luaerr"
	"github.com/luaop/luaop/luabind/internal/luavalue"
	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// StartDaemon runs a daemon handler as a coroutine on a call thread of its object's
// shard, until it returns, fails, or ctx is cancelled; then done is called, once,
// with nil when the daemon returned, from whichever goroutine ended it, with no lock
// held. StartDaemon itself returns when the daemon first sleeps (or ends).
//
// The daemon is an ordinary call: its blocking functions (luaop.kube.*, events)
// release the shard while they wait, and each stretch of Lua between two waits is
// bounded by the handler deadline (an endless loop without sleep fails the daemon
// instead of holding the shard). luaop.sleep at the top level of the daemon's Lua
// yields the coroutine: the sleeping daemon then holds no goroutine, no Lua state
// and no lock, only its coroutine and a timer, and is resumed on a goroutine of the
// timer's when it wakes (see daemonCall). Inside pcall, an iterator or a metamethod
// a yield cannot cross the Go frames between, so luaop.sleep blocks there instead,
// as any blocking function does (the goroutine parks, the shard is released).
//
// call.Daemon.Stopped ending wakes the sleep early (it returns false) and
// ctx.stopped() becomes true; what the daemon writes into ctx.patch is handed to
// call.Daemon.Flush at every sleep and at the end, with no lock held. A stopped
// daemon is told of its stop once, by a luaop.sleep returning false; once
// call.Daemon.Cancelled has ended too, its next blocking call ends it
// (cancellationPoint), as kopf's cancellation ends an async daemon.
func (r *Runtime) StartDaemon(ctx context.Context, call *causes.Call, done func(error)) {
	uid := uidOf(call.Cause.Body)
	if uid == "" && call.Daemon != nil {
		uid = call.Daemon.UID
	}
	sh := r.shardFor(uid)
	for {
		err := sh.lock(ctx)
		if errors.Is(err, errStuck) { // wait for its replacement (stuck.go)
			select {
			case <-sh.swapped:
				sh = r.shardFor(uid)
				continue
			case <-ctx.Done():
			}
		}
		if err != nil {
			done(err)
			return
		}
		break
	}
	fns := sh.lookup(call.Handler.ID, uid)
	if fns == nil {
		sh.unlock()
		done(&causes.PermanentError{Message: fmt.Sprintf("daemon %s is no longer registered", call.Handler.ID)})
		return
	}
	// From here on only the call state's copy of call is used: the caller's Call is
	// then garbage while the daemon runs; a sleeping daemon would otherwise keep both.
	cs := &callState{call: *call, fns: fns, logger: call.Logger, daemon: true}
	// The daemon's own context: its cancellation cancels it (and so every deadline
	// made under it), so that pcall cannot swallow the cancellation.
	cs.ctx, cs.cancelLua = context.WithCancel(ctx)
	dc := &daemonCall{sh: sh, cs: cs, done: done}
	dc.begin(fns.fn)
}

// RunDaemon is StartDaemon waiting for the daemon to end: it returns done's error.
func (r *Runtime) RunDaemon(ctx context.Context, call *causes.Call) error {
	ended := make(chan error, 1)
	r.StartDaemon(ctx, call, func(err error) { ended <- err })
	return <-ended
}

// daemonCall is one run of a daemon as a coroutine. Ownership: the goroutine that
// holds the shard lock and steps the coroutine owns it; while the daemon sleeps
// nobody does, and the one wake-up that wins (daemonWake) takes it back with the
// shard lock. So at most one goroutine touches it at a time: under the shard lock,
// but for park, which reads only fields set before the first step (and takes the
// lock to list the wake-up).
type daemonCall struct {
	sh   *shard
	cs   *callState
	t    *callThread
	done func(error)
}

// daemonSleep is what luaop.sleep hands to the daemon when it yields.
type daemonSleep struct {
	d     time.Duration
	patch map[string]any // ctx.patch so far, flushed before the wait
	// notified: the daemon was told of its stop already; its cancellation, not its
	// stop, ends this sleep early.
	notified bool
}

// begin starts the coroutine. Shard lock held; released by step.
func (dc *daemonCall) begin(fn *lua.LFunction) {
	s, cs := dc.sh, dc.cs
	dc.t = s.bindCall(cs)
	dc.step(s.daemonEntry, s.daemonSetup, fn, cs.table)
}

// step resumes the coroutine (fn and args start it; a wake-up resumes it with the
// sleep's result) and deals with where it stopped: a sleep parks it, anything else
// ends it. Shard lock held; released before step returns.
func (dc *daemonCall) step(fn *lua.LFunction, args ...lua.LValue) {
	sleep, patch, result, err := dc.advance(fn, args)
	dc.sh.unlock()
	if sleep != nil {
		dc.park(sleep)
		return
	}
	cs := dc.cs
	if result != nil {
		// What a daemon returns goes to status.<id>, as kopf delivers it after a
		// daemon's run (kopf/_core/engines/daemons.py, _daemon: deliver_results).
		p := state.NewPatch()
		p.Merge(patch)
		handling.StoreResult(p, cs.call.Handler, result)
		patch = p.Map()
	}
	if patch != nil && cs.call.Daemon != nil && cs.call.Daemon.Flush != nil {
		cs.call.Daemon.Flush(patch)
	}
	if err != nil && !errors.Is(err, causes.ErrDaemonCancelled) && cs.ctx.Err() != nil {
		err = cs.ctx.Err()
	}
	cs.cancelLua()
	dc.done(err)
}

// advance runs the coroutine to its next sleep, or to its end: then the thread is
// dropped (gopher-lua kills a coroutine that ended, returning or failing: it can be
// neither resumed nor pooled) and what the daemon wrote since its last sleep is
// returned with how it ended, and what it returned when it did. Shard lock
// held. A Go panic in luaop's code around the coroutine ends the daemon with an
// internal error: it would otherwise crash the process from a timer's goroutine.
func (dc *daemonCall) advance(fn *lua.LFunction, args []lua.LValue) (sleep *daemonSleep, patch map[string]any, result any, err error) {
	s, cs, t := dc.sh, dc.cs, dc.t
	top := s.L.GetTop() // Resume's values pass through the main state's stack
	defer func() {
		if r := recover(); r != nil {
			s.L.SetTop(top)
			s.rt.mem.leave(&cs.mem)
			s.putThread(t, false)
			sleep, patch, result = nil, nil, nil
			err = fmt.Errorf("%s: internal error while running the daemon: %v", cs.call.Handler.ID, r)
		}
	}()
	s.rt.mem.enter(&cs.mem, t.L.Context(), t.cancel)
	// Resume refuses a thread that is the state's current one. Only Resume reads it
	// (scripts have no coroutine library) and gopher-lua sets it, back to the main
	// state at every yield; reset here all the same, so that Resume's check never
	// depends on the order in which other calls parked and continued.
	s.L.G.CurrentThread = s.L
	st, rerr, returned := s.L.Resume(t.L, fn, args...)
	s.rt.mem.leave(&cs.mem) // a sleeping call allocates nothing: never the one to cancel
	if st == lua.ResumeYield && cs.sleep != nil {
		sleep = cs.sleep
		cs.sleep, cs.raised, cs.raisedTrace = nil, nil, ""
		return sleep, nil, nil, nil
	}
	var ae *lua.ApiError
	if errors.As(rerr, &ae) && ae.StackTrace == "" && cs.raised != nil && ae.Object == cs.raised {
		ae.StackTrace = cs.raisedTrace
	}
	switch {
	case st == lua.ResumeOK:
		result, err = daemonResult(cs, returned)
	case cs.cancelled:
		err = fmt.Errorf("%s: %w", cs.call.Handler.ID, causes.ErrDaemonCancelled)
	case st == lua.ResumeYield:
		// Nothing but luaop.sleep yields (scripts have no coroutine library); the
		// coroutine is stuck half-way.
		err = fmt.Errorf("%s: internal error: the daemon yielded outside luaop.sleep", cs.call.Handler.ID)
	case cs.mem.hit.Load():
		err = s.rt.mem.budgetError(rerr, &cs.mem)
	case t.L.Context().Err() != nil && cs.ctx.Err() == nil:
		// The thread's context is the deadline of the last stretch of Lua.
		err = timeoutError(rerr, s.rt.opts.HandlerTimeout)
	default:
		err = luaerr.Translate(rerr)
	}
	s.putThread(t, false)
	return nil, s.takeDaemonPatch(s.L, cs), result, err
}

// daemonResult is what a daemon that ended returned (its first value), as a
// change handler's result is converted (bound as an object's write).
func daemonResult(cs *callState, returned []lua.LValue) (any, error) {
	if len(returned) == 0 || returned[0] == lua.LNil {
		return nil, nil
	}
	out, err := luavalue.FromLuaLimited(returned[0], objectWriteLimits)
	if err != nil {
		return nil, &causes.PermanentError{Message: fmt.Sprintf("%s: the daemon's return value: %s", cs.call.Handler.Source, err)}
	}
	return out, nil
}

// park flushes the sleep's patch and arms what wakes the daemon: its timer, its
// stop, its context, and Runtime.Close (the shard's parked set). No lock held on
// entry; no goroutine kept: the timer and the contexts hold the wake-up until one
// of them fires.
func (dc *daemonCall) park(sleep *daemonSleep) {
	s, link := dc.sh, dc.cs.call.Daemon
	if sleep.patch != nil {
		link.Flush(sleep.patch)
	}
	// Listed for Close only after the flush, so that a daemon Close ends has handed
	// over what it wrote first.
	s.relock()
	if s.closed {
		// Close ran since the daemon yielded (or the daemon caught the closed
		// error inside pcall and went on to sleep).
		s.unlock()
		dc.cs.cancelLua()
		dc.done(errClosed)
		return
	}
	w := &daemonWake{dc: dc}
	s.parked[w] = struct{}{}
	s.unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fired.Load() {
		return // Runtime.Close woke it already
	}
	w.timer = time.AfterFunc(sleep.d, func() { w.wake(wokeSlept) })
	// Told of its stop already (sleep.notified), a daemon sleeps on until its
	// cancellation; else its stop wakes it.
	switch {
	case link == nil:
	case !sleep.notified && link.Stopped != nil:
		w.stopStopped = context.AfterFunc(link.Stopped, func() { w.wake(wokeStopped) })
	case sleep.notified && link.Cancelled != nil:
		w.stopStopped = context.AfterFunc(link.Cancelled, func() { w.wake(wokeCancelled) })
	}
	w.stopCtx = context.AfterFunc(dc.cs.ctx, func() { w.wake(wokeEnded) })
}

// wokeBy says what ended a daemon's sleep.
type wokeBy int

const (
	wokeSlept     wokeBy = iota // its time passed: luaop.sleep returns true
	wokeStopped                 // its stop: luaop.sleep returns false (once)
	wokeCancelled               // its cancellation: luaop.sleep raises it
	wokeEnded                   // its context, or Runtime.Close: it ends
)

// daemonWake is one sleep of a daemon: the first of its timer, its stop, its
// context and Runtime.Close to fire resumes the daemon (on that callback's
// goroutine); the others are disarmed. mu covers the arming: a callback may fire
// before park has set them all.
type daemonWake struct {
	dc    *daemonCall
	fired atomic.Bool
	mu    sync.Mutex
	timer *time.Timer
	// stopStopped and stopCtx unregister the callbacks on the daemon's stop and context.
	stopStopped, stopCtx func() bool
}

func (w *daemonWake) wake(by wokeBy) {
	if !w.fired.CompareAndSwap(false, true) {
		return
	}
	w.mu.Lock()
	if w.timer != nil { // nil when Close fires it before park armed it
		w.timer.Stop()
	}
	if w.stopStopped != nil {
		w.stopStopped()
	}
	if w.stopCtx != nil {
		w.stopCtx()
	}
	w.mu.Unlock()
	w.dc.wake(w, by)
}

// wake takes the shard back and resumes the coroutine with the sleep's result
// (true: it slept its time; false: stopped, or its context ended); a cancellation
// resumes it with its context cancelled, so that it ends at once.
func (dc *daemonCall) wake(w *daemonWake, by wokeBy) {
	s, cs, t := dc.sh, dc.cs, dc.t
	s.relock() // every holder releases it within a handler deadline
	delete(s.parked, w)
	if s.closed {
		// Runtime.Close ran while the daemon slept: its Lua state is gone, the
		// daemon ends where it slept.
		s.unlock()
		cs.cancelLua()
		dc.done(errClosed)
		return
	}
	// A daemon's deadline bounds the Lua run between two waits.
	s.setDeadline(t, cs.ctx)
	if cs.mem.hit.Load() {
		// Over the memory budget before it slept: the watch cancelled the deadline it
		// had then. Cancelled again, the next instruction fails and advance reports
		// the budget error; the daemon's Lua cannot catch it.
		t.cancel()
	}
	switch by {
	case wokeStopped:
		cs.notified = true
	case wokeCancelled:
		cs.cancelled = true
		cs.cancelLua() // the wrapper's next instruction fails: advance reports it
	}
	dc.step(nil, lua.LBool(by == wokeSlept))
}

// newDaemonEntry compiles the function every daemon coroutine starts with. It runs
// setup (daemonSetup) inside the started coroutine, then tail-calls the handler, so
// that the handler runs at the coroutine's top level, where luaop.sleep can yield.
func (s *shard) newDaemonEntry() {
	fn, err := s.L.Load(strings.NewReader("local setup, fn, ctx = ...\nsetup()\nreturn fn(ctx)\n"), luaerr.InternalChunk("daemon"))
	if err != nil {
		panic("luabind: the daemon entry does not compile: " + err.Error()) // a constant: cannot happen
	}
	s.daemonEntry = fn
	// gopher-lua's coroutines record no traceback of an error (Resume gives a
	// starting coroutine a Panic function without one, and the coroutine's end
	// keeps only the error value); errors raised without a location of their own
	// (error(table), luaop's error objects) then could not say where they were
	// raised. setup, run once the coroutine has started (Resume sets Panic only
	// then), installs a Panic that records the traceback in the call state, where
	// step finds it for the error value the coroutine ends with.
	panicFn := func(L *lua.LState) {
		obj := L.Get(-1)
		if cs := s.callOf(L); cs != nil {
			cs.raised, cs.raisedTrace = obj, traceback(L)
		}
		panic(&lua.ApiError{Type: lua.ApiErrorRun, Object: obj})
	}
	s.daemonSetup = s.L.NewFunction(func(L *lua.LState) int {
		L.Panic = panicFn
		return 0
	})
}

// traceback lists the location of every frame of L's call stack, innermost first,
// in the format of gopher-lua's tracebacks.
func traceback(L *lua.LState) string {
	var b strings.Builder
	b.WriteString("stack traceback:")
	for level := 0; level < 20; level++ {
		where := L.Where(level)
		if where == "" {
			break
		}
		b.WriteString("\n\t")
		b.WriteString(where)
		b.WriteString(" in ?")
	}
	b.WriteString("\n\t[G]: ?")
	return b.String()
}

// canYield tells whether the Go function running on L (luaop.sleep) may yield L's
// coroutine: only when L runs Lua in the one VM loop its Resume started, with no
// Go frame between (pcall, xpcall, an iterator or a metamethod called by the VM run
// their Lua in a loop of their own, which a yield would leave broken). gopher-lua
// does not say so itself; the Go stack does: exactly one of its VM loops between
// here and the coroutine's start. Counted on at most 64 frames: a deeper stack
// blocks instead, which is always safe. The names are gopher-lua's (v1.1.2): if an
// upgrade renamed them every sleep would block, still correct, and
// TestSleepingDaemonsHoldNoGoroutine would fail. Shard lock held.
func (s *shard) canYield(L *lua.LState) bool {
	if t := s.threadOf(L); t == nil || t.L != L {
		return false // a coroutine of the script's own, or no call
	}
	var pcs [64]uintptr
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs[:])])
	loops := 0
	for {
		f, more := frames.Next()
		switch f.Function {
		case "github.com/luaop/luaop/third_party/gopher-lua.mainLoop", "github.com/luaop/luaop/third_party/gopher-lua.mainLoopWithContext":
			loops++
		case "github.com/luaop/luaop/third_party/gopher-lua.threadRun":
			return loops == 1
		}
		if !more {
			return false
		}
	}
}

// takeDaemonPatch converts what a daemon wrote into ctx.patch since the last flush
// and starts a new patch table. Shard lock held; the caller flushes the result
// after releasing it. L is the calling state (for the logger).
func (s *shard) takeDaemonPatch(L *lua.LState, cs *callState) map[string]any {
	if cs.patchTbl == nil || cs.call.Daemon == nil || cs.call.Daemon.Flush == nil {
		return nil
	}
	p, err := s.convertPatch(cs)
	s.endPatch(cs)
	if err != nil {
		logger := cs.logger
		if logger == nil {
			logger = s.log(L)
		}
		logger.Error("the daemon's ctx.patch cannot be converted; dropped", "error", err)
		return nil
	}
	if m, ok := p.(map[string]any); ok && len(m) > 0 {
		return m
	}
	return nil
}

// cancellationPoint is checked by the blocking functions of the API (luaop.sleep,
// luaop.kube.*, Events) on entry and after they waited: a daemon that was told of
// its stop (a luaop.sleep returned false) and whose cancellation came
// (DaemonLink.Cancelled: its cancellation_backoff after the stop) is ended there,
// as kopf's cancellation ends an async daemon at its next await. The raise cannot
// be swallowed: the daemon's context is cancelled first, so the instruction after a
// pcall that caught it fails too. ctx.logger is no such point: a daemon logs on its
// way out. Shard lock held.
func (s *shard) cancellationPoint(L *lua.LState) {
	cs := s.callOf(L)
	if cs == nil || !cs.daemon || !cs.notified || !daemonCancelled(cs) {
		return
	}
	s.raiseCancellation(L, cs)
}

func daemonCancelled(cs *callState) bool {
	link := cs.call.Daemon
	return link != nil && link.Cancelled != nil && link.Cancelled.Err() != nil
}

func (s *shard) raiseCancellation(L *lua.LState, cs *callState) {
	cs.cancelled = true
	cs.cancelLua()
	L.RaiseError("%s", causes.ErrDaemonCancelled.Error())
}

// blockingPoint is blocking for the API's blocking functions: a cancellation
// point before and after the wait, and for a daemon told of its stop, a wait that
// its cancellation interrupts.
func (s *shard) blockingPoint(L *lua.LState, wait func(ctx context.Context)) {
	s.cancellationPoint(L)
	var cancelled context.Context
	if cs := s.callOf(L); cs != nil && cs.daemon && cs.notified && cs.call.Daemon != nil {
		cancelled = cs.call.Daemon.Cancelled
	}
	if cancelled == nil {
		s.blocking(L, wait)
		return
	}
	s.blocking(L, func(ctx context.Context) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(cancelled, cancel)()
		wait(ctx)
	})
	s.cancellationPoint(L)
}
