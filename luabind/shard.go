package luabind

import (
	"context"
	"fmt"
	"log/slog"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	lua "github.com/luaop/luaop/third_party/gopher-lua"

	"github.com/luaop/luaop/luabind/internal/luaerr"
	"github.com/luaop/luaop/luabind/internal/luavalue"
	"github.com/luaop/luaop/luabind/internal/sandbox"
	"github.com/luaop/luaop/processing/causes"
)

// shard owns one Lua state. Every use of L, of its threads and of the tables below
// happens with the shard lock held (see doc.go, "Concurrency").
type shard struct {
	rt  *Runtime
	idx int

	// sched is the shard lock: handed over in turn, its holder preempted when it
	// holds it too long while others wait (schedule.go).
	sched *stateLock
	// turnStart is L.G.Instructions when the current holder took the state: a
	// turn runs minTurnInstructions before it may be preempted. Shard lock.
	turnStart uint64
	closed    bool // set by Runtime.Close: no call may start any more
	// stuck is closed when a call held the shard past its deadline, swapped when a
	// new shard took its place (stuck.go).
	stuck, swapped chan struct{}
	stuckOnce      sync.Once
	L              *lua.LState
	// memos are the object memos by uid; they survive reloads. A Go map, not a Lua
	// table: gopher-lua's tables never forget a string key once set (setting it to nil
	// leaves it in the table's key list), so a table keyed by uid would grow with
	// every object ever seen.
	memos map[string]*lua.LTable
	// memoNames name the objects of memos (namespace/name by uid), for the
	// measurement of whose memory it is (holders.go).
	memoNames map[string]string
	// held are the values each file of the serving scripts holds across calls:
	// its globals and its value as a module (holders.go), by file.
	held map[string]*heldByFile
	// opMemo is the memo of operator-level hooks (startup, cleanup, probe).
	opMemo *lua.LTable
	module *lua.LTable // the `luaop` module of this state (Go and the prelude use it)
	// iso gives each script its own globals and read-only views of the shared
	// libraries and of the module (sandbox.Isolation).
	iso *sandbox.Isolation
	fns map[string]*handlerFns
	// records maps the record names of the handlers in fns to their ids (recordName).
	records map[string]string
	// subFns are the subhandlers registered by the last call of their parents, per
	// object uid: closures live only as long as the parent's registration.
	subFns map[string]map[string]*handlerFns
	// collecting is set while scripts load: registrations go there.
	collecting *collected
	// threads maps every call thread of this state (see thread.go) to its slot,
	// which names the call running on it; idle are the threads ready for reuse.
	threads map[*lua.LState]*callThread
	idle    []*callThread

	ctxMT, patchMT *lua.LTable
	// patchDepth is the depth of each auto-vivified table of the ctx.patch of the
	// calls running (newPatchMetatable), until its call ends (endPatch).
	patchDepth map[*lua.LTable]int
	// deadPatchMT ends a ctx.patch after its call, memoMT serves memo views.
	deadPatchMT, memoMT *lua.LTable
	// daemonEntry and daemonSetup start every daemon's coroutine (daemon.go).
	daemonEntry, daemonSetup *lua.LFunction
	// parked are the wake-ups of this shard's sleeping daemons (yielded, holding no
	// goroutine), for Runtime.Close to wake them.
	parked map[*daemonWake]struct{}
	logger lua.LValue // ctx.logger: a read-only view, shared by every call
}

// handlerFns are the Lua values of one handler in one shard.
type handlerFns struct {
	fn       *lua.LFunction
	when     *lua.LFunction
	labelFns map[string]*lua.LFunction
	annotFns map[string]*lua.LFunction
	// value, old and new filters given as functions(value, ctx)
	valueFn, oldFn, newFn *lua.LFunction
	param                 lua.LValue
	hasFilter             bool
	// maps are the functions of mapped relations by related resource (as the
	// script spells it); anyOwner is on.related's controller = false.
	maps     map[string]*lua.LFunction
	anyOwner bool
}

