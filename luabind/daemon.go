package luabind

import (
	"context"
	"fmt"

	lua "github.com/yuin/gopher-lua"

	"github.com/luaop/luaop/luabind/internal/luavalue"
	"github.com/luaop/luaop/processing/causes"
)

// RunDaemon runs a daemon handler on a call thread of its object's shard, until it
// returns, fails, or ctx is cancelled. The daemon is an ordinary call: its blocking
// functions (luaop.sleep, luaop.kube.*, events) release the shard while they wait,
// so a sleeping daemon holds no Lua state, costs no CPU, and lets every other call of
// its shard run. Each stretch of Lua between two waits is bounded by the handler
// deadline (an endless loop without sleep fails the daemon instead of holding the
// shard).
//
// call.Daemon.Stopped closing wakes the sleep early (it returns false) and ctx.stopped()
// becomes true; what the daemon writes into ctx.patch is handed to call.Daemon.Flush at
// every sleep and at the end, with no lock held.
func (r *Runtime) RunDaemon(ctx context.Context, call *causes.Call) error {
	uid := uidOf(call.Cause.Body)
	sh := r.shardFor(uid)
	if err := sh.lock(ctx); err != nil {
		return err
	}
	fns := sh.lookup(call.Handler.ID, uid)
	if fns == nil {
		sh.unlock()
		return &causes.PermanentError{Message: fmt.Sprintf("daemon %s is no longer registered", call.Handler.ID)}
	}
	cs := &callState{call: *call, fns: fns, logger: call.Logger, daemon: true, ctx: ctx}
	// From here on only cs.call is used (not call): the caller's Call is then garbage
	// while the daemon runs; a sleeping daemon would otherwise keep both.
	_, err := sh.run(cs, fns.fn)
	patch := sh.takeDaemonPatch(sh.L, cs)
	sh.unlock()
	if patch != nil && cs.call.Daemon != nil {
		cs.call.Daemon.Flush(patch)
	}
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// takeDaemonPatch converts what a daemon wrote into ctx.patch since the last flush
// and starts a new patch table. Shard lock held; the caller flushes the result
// after releasing it. L is the calling state (for the logger).
func (s *shard) takeDaemonPatch(L *lua.LState, cs *callState) map[string]any {
	if cs.patchTbl == nil || cs.call.Daemon == nil || cs.call.Daemon.Flush == nil {
		return nil
	}
	prunePatchTable(cs.patchTbl, s.patchMT)
	p, err := luavalue.FromLua(cs.patchTbl)
	cs.patchTbl = nil
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
