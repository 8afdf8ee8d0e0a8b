package luabind

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	lua "github.com/luaop/luaop/third_party/gopher-lua"

	"github.com/luaop/luaop/handling"
	"github.com/luaop/luaop/luabind/internal/luaerr"
	"github.com/luaop/luaop/luabind/internal/luavalue"
	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// callState is the Go side of one call's ctx table.
type callState struct {
	table    *lua.LTable
	call     causes.Call
	fns      *handlerFns
	logger   *slog.Logger
	patchTbl *lua.LTable
	subs     []causes.Spec
	subFns   map[string]*handlerFns
	// subRecords are the record names of subs (recordName), to their ids.
	subRecords map[string]string
	// subFilters are the filters of the subhandlers that have some (by id).
	subFilters map[string]*dataFilters
	// daemon calls outlive their first body: ctx fields are not cached, so each
	// access reads the newest body.
	daemon bool
	// ctx is the caller's context. A daemon's deadline restarts under it after each
	// blocking function (a daemon runs for as long as it sleeps in between).
	ctx context.Context
	// sleep is what luaop.sleep asked for when it yielded; taken by the daemon.
	sleep *daemonSleep
	// A daemon's stop (daemon.go, cancellationPoint): notified once a luaop.sleep
	// returned false to tell it of its stop; cancelled once its cancellation was
	// raised, when cancelLua cancelled ctx (ctx is then the daemon's own, made by
	// StartDaemon) so that no instruction runs after it. Shard lock held for all.
	notified, cancelled bool
	cancelLua           context.CancelFunc
	// raised is the last error value a daemon's Lua raised, and raisedTrace where:
	// its coroutine ends with the value alone (daemon.go, newDaemonEntry).
	raised      lua.LValue
	raisedTrace string
	// adm is set for admission handlers and their filters (admission.go).
	adm *admissionState
	// mem is the call as the memory budget's watchdog sees it.
	mem memCall
	// logBytes counts what the call logged (logSpent); logCapped is set once
	// it went over. A daemon's restart after each blocking function.
	logBytes  int
	logCapped bool
	// memo is the object's memo table and memoView the call's view of it
	// (ctx.memo), made on first use.
	memo, memoView *lua.LTable
}

// body is the body of the call's object: a daemon's newest one (its call outlives
// its first body), or, once that is gone, its identity; the cause's for any other call.
func (cs *callState) body() map[string]any {
	if link := cs.call.Daemon; cs.daemon && link != nil {
		if link.Latest != nil {
			if b := link.Latest(); b != nil {
				return b
			}
		}
		if cs.call.Cause.Body == nil && link.UID != "" {
			return map[string]any{"metadata": map[string]any{"uid": link.UID, "name": link.Name, "namespace": link.Namespace}}
		}
	}
	return cs.call.Cause.Body
}

// lookup finds a handler's functions: registered by the scripts, or a subhandler
// registered by its parent's last call on this object.
func (s *shard) lookup(id, uid string) *handlerFns {
	if fns := s.fns[id]; fns != nil {
		return fns
	}
	return s.subFns[uid][id]
}

// invoke runs one handler with the shard's state.
func (s *shard) invoke(ctx context.Context, call causes.Call) (causes.Result, error) {
	if err := s.lock(ctx); err != nil {
		return causes.Result{}, err
	}
	defer s.unlock()
	uid := uidOf(call.Cause.Body)
	fns := s.lookup(call.Handler.ID, uid)
	if fns == nil {
		return causes.Result{}, &causes.PermanentError{Message: fmt.Sprintf("handler %s is no longer registered (removed by a script reload)", call.Handler.ID)}
	}
	ret, cs, err := s.call(ctx, fns.fn, call, fns)
	defer s.endPatch(cs) // after the result's conversion, which may read it
	// What the handler wrote to ctx.patch before raising is applied too (kopf: the
	// patch is shared by the cycle), whatever the error: temporary, permanent,
	// arbitrary or a timeout.
	if perr := s.mergePatch(cs, call); perr != nil && err == nil {
		err = perr
	}
	if err != nil {
		return causes.Result{}, err
	}
	if call.Handler.Kind == causes.KindStartup && uid == "" {
		s.snapshotOperatorMemo()
	}
	if len(cs.subs) > 0 {
		// kopf: subhandlers whose filters do not match are not part of the parent
		// at all; they do not run and the parent does not wait for them.
		kept := make([]causes.Spec, 0, len(cs.subs))
		for _, sub := range cs.subs {
			ok, err := s.matchSub(ctx, call, sub, cs.subFns[sub.ID], cs.subFilters[sub.ID])
			if err != nil {
				return causes.Result{}, err
			}
			if ok {
				kept = append(kept, sub)
			} else {
				delete(cs.subFns, sub.ID)
			}
		}
		cs.subs = kept
	}
	if len(cs.subs) > 0 {
		objSubs := s.subFns[uid]
		if objSubs == nil {
			objSubs = map[string]*handlerFns{}
			s.subFns[uid] = objSubs
		}
		for id, f := range cs.subFns {
			objSubs[id] = f
		}
	}
	result := causes.Result{Subhandlers: cs.subs}
	if ret == lua.LNil {
		return result, nil
	}
	var out any
	if call.Handler.Kind == causes.KindIndex {
		out, err = indexResult(ret, indexWriteLimits) // keys may be tables, by value (kopf's tuples)
	} else {
		out, err = luavalue.FromLuaLimited(ret, objectWriteLimits)
	}
	if err != nil {
		return causes.Result{}, &causes.PermanentError{Message: fmt.Sprintf("%s: the handler's return value: %s", call.Handler.Source, err)}
	}
	result.Value = out
	return result, nil
}