// same tells whether two registrations have the same functions and param (Lua
// values by identity).
func (f *handlerFns) same(g *handlerFns) bool {
	sameFns := func(a, b map[string]*lua.LFunction) bool {
		if len(a) != len(b) {
			return false
		}
		for k, fn := range a {
			if b[k] != fn {
				return false
			}
		}
		return true
	}
	return f.fn == g.fn && f.when == g.when && f.valueFn == g.valueFn && f.oldFn == g.oldFn && f.newFn == g.newFn &&
		f.param == g.param && sameFns(f.labelFns, g.labelFns) && sameFns(f.annotFns, g.annotFns)
}

func (f *handlerFns) setHasFilter() {
	f.hasFilter = f.when != nil || len(f.labelFns) > 0 || len(f.annotFns) > 0 ||
		f.valueFn != nil || f.oldFn != nil || f.newFn != nil
}

// collected is what one run of the scripts registered.
type collected struct {
	specs []causes.Spec
	hooks []causes.Spec
	// admission are the validate and mutate handlers, in registration order.
	admission []causes.Spec
	// reads are the declared reads (luaop.reads), once each.
	reads   []causes.Read
	filters map[string]*dataFilters
	fns     map[string]*handlerFns
	sources map[string]string // id -> file:line, for duplicate errors
	records map[string]string // recordName(id) -> id, for ids sharing a record
	stems   map[string]int    // default-id counters
	// reach are the handlers' reach hashes (reach.go), by id: computed by the
	// first shard only (stage's reach).
	reach map[string]reachEntry
}

// shardGeneration is a staged load, committed when every shard succeeded.
type shardGeneration struct {
	fns map[string]*handlerFns
	// records are the handlers' record names (recordName) -> ids.
	records map[string]string
	// held is how long staging held the shard: its calls waited at most that long.
	held time.Duration
	// files are what each file of the load holds (moduleLoader.files).
	files map[string]*heldByFile
}

// heldByFile is what a file of a load holds across calls: its global environment
// and, once it ran as a module, its value.
type heldByFile struct {
	env   *lua.LTable
	value lua.LValue
}

func newShard(rt *Runtime, idx int) *shard {
	s := &shard{rt: rt, idx: idx, stuck: make(chan struct{}), swapped: make(chan struct{}), threads: map[*lua.LState]*callThread{}, parked: map[*daemonWake]struct{}{}}
	s.L = sandbox.NewState(sandbox.Options{
		MaxStringSize: rt.opts.MaxStringSize,
		Print: func(L *lua.LState, args []lua.LValue) {
			if msg, ok := s.printMessage(L, args); ok {
				s.log(L).Info(msg)
			}
		},
	})
	s.sched = newStateLock(rt.clock, s.L.RequestPreempt)
	s.L.G.Preempt = s.preempt
	s.memos = map[string]*lua.LTable{}
	s.memoNames = map[string]string{}
	s.patchDepth = map[*lua.LTable]int{}
	s.opMemo = s.L.NewTable()
	s.module = s.newModule()
	s.ctxMT = s.newCtxMetatable()
	s.patchMT = s.newPatchMetatable()
	s.deadPatchMT = s.newDeadPatchMetatable()
	s.memoMT = s.newMemoMetatable()
	s.newDaemonEntry()
	listMT, objectMT := luavalue.Markers(s.L)
	s.iso = sandbox.NewIsolation(s.L, s.module, listMT, objectMT)
	s.logger = s.iso.View(s.L, "ctx.logger", s.newLogger())
	s.fns = map[string]*handlerFns{}
	s.subFns = map[string]map[string]*handlerFns{}
	return s
}

// log is the logger of the call running on L, or the runtime's.
func (s *shard) log(L *lua.LState) *slog.Logger {
	if cs := s.callOf(L); cs != nil && cs.logger != nil {
		return cs.logger
	}
	return s.rt.opts.Logger
}

// moduleName maps a script path to its require() name: "lib/util.lua" -> "lib.util",
// "lib/init.lua" -> "lib".
func moduleName(file string) string {
	name := strings.TrimSuffix(file, path.Ext(file))
	name = strings.TrimSuffix(name, "/init")
	return strings.ReplaceAll(name, "/", ".")
}

