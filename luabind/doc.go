// Package luabind runs the operator's Lua scripts: it loads them, collects the
// handlers they register through the `luaop` module, and calls those handlers with a
// kopf-like context (body, spec, meta, status, patch, logger, memo, ...).
//
// # Ownership of Lua states
//
// A gopher-lua LState is not safe for concurrent use, and Lua values cannot move
// between states. The Runtime therefore keeps a fixed set of shards (by default one
// per CPU); each shard owns one LState behind a lock, and every object is pinned to
// one shard by a hash of its UID. Operator-level hooks (startup, cleanup, probe: uid
// "") have one more shard of their own. So:
//   - many objects run in parallel, one running Lua per shard at a time, on every
//     core, and any number of calls per shard waiting on I/O or timers;
//   - an object's memo is an ordinary Lua table living in its shard's state, kept
//     across calls and across reloads, and never copied;
//   - a handler call never waits for a state to be created (about 180 us each).
//
// Scripts are compiled once (a FunctionProto is read-only and shared; it is cached by
// name and content, so a reload compiles only the files that changed) and run in
// every shard, the shards in parallel, each shard getting its own closures. A load is
// atomic: all files must compile, run and register without error in every shard, or
// nothing changes.
//
// What outlives a load: a daemon keeps running the code of the load it started in
// (reloads do not restart it), so it keeps its own file's closures and globals, and
// through the file's require the modules of that load (those loaded, so that require
// keeps returning the same value, and those not loaded yet), nothing else of it. A
// module first required inside a handler runs its top level on the calling thread, as
// part of that call (its deadline, its memory watch, its blocking functions).
// Compiled prototypes are trimmed to their size (gopher-lua's compiler leaves about
// 17 KB of buffers in each). Object memos live in a Go map by uid, not a Lua table
// (gopher-lua tables never forget a key). TestReloadsLeaveNoOldScriptsBehind,
// TestDaemonsKeepOnlyTheirOwnCode and TestForgottenObjectsLeaveNoMemory hold these.
//
// # Concurrency
//
// Who owns what:
//   - The shard lock (shard.sched, a stateLock: see "Scheduling" below) protects
//     the shard's LState, every thread made from it, and every Lua value and Go
//     table reached from them: globals, memos, the registered functions,
//     subhandlers, the thread pool, the per-call state. Lua runs only with it held.
//   - Every call (a change, field or event handler, a filter, a hook, a timer, an
//     index function, a daemon) runs on a thread of its shard (LState.NewThread: its
//     own stack and its own context, the shard's globals), taken from a per-shard
//     pool and given back when the call ends. The call's state (callState: the ctx
//     table, logger, patch table, subhandlers) hangs off that thread; Go functions
//     find it from the state they are called with (shard.callOf, which also follows
//     coroutines a script made back to their call thread). There is no "current
//     call" of a shard.
//   - The handler deadline (Options.HandlerTimeout) is the thread's context
//     (SetContext, a callDeadline): it counts the call's own time, see
//     "Scheduling". A daemon's deadline restarts after each blocking function: it
//     bounds each stretch of Lua between two waits. luaop.sleep ends a daemon's
//     stretch before it parks (shard.endStretch): while it sleeps, its thread's context is the daemon's own,
//     with no deadline or timer; it keeps its thread and call state (which holds a
//     copy of the Call: the caller's is not referenced).
//   - A daemon runs as a coroutine (daemon.go, daemonCall): started and resumed with
//     LState.Resume by whichever goroutine holds the shard lock for it, never two at
//     once. luaop.sleep at the top level of its Lua yields: the daemon is then
//     parked with no goroutine and no lock, owned by its wake-up (daemonWake: a
//     timer and two context.AfterFunc callbacks, the first to fire wins by a
//     compare-and-swap and takes the shard lock to resume it) and listed in the
//     shard's parked set (shard lock) for Runtime.Close. Where a yield cannot cross
//     Go frames (pcall, an iterator, a metamethod: shard.canYield counts the VM's
//     loops on the Go stack) luaop.sleep blocks as below. G.CurrentThread (which
//     only Resume reads: scripts have no coroutine library) is gopher-lua's to set;
//     advance resets it before each Resume.
//   - A stopped daemon (call.Daemon.Stopped) is told once: a luaop.sleep returns
//     false (callState.notified); once call.Daemon.Cancelled has ended too, the
//     API's blocking functions are its cancellation points (shard.cancellationPoint,
//     shard.blockingPoint): the next one cancels the daemon's own context
//     (callState.cancelLua) and raises, so that no instruction runs after a pcall
//     that caught it, and advance reports causes.ErrDaemonCancelled. ctx.logger and
//     index reads are no cancellation points.
//
// Which functions release the shard: every API function that waits goes through
// shard.blocking, which converts nothing itself but releases the shard around a Go
// function and takes it back before returning to Lua: luaop.kube.get, list, create,
// patch, delete, apply; luaop.event, info, warn, exception (events); luaop.sleep, in
// handlers and daemons alike (in a daemon it first hands ctx.patch to call.Daemon.Flush).
// Such functions convert their Lua arguments to Go values before releasing and push
// results after taking the shard back; the Go function in between must not touch any
// Lua value. This is not a yield, so it works inside pcall (luaop.sleep in a daemon
// yields instead where it can, above). A new blocking function
// must use shard.blocking too. While a call is parked there, other calls run on
// other threads of the shard; each thread keeps its own stack and context. Scripts loading (Load, on the main state, never on a
// call thread) do not release the shard: a load sees no other call.
//
// Admission handlers (luaop.on.validate, luaop.on.mutate; admission.go) are calls
// like the others: Runtime.Admit runs one on a thread of the object's shard (by uid;
// a creation, which has none yet, by namespace and name), under the caller's
// context, which carries a deadline below the webhook's timeout, and the handler
// deadline. Their filters and the handler run under one hold of the shard; the
// functions they call release it as above. In a dry-run request the luaop.kube
// writes and Events go through DryRunKube (logged, not sent).
//
// Taking the lock: a call takes it under its caller's context and fails with that
// context's error if it ends first ("lua state N stayed busy with other calls": a
// caller never hangs on a busy state); a call returning from a blocking function or
// preempted takes it back unconditionally (every holder gives it up within its
// slice while others wait, or, a load, within its deadline). Runtime.Forget may be
// called from any goroutine holding no lock; Runtime.Close works while calls are
// parked (they fail when they come back; daemons asleep in a yield end at once with
// errClosed).
//
// # Scheduling
//
// The lock is handed over in turn (schedule.go, stateLock): calls that want the
// state while another holds it wait in line, in the order they asked, whether they
// start, come back from a blocking function or were preempted. A call holding the
// state while another waits is preempted once it held it for its slice (10 ms;
// 1 ms for the rest of a call preempted once): the patched gopher-lua calls the
// state's Preempt hook (shard.preempt) at its next instruction, and the call goes
// back in line like a call returning from a blocking function (shard.away). So a
// runaway (an endless loop, a long computation) delays each call of its state by
// about 1 ms each time that call takes the state, not by the runaway's deadline
// (BenchmarkInnocentCallNextToRunaway). Not preempted: script loads (a load sees
// no other call) and a module's top level first required inside a call (a second
// require must not find it half-way); a single Go function (a decode, a pattern
// match) runs to its end, bounded in size and by the deadline (Budgets). What a
// script sees: its Lua runs without another call of its state in between until it
// has run both 10 ms and minTurnInstructions (100,000) instructions since taking
// the state; the count keeps a short stretch whole on a loaded machine, where a
// goroutine may be descheduled past its slice. Longer, other calls may run between
// two of its instructions, as they do during its blocking functions.
//
// Lua values cannot move between states (and a memo, a parked call's stack, the
// subhandlers an object registered live in its state), so no call moves to another
// state: turns are what keeps one call from holding up the others.
//
// The handler deadline counts the call's own time: while it runs Lua and while it
// waits in its own blocking functions, not while it waits in line for its state
// (callDeadline pauses around every wait for the lock). A call cannot time out
// because another held its state; the error of a deadline names the call that ran
// out of its own time. Preemptions are counted in luaop_lua_preemptions_total.
//
// The rule: no lock is held while calling out of the package or waiting on I/O.
// Callbacks the processing core passes in a causes.Call are called as follows:
// Flush (a daemon's patch) and Indexes.Lookup with no lock held (through
// shard.blocking, or from a yielded daemon's park and end); StartDaemon's done with
// no lock held, once, from the goroutine that ended the daemon; Latest (a lock-free
// atomic read) under the shard lock. Kube
// methods are called with no lock held. Loggers (call.Logger, Options.Logger) are
// written to under the shard lock: they must not block for long.
//
// # Budgets
//
// No script may take the operator down or hold a state past its deadline (issue 34):
// the patched gopher-lua (third_party/gopher-lua) refuses chunks nested deeper than
// Lua allows, compiles under the load deadline, bounds `..` and stops the pattern
// matcher with the call's context; internal/sandbox bounds the other string
// builders; conversions from Lua count values and JSON bytes as they go (a result or
// patch over 1.5 MiB fails for good); decodes and encodes hold the deadline (offLua);
// a call logs at most 1 MiB; a ctx, its patch and its memo are dead after their call
// (endCtx, endPatch, memo views). What would still hold a state past its deadline
// is reported and the state replaced (stuck.go). luabind/adversary holds the
// attacks every suite runs (it is data: scripts and the errors they must give; it
// imports nothing of luaop's).
//
// # Data
//
// Objects go to Lua as lazy read-only proxies: a handler that reads two fields of a
// large object converts two fields. Values coming back (the patch, the result) are
// converted by one function, luavalue.FromLua, which keeps integers integral, empty
// objects objects, and marked empty lists lists; luaop.null writes JSON null.
//
// # Rooms
//
// This package holds the runtime (shards, threads, calls, reloads, the luaop module,
// admission, memory budget) and the editor files that describe the module (the
// stubs, .luarc.json, .luacheckrc). Next to it, in rooms of their own:
//   - scriptapi is the table of the module's functions (parameters, what each
//     registers, the cluster access each needs) and of the handler options. The
//     runtime installs luaop.kube, json, yaml and the event helpers from it
//     (installFunctions refuses an implementation it does not list, and a listed
//     function without one); TestRuntimeInstallsTheTableOfFunctions and
//     TestStubsDeclareTheTableOfFunctions hold the module and the stubs to it.
//   - scriptsource reads the scripts folder (Script is its type; ReadDir here is a
//     forwarder for the packages not moved to it yet).
//   - scriptcheck is `luaop check`: it analyses the source this package parses
//     (ParseScript, the tree Load compiles) and loads the scripts in a throwaway
//     Runtime without a cluster.
//
// luabind imports neither scriptcheck nor anything above it (processing's
// reactor, operator, cmd/): of the core it knows only processing/causes (the
// handler specs and calls it is given) and state; it calls back through the
// causes.Call callbacks and the Kube interface only, never a caller's package.
//
// Three concepts it uses have rooms of their own under internal/, each with its
// tests:
//   - internal/sandbox makes the states (safe libraries, string functions bounded in
//     size, pairs/ipairs honouring __pairs/__ipairs) and isolates the scripts of a
//     state (sandbox.Isolation: each file's own globals, read-only views of the
//     libraries and of the luaop module).
//   - internal/luavalue converts values between Go and Lua: ToLua, FromLua, the lazy
//     proxies (NewProxy) and the JSON markers (luaop.null, luaop.array, luaop.object).
//   - internal/luaerr carries errors across the boundary: Translate (a failed call to
//     *ScriptError with file:line, or the temporary, permanent or admission error a
//     script raised), Throw (a Go error raised from a Go function) and the
//     luaop.temporary_error and luaop.permanent_error constructors. ScriptError and
//     AdmissionError are defined there; this package's names are aliases of them.
//
// Both luavalue and luaerr keep per-state objects (marker metatables, the null
// sentinel, proxy metamethods; the raised errors' metatable) in the LState's registry,
// each under its own key, made on first use; they are Lua values of the shard and, like
// all of them, used only under the shard lock. internal/luatest holds the helpers and
// JSON documents the tests of all four packages share.
package luabind