// matchSub evaluates a subhandler's filters (labels, annotations, field, value,
// old, new, when) for its parent's cause. Shard lock held.
func (s *shard) matchSub(ctx context.Context, call causes.Call, sub causes.Spec, fns *handlerFns, f *dataFilters) (bool, error) {
	if f == nil {
		return true, nil
	}
	cause := handling.SubhandlerView(call.Handler, call.Cause, sub)
	if !f.matchData(cause) {
		return false, nil
	}
	if fns == nil || !fns.hasFilter {
		return true, nil
	}
	ok, err := s.matchCallbacks(ctx, sub, fns, f, cause)
	if err != nil {
		return false, fmt.Errorf("subhandler %s: %w", sub.ID, err)
	}
	return ok, nil
}

// mergePatch converts the call's ctx.patch (if it was touched) into call.Patch.
func (s *shard) mergePatch(cs *callState, call causes.Call) error {
	if cs == nil || cs.patchTbl == nil || call.Patch == nil {
		return nil
	}
	p, err := s.convertPatch(cs)
	if err != nil {
		return &causes.PermanentError{Message: fmt.Sprintf("%s: ctx.patch: %s", call.Handler.Source, err)}
	}
	if m, ok := p.(map[string]any); ok {
		call.Patch.Merge(m)
	}
	return nil
}

// convertPatch converts the call's ctx.patch (auto-vivified tables left empty
// left out: Limits.Vivified), on the bounded path: a cycle is "cycle at
// ctx.patch.x: ...". Shard lock held.
func (s *shard) convertPatch(cs *callState) (any, error) {
	limits := objectWriteLimits
	limits.Root, limits.Vivified = "ctx.patch", s.patchMT
	return luavalue.FromLuaLimited(cs.patchTbl, limits)
}

// objectWriteLimits bound a handler's result and its ctx.patch, each: what goes
// into the object must fit in it. A larger one would be refused by the API server
// (etcd stores at most 1.5 MiB a value), and the handler run again for ever; it
// fails for good instead, naming the handler (issue 34).
var objectWriteLimits = luavalue.Limits{MaxBytes: 1536 << 10,
	Why: "the API server stores at most 1.5 MiB in an object (etcd's limit), so the handler fails for good"}

// indexWriteLimits bound what an index function returns for one object: its
// entries are kept in the operator's memory for as long as the object exists, so
// one object's share is bound as an object is.
var indexWriteLimits = luavalue.Limits{MaxBytes: 1536 << 10,
	Why: "an object's index entries stay in the operator's memory; one object's are bound as an object (1.5 MiB)"}

// endPatch ends the call's ctx.patch once it was converted: its tables are emptied
// and get a metatable that raises, so that a patch kept beyond its call (in a
// global, a memo, a daemon's local across luaop.sleep, which flushes it) fails with
// a clear error instead of losing what is written to it. Shard lock held.
func (s *shard) endPatch(cs *callState) {
	if cs == nil || cs.patchTbl == nil {
		return
	}
	// A loop over the patch's own tables (those with its metatable), each once:
	// the patch may contain itself (ctx.patch.x = ctx.patch) or be deep.
	todo := []*lua.LTable{cs.patchTbl}
	for len(todo) > 0 {
		t := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		if t.Metatable == s.deadPatchMT {
			continue
		}
		t.Metatable = s.deadPatchMT
		delete(s.patchDepth, t)
		clearTable(t, func(v lua.LValue) {
			if child, ok := v.(*lua.LTable); ok && child.Metatable == s.patchMT {
				todo = append(todo, child)
			}
		})
	}
	cs.patchTbl = nil
}