// stage runs the scripts of this state, each file in a fresh global environment of
// its own (sandbox.Isolation). Top-level files are the handler scripts, run in name
// order; files in subfolders are modules that only run when required, once per load, their
// value shared by every file that requires them. Globals of the previous load are not
// visible. With reach, it also computes what each handler can reach (reach.go),
// while it holds the state.
func (s *shard) stage(ctx context.Context, files []string, protos map[string]*lua.FunctionProto, reach *reachInput) (*shardGeneration, *collected, error) {
	if err := s.lock(ctx); err != nil {
		return nil, nil, fmt.Errorf("loading the scripts: %w", err)
	}
	defer s.unlock()
	locked := time.Now()
	L := s.L
	ld := s.newModuleLoader(L, files, protos)

	n := len(s.fns) // the previous load's handlers: a reload registers about as many
	col := &collected{filters: map[string]*dataFilters{}, fns: make(map[string]*handlerFns, n),
		sources: make(map[string]string, n), records: make(map[string]string, n), stems: make(map[string]int, n)}
	s.collecting = col
	defer func() { s.collecting = nil }()
	cctx, cancel := context.WithTimeout(ctx, s.rt.opts.HandlerTimeout)
	defer cancel()
	L.SetContext(cctx)
	defer L.RemoveContext()
	s.rt.mem.enter(ld.mc, cctx, cancel)
	defer s.rt.mem.leave(ld.mc)
	defer L.SetTop(0)
	for _, f := range files {
		if strings.Contains(f, "/") {
			continue
		}
		if _, err := ld.run(L, f); err != nil {
			return nil, nil, err
		}
	}
	ld.keepOnlyLazy()
	if reach != nil {
		col.reach = reach.hashes(col)
	}
	return &shardGeneration{fns: col.fns, records: col.records, held: time.Since(locked), files: ld.files}, col, nil
}

// moduleLoader runs the files of one load: the handler scripts, and the modules
// they require, once per load.
type moduleLoader struct {
	s        *shard
	byModule map[string]string // require() name -> file
	protos   map[string]*lua.FunctionProto
	loaded   map[string]lua.LValue
	// loading: the modules whose top level is running, and the state running it.
	loading map[string]*lua.LState
	require *lua.LFunction
	mc      *memCall
	// files are what each file that ran holds (its environment, its value): the
	// shard's held once the load is committed, kept up to date as modules are
	// required later.
	files map[string]*heldByFile
}

func (s *shard) newModuleLoader(L *lua.LState, files []string, protos map[string]*lua.FunctionProto) *moduleLoader {
	ld := &moduleLoader{s: s, byModule: make(map[string]string, len(files)), protos: protos,
		loaded: make(map[string]lua.LValue, len(files)), loading: map[string]*lua.LState{},
		mc: &memCall{what: "loading the scripts", sh: s}, files: map[string]*heldByFile{}}
	for _, f := range files {
		ld.byModule[moduleName(f)] = f
	}
	ld.require = L.NewFunction(ld.requireModule)
	return ld
}

// run runs a file's top level on L: the shard's main state while the scripts load,
// or, for a module first required inside a handler, the calling thread, so that
// the call's deadline and memory watch apply and the module's blocking functions
// release the shard as the call's own do.
func (ld *moduleLoader) run(L *lua.LState, file string) (lua.LValue, error) {
	s := ld.s
	mod := moduleName(file)
	if v, ok := ld.loaded[mod]; ok {
		return v, nil
	}
	if by := ld.loading[mod]; by != nil {
		if s.threadOf(by) != s.threadOf(L) {
			return nil, fmt.Errorf("%s: module '%s' is still being loaded by another call, which waits in the module's top level (luaop.sleep, luaop.kube); require it at the top of a script so that it loads once, with the scripts", file, mod)
		}
		return nil, fmt.Errorf("%s: require loop: module '%s' requires itself", file, mod)
	}
	ld.loading[mod] = L
	defer delete(ld.loading, mod)
	if t := s.threadOf(L); t != nil { // not preempted half-way (shard.preempt)
		t.modules++
		defer func() { t.modules-- }()
	}
	fn := L.NewFunctionFromProto(ld.protos[file])
	fn.Env = s.iso.NewEnv(L, ld.require)
	held := &heldByFile{env: fn.Env}
	ld.files[file] = held
	L.Push(fn)
	if err := L.PCall(0, 1, nil); err != nil {
		if ld.mc.hit.Load() {
			return nil, s.rt.mem.budgetError(err, ld.mc)
		}
		return nil, luaerr.Translate(err)
	}
	v := L.Get(-1)
	L.Pop(1)
	if v == lua.LNil {
		v = lua.LTrue
	}
	ld.loaded[mod] = v
	held.value = v
	return v, nil
}

