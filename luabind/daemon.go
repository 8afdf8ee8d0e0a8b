package luabind

import (
	"context"
	"fmt"
	"time"

	lua "github.com/yuin/gopher-lua"

	"github.com/luaop/luaop/processing/causes"
)

// RunDaemon runs a daemon handler as a Lua coroutine of its object's shard, until it
// returns, fails, or ctx is cancelled. The shard is held only while Lua runs: when
// the daemon calls luaop.sleep, the coroutine yields, the shard serves other objects,
// and this goroutine waits on a timer. So a sleeping daemon costs no CPU and no Lua
// state of its own: a coroutine (a small stack) and a goroutine.
//
// call.Stopped closing wakes the sleep early (it returns false) and ctx.stopped()
// becomes true; what the daemon writes into ctx.patch is handed to call.Flush at
// every sleep and at the end.
func (r *Runtime) RunDaemon(ctx context.Context, call causes.Call) error {
	sh := r.shardFor(uidOf(call.Cause.Body))
	sh.mu.Lock()
	fns := sh.lookup(call.Handler.ID, uidOf(call.Cause.Body))
	if fns == nil {
		sh.mu.Unlock()
		return &causes.PermanentError{Message: fmt.Sprintf("daemon %s is no longer registered", call.Handler.ID)}
	}
	thread, cancelThread := sh.L.NewThread()
	if cancelThread != nil {
		defer cancelThread()
	}
	cs := &callState{call: call, fns: fns, logger: call.Logger, daemon: true}
	cs.table = sh.L.CreateTable(0, 8)
	sh.L.SetMetatable(cs.table, sh.ctxMT)
	args := []lua.LValue{cs.table}
	fn := fns.fn
	for {
		state, values, err := sh.resume(ctx, thread, fn, cs, args)
		sh.mu.Unlock()
		if err != nil {
			return err
		}
		if state == lua.ResumeOK {
			return nil
		}
		// Yielded by luaop.sleep(seconds): wait without holding the shard.
		slept := true
		seconds, _ := values[0].(lua.LNumber)
		timer := time.NewTimer(time.Duration(float64(seconds) * float64(time.Second)))
		select {
		case <-timer.C:
		case <-call.Stopped:
			slept = false
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		}
		timer.Stop()
		fn, args = nil, []lua.LValue{lua.LBool(slept)}
		sh.mu.Lock()
	}
}

// resume runs one slice of a daemon under the handler deadline (an endless loop
// without sleep fails the daemon instead of holding the shard), then flushes its
// patch.
func (s *shard) resume(ctx context.Context, thread *lua.LState, fn *lua.LFunction, cs *callState, args []lua.LValue) (lua.ResumeState, []lua.LValue, error) {
	sliceCtx, cancel := context.WithTimeout(ctx, s.rt.opts.HandlerTimeout)
	defer cancel()
	thread.SetContext(sliceCtx)
	s.L.SetContext(sliceCtx)
	s.current = cs
	defer func() {
		s.current = nil
		s.L.RemoveContext()
		s.L.SetTop(0)
	}()
	state, err, values := s.L.Resume(thread, fn, args...)
	s.flushDaemonPatch(cs)
	if state == lua.ResumeError {
		if sliceCtx.Err() != nil && ctx.Err() == nil {
			return state, nil, timeoutError(err, s.rt.opts.HandlerTimeout)
		}
		if ctx.Err() != nil {
			return state, nil, ctx.Err()
		}
		return state, nil, luaError(err)
	}
	if state == lua.ResumeYield && (len(values) == 0 || values[0].Type() != lua.LTNumber) {
		return lua.ResumeError, nil, &causes.PermanentError{Message: "a daemon may only yield through luaop.sleep(seconds)"}
	}
	return state, values, nil
}

func (s *shard) flushDaemonPatch(cs *callState) {
	if cs.patchTbl == nil || cs.call.Flush == nil {
		return
	}
	prunePatchTable(cs.patchTbl, s.patchMT)
	p, err := fromLua(cs.patchTbl)
	cs.patchTbl = nil
	if err != nil {
		s.log().Error("the daemon's ctx.patch cannot be converted; dropped", "error", err)
		return
	}
	if m, ok := p.(map[string]any); ok && len(m) > 0 {
		cs.call.Flush(m)
	}
}