// clearTable removes every entry of t, calling each (when not nil) with each value
// first. No allocation: the next key is taken before the current one is removed.
func clearTable(t *lua.LTable, each func(v lua.LValue)) {
	k, v := t.Next(lua.LNil)
	for k != lua.LNil {
		nk, nv := t.Next(k)
		if each != nil {
			each(v)
		}
		t.RawSet(k, lua.LNil)
		k, v = nk, nv
	}
}

// endCtx ends a call's ctx table when the call ends: the fields it cached are
// dropped, so that every later use goes through the metatable, which refuses a ctx
// that is not the running call's (newCtxMetatable). Shard lock held.
func (s *shard) endCtx(cs *callState) {
	if cs == nil || cs.table == nil {
		return
	}
	clearTable(cs.table, nil)
}

// match runs a handler's filter callbacks (when, label and annotation functions,
// value/old/new functions).
func (s *shard) match(ctx context.Context, spec causes.Spec, f *dataFilters, cause causes.Cause) (bool, error) {
	if err := s.lock(ctx); err != nil {
		return false, err
	}
	defer s.unlock()
	fns := s.fns[spec.ID]
	if fns == nil || !fns.hasFilter {
		return fns != nil, nil
	}
	return s.matchCallbacks(ctx, spec, fns, f, cause)
}

// matchCallbacks runs the filter functions of a handler, in kopf's order: labels,
// annotations, value, old/new, when. Shard lock held.
func (s *shard) matchCallbacks(ctx context.Context, spec causes.Spec, fns *handlerFns, f *dataFilters, cause causes.Cause) (bool, error) {
	return s.matchCallbacksAdm(ctx, spec, fns, f, cause, nil)
}

// matchCallbacksAdm is matchCallbacks whose calls see the admission request adm
// (nil for other handlers). Shard lock held.
func (s *shard) matchCallbacksAdm(ctx context.Context, spec causes.Spec, fns *handlerFns, f *dataFilters, cause causes.Cause, adm *admissionState) (bool, error) {
	call := causes.Call{Handler: spec, Cause: cause}
	fcall := func(fn *lua.LFunction, args ...lua.LValue) (lua.LValue, error) {
		if adm == nil {
			ret, _, err := s.call(ctx, fn, call, fns, args...)
			return ret, err
		}
		// A filter returns one value; its ctx has the request's fields.
		fa := &admissionState{req: adm.req}
		ret, err := s.run(&callState{call: call, fns: fns, logger: call.Logger, ctx: ctx, adm: fa}, fn, args...)
		return ret, err
	}
	meta, _ := cause.Body["metadata"].(map[string]any)
	for _, group := range []struct {
		fns map[string]*lua.LFunction
		raw any
	}{{fns.labelFns, meta["labels"]}, {fns.annotFns, meta["annotations"]}} {
		values, _ := group.raw.(map[string]any)
		for key, fn := range group.fns {
			v, ok := values[key]
			arg := lua.LValue(lua.LNil)
			if ok {
				arg = luavalue.ToLua(s.L, v)
			}
			ret, err := fcall(fn, arg)
			if err != nil {
				return false, fmt.Errorf("filter of %s on %q: %w", spec.ID, key, err)
			}
			if !lua.LVAsBool(ret) {
				return false, nil
			}
		}
	}
	valueArg := func(fv fieldValue) lua.LValue {
		if !fv.present {
			return lua.LNil
		}
		return luavalue.ToLua(s.L, fv.v)
	}
	if fns.valueFn != nil && f != nil {
		// kopf: the value matches when the new or the old one does (new first).
		matched := false
		for _, fv := range f.fieldValues(cause) {
			ret, err := fcall(fns.valueFn, valueArg(fv))
			if err != nil {
				return false, fmt.Errorf("value filter of %s: %w", spec.ID, err)
			}
			if lua.LVAsBool(ret) {
				matched = true
				break
			}
		}
		if !matched {
			return false, nil
		}
	}
	if f != nil && f.change && !cause.Prematch {
		old, new := f.oldNew(cause)
		for _, c := range []struct {
			name string
			fn   *lua.LFunction
			fv   fieldValue
		}{{"old", fns.oldFn, old}, {"new", fns.newFn, new}} {
			if c.fn == nil {
				continue
			}
			ret, err := fcall(c.fn, valueArg(c.fv))
			if err != nil {
				return false, fmt.Errorf("%s filter of %s: %w", c.name, spec.ID, err)
			}
			if !lua.LVAsBool(ret) {
				return false, nil
			}
		}
	}
	if fns.when != nil {
		ret, err := fcall(fns.when)
		if err != nil {
			return false, fmt.Errorf("when filter of %s: %w", spec.ID, err)
		}
		return lua.LVAsBool(ret), nil
	}
	return true, nil
}