// requireModule is the scripts' require(name): luaop's module, or a file of the
// scripts folder run once.
func (ld *moduleLoader) requireModule(L *lua.LState) int {
	name := L.CheckString(1)
	if name == "luaop" {
		L.Push(ld.s.iso.Module())
		return 1
	}
	file, ok := ld.byModule[name]
	if !ok {
		L.RaiseError("module '%s' not found in the scripts folder (looked for %s.lua and %s/init.lua)", name,
			strings.ReplaceAll(name, ".", "/"), strings.ReplaceAll(name, ".", "/"))
	}
	v, err := ld.run(L, file)
	if err != nil {
		L.RaiseError("%s", err.Error())
	}
	L.Push(v)
	return 1
}

// keepOnlyLazy drops the compiled files that ran: require stays callable from
// handlers (a module may be required lazily), and every closure of this load keeps
// it through its file's globals: a daemon started now keeps this load alive for as
// long as it runs. It needs only the modules not loaded yet, not every compiled file
// of the load.
func (ld *moduleLoader) keepOnlyLazy() {
	lazy := map[string]*lua.FunctionProto{}
	for f, p := range ld.protos {
		if _, done := ld.loaded[moduleName(f)]; !done {
			lazy[f] = p
		}
	}
	ld.protos = lazy
}

func (s *shard) commit(g *shardGeneration) {
	s.relock()
	s.fns, s.records, s.held = g.fns, g.records, g.files
	s.unlock()
}

// memoFor returns the memo table of an object, creating it on first use.
func (s *shard) memoFor(uid string) *lua.LTable {
	if uid == "" {
		return s.opMemo
	}
	if m, ok := s.memos[uid]; ok {
		return m
	}
	m := s.L.NewTable()
	// kopf: the operator memo (filled by startup handlers) is shallow-copied into
	// every object's memo when that memo is created. Lua values cannot cross
	// states, so each object gets its own copy of each value.
	if seed := s.rt.opMemo.Load(); seed != nil {
		for _, k := range seed.keys {
			m.RawSetString(k, luavalue.ToLua(s.L, seed.values[k]))
		}
	}
	s.memos[uid] = m
	return m
}

// operatorMemo is a snapshot of the operator memo, as Go values, taken after each
// successful startup handler.
type operatorMemo struct {
	keys   []string
	values map[string]any
}

// snapshotOperatorMemo records the hook shard's operator memo for the object memos
// created from now on. Values that are not data (functions, coroutines) cannot be
// copied to other Lua states: they are left out, with a warning. Shard lock held.
func (s *shard) snapshotOperatorMemo() {
	snap := &operatorMemo{values: map[string]any{}}
	s.opMemo.ForEach(func(k, v lua.LValue) {
		key, ok := k.(lua.LString)
		if !ok {
			return
		}
		val, err := luavalue.FromLua(v)
		if err != nil {
			s.rt.opts.Logger.Warn("ctx.memo."+string(key)+" set by a startup handler is not copied into the objects' memos: only data (strings, numbers, booleans, tables of them) can be", "error", err)
			return
		}
		snap.keys = append(snap.keys, string(key))
		snap.values[string(key)] = val
	})
	sort.Strings(snap.keys)
	s.rt.opMemo.Store(snap)
}