// call runs fn(args..., ctx) on a call thread under the handler deadline and maps
// Lua errors to Go errors. Nothing a script does can panic the caller. Shard lock
// held; blocking functions the script calls release it meanwhile.
func (s *shard) call(ctx context.Context, fn *lua.LFunction, call causes.Call, fns *handlerFns, args ...lua.LValue) (lua.LValue, *callState, error) {
	cs := &callState{call: call, fns: fns, logger: call.Logger, ctx: ctx}
	ret, err := s.run(cs, fn, args...)
	return ret, cs, err
}

// bindCall takes a thread for cs and makes cs its call: its ctx table, its handler
// deadline. Shard lock held.
func (s *shard) bindCall(cs *callState) *callThread {
	t := s.getThread()
	cs.table = t.L.CreateTable(0, 8)
	t.L.SetMetatable(cs.table, s.ctxMT)
	t.cs = cs
	s.setDeadline(t, cs.ctx)
	cs.mem.what, cs.mem.sh = cs.call.Handler.ID, s
	return t
}

// run runs one call (cs) on a pooled thread: cs is that thread's call until it ends.
func (s *shard) run(cs *callState, fn *lua.LFunction, args ...lua.LValue) (ret lua.LValue, err error) {
	t := s.bindCall(cs)
	L := t.L
	s.rt.mem.enter(&cs.mem, L.Context(), t.cancel)
	reuse := false
	defer func() {
		s.rt.mem.leave(&cs.mem)
		if r := recover(); r != nil {
			err = fmt.Errorf("%s: internal error while running the handler: %v", cs.call.Handler.ID, r)
		}
		s.putThread(t, reuse)
	}()
	L.Push(fn)
	for _, a := range args {
		L.Push(a)
	}
	L.Push(cs.table)
	nret := 1
	if cs.adm != nil {
		nret = 2 // an admission handler returns false, "message" to reject
	}
	perr := L.PCall(len(args)+1, nret, nil)
	// A thread whose call ended in a Go panic (a call stack overflow is one) may
	// hold a broken stack: not reused.
	reuse = perr == nil || !goPanicked(perr)
	if perr != nil {
		if cs.mem.hit.Load() {
			return lua.LNil, s.rt.mem.budgetError(perr, &cs.mem)
		}
		// The thread's context is the deadline of the last stretch of Lua (a
		// daemon's restarts after every blocking function).
		if L.Context().Err() != nil && cs.ctx.Err() == nil {
			return lua.LNil, timeoutError(perr, s.rt.opts.HandlerTimeout)
		}
		return lua.LNil, luaerr.Translate(perr)
	}
	if nret == 2 {
		cs.adm.second = L.Get(-1)
		return L.Get(-2), nil
	}
	return L.Get(-1), nil
}

// timeoutError keeps the location and makes the deadline recognisable.
func timeoutError(err error, limit time.Duration) error {
	mapped := luaerr.Translate(err)
	return fmt.Errorf("handler exceeded its %s deadline (an endless loop?): %w", limit, mapped)
}

// newCtxMetatable serves the lazy fields of ctx tables. A ctx kept beyond its call
// (stored in memo) reads nil for them.
func (s *shard) newCtxMetatable() *lua.LTable {
	L := s.L
	mt := L.NewTable()
	mt.RawSetString("__index", L.NewFunction(func(L *lua.LState) int {
		t := L.CheckTable(1)
		key := L.CheckString(2)
		cs := s.callOf(L)
		if cs == nil || cs.table != t {
			L.RaiseError("%s", errForeignCtx("ctx."+key))
		}
		v := s.ctxField(L, cs, key)
		if v != lua.LNil && !(cs.daemon && key != "logger" && key != "memo" && key != "stopped") {
			t.RawSetString(key, v)
		}
		L.Push(v)
		return 1
	}))
	mt.RawSetString("__newindex", L.NewFunction(func(L *lua.LState) int {
		t := L.CheckTable(1)
		if cs := s.callOf(L); cs == nil || cs.table != t {
			L.RaiseError("%s", errForeignCtx("ctx."+lua.LVAsString(L.Get(2))))
		}
		t.RawSet(L.CheckAny(2), L.CheckAny(3))
		return 0
	}))
	mt.RawSetString("__metatable", lua.LFalse) // shared by every call's ctx
	return mt
}

// errForeignCtx is the error of a ctx (or its memo or patch) used outside its own
// call: kept in a global, a memo or a closure that runs later.
func errForeignCtx(what string) string {
	return what + ": this ctx belongs to a call that ended (or to another running call): a ctx, its memo and its patch work only during their own call; use the ctx your function receives (keep data in ctx.memo, not the ctx itself)"
}

// newDeadPatchMetatable is the metatable of the tables of a ctx.patch whose call
// ended (endPatch): every use raises.
func (s *shard) newDeadPatchMetatable() *lua.LTable {
	L := s.L
	mt := L.NewTable()
	dead := L.NewFunction(func(L *lua.LState) int {
		L.RaiseError("%s", "ctx.patch: this patch was already applied: its call ended, or, in a daemon, luaop.sleep flushed it; read ctx.patch again after each sleep")
		return 0
	})
	mt.RawSetString("__index", dead)
	mt.RawSetString("__newindex", dead)
	mt.RawSetString("__metatable", lua.LFalse)
	return mt
}

// newMemoMetatable serves the memo views (memoView): each call reading ctx.memo gets
// a view of its object's memo table, valid only while that call runs, so that a
// memo kept in a global or a closure cannot be read or written by another object's
// calls. Indexing, assignment, pairs, ipairs and # go through; the raw functions
// (rawget, rawset, next, table.insert on ctx.memo itself) see the empty view.
func (s *shard) newMemoMetatable() *lua.LTable {
	L := s.L
	mt := L.NewTable()
	memoOf := func(L *lua.LState) *lua.LTable {
		view := L.CheckTable(1)
		cs := s.callOf(L)
		if cs == nil || cs.memoView != view {
			L.RaiseError("%s", errForeignCtx("ctx.memo"))
		}
		return cs.memo
	}
	mt.RawSetString("__index", L.NewFunction(func(L *lua.LState) int {
		L.Push(L.GetTable(memoOf(L), L.Get(2)))
		return 1
	}))
	mt.RawSetString("__newindex", L.NewFunction(func(L *lua.LState) int {
		L.SetTable(memoOf(L), L.CheckAny(2), L.CheckAny(3))
		return 0
	}))
	mt.RawSetString("__len", L.NewFunction(func(L *lua.LState) int {
		L.Push(lua.LNumber(memoOf(L).Len()))
		return 1
	}))
	next := L.NewFunction(func(L *lua.LState) int {
		k, v := memoOf(L).Next(L.Get(2))
		if k == lua.LNil {
			L.Push(lua.LNil)
			return 1
		}
		L.Push(k)
		L.Push(v)
		return 2
	})
	mt.RawSetString("__pairs", L.NewFunction(func(L *lua.LState) int {
		memoOf(L)
		L.Push(next)
		L.Push(L.Get(1))
		L.Push(lua.LNil)
		return 3
	}))
	inext := L.NewFunction(func(L *lua.LState) int {
		i := L.CheckInt(2) + 1
		v := memoOf(L).RawGetInt(i)
		if v == lua.LNil {
			return 0
		}
		L.Push(lua.LNumber(i))
		L.Push(v)
		return 2
	})
	mt.RawSetString("__ipairs", L.NewFunction(func(L *lua.LState) int {
		memoOf(L)
		L.Push(inext)
		L.Push(L.Get(1))
		L.Push(lua.LNumber(0))
		return 3
	}))
	mt.RawSetString("__metatable", lua.LFalse)
	return mt
}

// memoView is ctx.memo of the call: a view of the memo table of its object (or the
// operator memo), made once per call (newMemoMetatable). Shard lock held.
func (s *shard) memoView(L *lua.LState, cs *callState, uid string) lua.LValue {
	if cs.memoView == nil {
		cs.memo = s.memoFor(uid)
		s.nameMemo(uid, cs.body())
		cs.memoView = L.CreateTable(0, 0)
		cs.memoView.Metatable = s.memoMT
	}
	return cs.memoView
}

// ctxRoots name the read-only views of ctx in error messages ("ctx.spec.size is
// read-only: ..."), as constants so that naming them costs nothing per call.
var ctxRoots = map[string]string{
	"body": "ctx.body", "spec": "ctx.spec", "status": "ctx.status", "meta": "ctx.meta", "metadata": "ctx.metadata",
	"labels": "ctx.labels", "annotations": "ctx.annotations", "old": "ctx.old", "new": "ctx.new",
}

func (s *shard) ctxField(L *lua.LState, cs *callState, key string) lua.LValue {
	if cs.adm != nil && (key == "memo" || key == "reason") {
		return s.admissionOverride(L, cs, key)
	}
	call := &cs.call // not a copy: a Call is 584 bytes, read once per ctx field
	body := cs.body()
	meta, _ := body["metadata"].(map[string]any)
	switch key {
	case "body":
		return luavalue.NewProxyNamed(L, body, ctxRoots[key])
	case "spec", "status":
		if v, ok := body[key]; ok {
			return luavalue.NewProxyNamed(L, v, ctxRoots[key])
		}
		return luavalue.NewProxyNamed(L, map[string]any{}, ctxRoots[key])
	case "meta", "metadata":
		return luavalue.NewProxyNamed(L, meta, ctxRoots[key])
	case "labels", "annotations":
		if v, ok := meta[key]; ok {
			return luavalue.NewProxyNamed(L, v, ctxRoots[key])
		}
		return luavalue.NewProxyNamed(L, map[string]any{}, ctxRoots[key])
	case "name", "namespace", "uid", "resourceVersion":
		if v, ok := meta[key].(string); ok {
			return lua.LString(v)
		}
		return lua.LNil
	case "reason":
		if call.Cause.Reason == "" {
			return lua.LNil
		}
		return lua.LString(call.Cause.Reason)
	case "type":
		if call.Cause.EventType == "" {
			return lua.LNil
		}
		return lua.LString(call.Cause.EventType)
	case "old", "new":
		v := call.Cause.Old
		if key == "new" {
			v = call.Cause.New
		}
		if v == nil {
			return lua.LNil // absent (a creation's old value): plain nil, not luaop.null
		}
		return luavalue.NewProxyNamed(L, v, ctxRoots[key])
	case "diff":
		return diffToLua(L, call.Cause.Diff)
	case "patch":
		if cs.patchTbl == nil {
			cs.patchTbl = L.CreateTable(0, 4)
			L.SetMetatable(cs.patchTbl, s.patchMT)
		}
		return cs.patchTbl
	case "stopped":
		var stopped context.Context // nil: only a daemon is ever asked to stop
		if call.Daemon != nil {
			stopped = call.Daemon.Stopped
		}
		return L.NewFunction(func(L *lua.LState) int {
			L.Push(lua.LBool(stopped != nil && stopped.Err() != nil))
			return 1
		})
	case "indexes":
		return s.indexesTable(L, call)
	case "related":
		return relatedToLua(L, call.Cause)
	case "memo":
		return s.memoView(L, cs, uidOf(body))
	case "logger":
		return s.logger
	case "retry":
		return lua.LNumber(call.Retry)
	case "started":
		if call.Started.IsZero() {
			return lua.LNil
		}
		return lua.LNumber(float64(call.Started.UnixNano()) / 1e9)
	case "runtime":
		return lua.LNumber(call.Runtime.Seconds())
	case "id":
		return lua.LString(call.Handler.ID)
	case "param":
		if cs.fns != nil {
			return cs.fns.param
		}
	case "resource":
		return lua.LString(call.Handler.Resource.String())
	case "operation", "userinfo", "dryrun", "subresource", "warnings", "headers", "sslpeer":
		return s.admissionField(L, cs, key)
	case "subhandler":
		if call.Handler.Kind != causes.KindChange {
			return lua.LNil
		}
		return L.NewFunction(func(L *lua.LState) int { return s.registerSubhandler(L, cs) })
	}
	return lua.LNil
}

func diffToLua(L *lua.LState, d state.Diff) lua.LValue {
	t := L.CreateTable(len(d), 0)
	for _, item := range d {
		e := L.CreateTable(0, 4)
		e.RawSetString("op", lua.LString(item.Op))
		path := L.CreateTable(len(item.Path), 0)
		for _, p := range item.Path {
			path.Append(lua.LString(p))
		}
		e.RawSetString("field", path)
		e.RawSetString("path", lua.LString(strings.Join(item.Path, ".")))
		// An added field has no old value and a removed one no new value: plain nil
		// (as ctx.old on a creation), not luaop.null.
		if item.Old != nil {
			e.RawSetString("old", luavalue.ToLua(L, item.Old))
		}
		if item.New != nil {
			e.RawSetString("new", luavalue.ToLua(L, item.New))
		}
		t.Append(e)
	}
	return t
}

// newPatchMetatable makes ctx.patch auto-vivifying, like kopf's patch object:
// ctx.patch.status.phase = "Ready" works without creating status first.
func (s *shard) newPatchMetatable() *lua.LTable {
	L := s.L
	mt := L.NewTable()
	mt.RawSetString("__index", L.NewFunction(func(L *lua.LState) int {
		t := L.CheckTable(1)
		k := L.Get(2)
		// A chain read deeper than a conversion goes (p = p.x in a loop) fails
		// here, at its line, before it builds the tables.
		depth := s.patchDepth[t] + 1
		if depth >= maxPatchDepth {
			L.RaiseError("ctx.patch: nested deeper than %d levels (reading %s of a table %d levels down)", maxPatchDepth, lua.LVAsString(k), depth-1)
		}
		child := L.CreateTable(0, 4)
		L.SetMetatable(child, mt)
		s.patchDepth[child] = depth
		t.RawSet(k, child)
		L.Push(child)
		return 1
	}))
	mt.RawSetString("__metatable", lua.LFalse) // shared by every call's patch
	return mt
}

// maxPatchDepth bounds the nesting of ctx.patch's auto-vivified tables: as deep as
// a conversion goes (luavalue's maxDepth).
const maxPatchDepth = 100

// newLogger builds the table of ctx.logger (scripts get a read-only view of it,
// s.logger): debug/info/warn/error write to the logger of the call
// in progress, which is tagged with the object and the handler; messages at or above
// Options.LogEvents are also posted as Events of the object (postLogEvent). Both
// ctx.logger.info("x") and ctx.logger:info("x") work.
func (s *shard) newLogger() *lua.LTable {
	L := s.L
	t := L.NewTable()
	for name, level := range map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "warning": slog.LevelWarn, "error": slog.LevelError} {
		level := level
		t.RawSetString(name, L.NewFunction(func(L *lua.LState) int {
			start := 1
			if self := L.Get(1); L.GetTop() >= 1 && (self == t || self == s.logger) {
				start = 2
			}
			msg, fields, ok := s.logMessage(L, start)
			if !ok {
				return 0
			}
			s.log(L).Log(L.Context(), level, msg, fields...)
			s.postLogEvent(L, level, msg)
			return 0
		}))
	}
	return t
}

// maxLogBytesPerCall bounds what one call (a daemon: one stretch between two
// blocking functions) may write through ctx.logger and print: a loop logging a large
// string wrote about 140 MB a call. What is over is dropped, with one warning.
const maxLogBytesPerCall = 1 << 20

// logMessage builds a ctx.logger message from the arguments from start on (their
// texts joined by spaces) and its fields (a last plain table), counted as they are
// built against what is left of the call's log budget (logBudget): a message over
// it is never built; it and the call's later messages are dropped, with one
// warning. Shard lock held.
func (s *shard) logMessage(L *lua.LState, start int) (string, []any, bool) {
	top := L.GetTop()
	budget, left := s.logBudget(L)
	fields, hasFields, err := logFields(L, start, top, budget)
	if hasFields {
		top--
	}
	msg := ""
	if err == nil {
		args := make([]lua.LValue, 0, max(top-start+1, 0))
		for i := start; i <= top; i++ {
			args = append(args, L.Get(i))
		}
		msg, err = budget.Join(L, args, " ")
	}
	return msg, fields, s.logSpent(L, budget, left, err)
}

// printMessage is logMessage for print(...): arguments joined by tabs.
func (s *shard) printMessage(L *lua.LState, args []lua.LValue) (string, bool) {
	budget, left := s.logBudget(L)
	msg, err := budget.Join(L, args, "\t")
	return msg, s.logSpent(L, budget, left, err)
}

// logBudget is the budget of one message: what is left of the call's log budget
// (maxLogBytesPerCall a call; outside a call, while the scripts load, the same for
// each message), and how much that is.
func (s *shard) logBudget(L *lua.LState) (*luavalue.Budget, int) {
	left := maxLogBytesPerCall
	if cs := s.callOf(L); cs != nil {
		left -= cs.logBytes
	}
	return luavalue.NewBudget(luavalue.Limits{MaxBytes: max(left, 1)}), left
}

// logSpent counts what a message's budget used against the call's log budget and
// tells whether the message may be written: not when building it failed (err) or
// the call's budget is spent. A message over the budget logs the warning (once a
// call) instead; another failure (a __tostring that raised or returned a table) is
// raised. Shard lock held.
func (s *shard) logSpent(L *lua.LState, budget *luavalue.Budget, left int, err error) bool {
	if err != nil && !errors.Is(err, luavalue.ErrTooLarge) {
		L.RaiseError("%s", err.Error())
	}
	cs := s.callOf(L)
	_, used := budget.Used()
	if err == nil && left > 0 {
		if cs != nil {
			cs.logBytes += used
		}
		return true
	}
	if cs == nil {
		s.log(L).Warn(fmt.Sprintf("a log message over %s dropped: %v", FormatBytes(maxLogBytesPerCall), err), "source", s.where(L))
		return false
	}
	cs.logBytes = maxLogBytesPerCall + 1
	if !cs.logCapped {
		cs.logCapped = true
		s.log(L).Warn(fmt.Sprintf("log budget of this call reached (%s): further ctx.logger and print messages of the call are dropped", FormatBytes(maxLogBytesPerCall)), "source", s.where(L))
	}
	return false
}

// registerSubhandler is ctx.subhandler(fn, {id = "...", retries = ..., ...}): a child
// handler of the running one, with its own persisted progress, run after it.
func (s *shard) registerSubhandler(L *lua.LState, cs *callState) int {
	if s.callOf(L) != cs {
		L.RaiseError("ctx.subhandler can only be called while its handler runs")
	}
	fn := L.CheckFunction(1)
	opts := L.OptTable(2, nil)
	parent := cs.call.Handler
	spec := causes.Spec{Kind: causes.KindChange, Resource: parent.Resource, Reasons: parent.Reasons, Field: parent.Field, Source: s.where(L)}
	fns := &handlerFns{fn: fn, param: lua.LNil}
	filters := &dataFilters{}
	if opts != nil {
		s.applyOptions(L, &spec, fns, filters, opts)
	}
	fns.setHasFilter()
	filters.hasCallbacks = fns.hasFilter
	if spec.ID == "" {
		spec.ID = fmt.Sprintf("sub%d", len(cs.subs)+1)
	}
	if !validID.MatchString(spec.ID) || strings.Contains(spec.ID, "/") {
		L.RaiseError("subhandler id %q: use letters, digits, '_', '-' and '.' only", spec.ID)
	}
	spec.ID = parent.ID + "/" + spec.ID
	name := recordName(spec.ID)
	// By id and by record name (maps: thousands of subhandlers register in linear
	// time, issue 34).
	if _, dup := cs.subFns[spec.ID]; dup {
		L.RaiseError("duplicate subhandler id %q", spec.ID)
	}
	if prev, clash := cs.subRecords[name]; clash {
		L.RaiseError("subhandler id %q would share its progress record with subhandler %q (in annotations both are %s); give one of them another id", spec.ID, prev, name)
	}
	if other, clash := s.records[name]; clash {
		L.RaiseError("subhandler id %q would share its progress record with handler %q (in annotations both are %s); give one of them another id", spec.ID, other, name)
	}
	if cs.subFns == nil {
		cs.subFns = map[string]*handlerFns{}
		cs.subRecords = map[string]string{}
	}
	cs.subRecords[name] = spec.ID
	cs.subs = append(cs.subs, spec)
	cs.subFns[spec.ID] = fns
	if !filters.empty() {
		if cs.subFilters == nil {
			cs.subFilters = map[string]*dataFilters{}
		}
		cs.subFilters[spec.ID] = filters
	}
	return 0
}

// reservedLogKeys are the fields luaop's log lines carry themselves: a script's
// field of that name is written as "field.<name>" instead, so that it never
// shadows them (JSON logs would hold the key twice).
var reservedLogKeys = map[string]bool{"time": true, "level": true, "msg": true, "resource": true, "kind": true,
	"namespace": true, "name": true, "uid": true, "handler": true, "reason": true, "error": true, "source": true}

// logFields reads the structured fields of ctx.logger.info("msg", {key = value}):
// the last argument, when it follows a message and is a plain table (no metatable:
// not ctx.spec or another view) with string keys. Values keep their types (numbers,
// booleans, strings, nested tables) in JSON logs. They are converted against the
// message's budget (logMessage): a value over it fails the whole message.
func logFields(L *lua.LState, start, top int, budget *luavalue.Budget) ([]any, bool, error) {
	if top <= start {
		return nil, false, nil
	}
	t, ok := L.Get(top).(*lua.LTable)
	if !ok || L.GetMetatable(t) != lua.LNil {
		return nil, false, nil
	}
	var keys []string
	values := map[string]lua.LValue{}
	allStrings := true
	t.ForEach(func(k, v lua.LValue) {
		ks, isString := k.(lua.LString)
		if !isString {
			allStrings = false
			return
		}
		keys = append(keys, string(ks))
		values[string(ks)] = v
	})
	if !allStrings || len(keys) == 0 {
		return nil, false, nil
	}
	sort.Strings(keys)
	attrs := make([]any, 0, 2*len(keys))
	for _, k := range keys {
		v, err := budget.FromLua(values[k])
		if errors.Is(err, luavalue.ErrTooLarge) {
			return nil, true, fmt.Errorf("field %s: %w", k, err)
		}
		if err != nil { // a function, a cycle: written as tostring writes it
			if v, err = budget.Text(L, values[k]); err != nil {
				return nil, true, fmt.Errorf("field %s: %w", k, err)
			}
		}
		key := k
		if reservedLogKeys[key] {
			key = "field." + key
		}
		attrs = append(attrs, key, v)
	}
	return attrs, true, nil
}

// goPanicked tells whether a call's error is a Go panic gopher-lua recovered.
func goPanicked(err error) bool {
	var apiErr *lua.ApiError
	return errors.As(err, &apiErr) && apiErr.Type == lua.ApiErrorPanic
}
