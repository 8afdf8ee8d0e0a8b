// Package processing turns watch events of Kubernetes objects into handler runs and
// patches: watch -> per-object queue -> cause -> handlers -> one patch per cycle.
//
// It re-creates kopf's reactor. Each watched resource gets a client-go informer
// (a reflector feeding a store, with re-lists on 410 Gone and reconnects built in).
// Informer notifications are only recorded and the object's key is put on a
// client-go rate-limited work queue, which guarantees that one object is handled by
// one worker at a time while different objects run in parallel. A worker drains the
// object's pending events (raw event handlers see every one of them, in order), then
// detects the high-level cause from the newest body and the diff-base stored on the
// object, runs the selected change handlers through the Handlers interface, and
// applies everything they changed as one merge patch (plus one of /status when status
// is a subresource). The queue is FIFO, but a sharded Reactor (Options.Shard) serves
// first the objects that reach it after its initial listing (moved from another
// replica, or newly assigned to it): its storage has a front lane (lanes.go).
//
// Progress of every handler is persisted on the object (state.ProgressStorage), so a
// restarted operator resumes where it stopped. After its own patch a worker does not
// run change handlers on a body older than what that patch returned: it waits for the
// watch to deliver that version, or for Options.ConsistencyTimeout, and is woken as
// soon as a newer event arrives (kopf's "consistency after its own patch"). Past the
// timeout kopf handles the stale body and runs again what the patch recorded as done;
// luaop handles the body its own patch returned instead (newer than anything the watch
// delivered), until the watch catches up: a deliberate departure from kopf. A write
// that got no answer (the connection broke, a timeout) may still have been applied:
// the next cycle reads the object from the server and waits for that version in the
// same way, where kopf would handle its cached body and run again what the write had
// recorded as done.
//
// The informers' first list and watch may be older than what was handled already (a
// lagging watch cache, an API server that is behind, a watch replaying history): each
// watcher reads its resource consistently before its informers list (freshness.go),
// and a body older than that read is read again from the server, as after a write
// without answer, before any handler runs on it.
//
// A field handler out of its filters when a cause completes has the value of its
// field it last handled held back in the stored diff-base (heldback.go): when it
// matches again, its cause starts from that value, whatever the watch showed in
// between.
//
// Delays that handlers ask for (TemporaryError, backoff) are kept in the work queue:
// no dummy "touch" patches load the API server, unlike kopf. A handler's progress
// record is written only when it changed (kopf's State.store). A cycle that fails on
// an error of the framework (an API failure) is tried again after the object's
// failure backoff (Reactor.failures) or on a new event; wake-ups before that run the
// object's timers only, in a write of their own (kopf's timers are tasks of their
// own: a failing patch must not stop them).
//
// # Concurrency: who owns what
//
// The rule: no lock is held while calling out of this package (handlers, the API,
// the work queue, callbacks) or waiting on I/O. Every lock below is a leaf, held to
// copy or swap a few fields.
//
//   - An object's state has two halves (objects.go). The inbox is written by the
//     informer side (watch notifications) and by daemons: the newest body is published
//     through an atomic pointer, so daemons and handlers read it without a lock; the
//     raw events, the incarnation (uid) and daemons' patches sit behind the inbox's
//     leaf mutex. The memory (daemons, timers, consistency wait, index version) is
//     owned by the worker holding the object's key: the work queue hands a key to one
//     worker at a time, so it has no lock at all.
//   - The keys a sharded Reactor puts in the queue's front lane are marked under a
//     leaf mutex (frontMarks) before the key is added; the queue's storage takes the
//     mark under client-go's queue lock, the one order these two locks are taken in.
//   - The object table (key -> state) has a leaf RWMutex; a worker drops a gone object
//     only if no notification arrived since, under the table's lock.
//   - Readiness is the set of keys of the initial listings still to process (and, for
//     resources with indexes, still to index), never a counter: a key leaves the set
//     when its worker handled it or it is gone, whatever happened in between.
//   - Resources: each spelling in the scripts is resolved once through discovery to the
//     canonical GroupVersionResource; watchers, queue keys and handler lookups use the
//     canonical one, so two spellings share one informer and one worker (resources.go).
//   - Daemons run under the daemon registry (for the shutdown); each is driven by its
//     daemonLoop, which keeps no goroutine while an attempt runs: the runner
//     (DaemonRunner.StartDaemon) reports the attempt's end to a callback, and luabind
//     parks a sleeping daemon without a goroutine; an initial delay or a backoff
//     between attempts waits on the clock's timer (Options.Clock, fake in tests) and
//     callbacks on the daemon's stop and context (daemonLoop.after), not a goroutine. A
//     daemon reads the newest body of its own incarnation (a re-created object under
//     the same name is another incarnation: its old daemons see nil and end) and hands
//     its patches to the inbox; the worker applies them.
//   - A new incarnation under a known key (deleted and re-created before the worker
//     ran) goes through the same forget path as a deletion: daemons stopped, index
//     entries dropped, the memo forgotten once its daemons exited.
//   - Reloads: Refresh keeps the signature of the handlers a reload must revisit every
//     object for (daemons, timers, indexes, handlers needing a finalizer) behind a leaf
//     mutex, the one lock held around a call out of the package: Handlers.Specs, a
//     snapshot that must not block (its contract says so), read again under the lock
//     so that a Refresh stalled in discovery cannot store an older signature. A write
//     that got no answer is remembered in the object's memory (worker-owned), and the
//     next cycles read the object from the server, with no lock held.
//   - Pausing (pause.go, Reactor.Pause and Resume, driven by peering): a gate in
//     front of the workers (a leaf mutex) holds each worker with the key it got
//     until Resume and counts the cycles in flight; the daemon registry refuses new
//     daemons while paused and Pause stops the running ones; Pause returns once the
//     cycles in flight and those daemons have ended. Resume gives every object a
//     cycle. Informers keep running: no change that happened meanwhile is missed;
//     but the raw events of the pause are not kept for the event handlers (they
//     are the working peer's, as kopf's paused watch streams deliver none).
//   - The clock (Options.Clock) drives every wait: the queue's delays and backoffs,
//     retries, timers, daemons' delays and consistency deadlines, so tests run the
//     core against client-go's fake dynamic client with a fake clock.
//
// # What it owns, what it must not call
//
// It owns the engines that drive handlers on objects: the watch, the per-object
// queue and memory, cause detection, the change handlers' cycles and their
// persisted progress, timers, daemons, indexes and the writes. The rules of one
// handler run (the cause each handler is given, the verdict on an attempt and its
// backoff, where a result goes, subhandlers' views) are handling's: the engines call
// it and must not decide them again, so that `luaop test` (scripttest), which calls
// the same rules, is the core's rules on a fake API (TestLuaopTestRunsTheCoresRules).
//
// The package never imports the Lua binding: it declares the Handlers interface it
// needs, and luabind.Runtime satisfies it. It never imports operator, scripttest or
// cmd/ (data flows one way: watch -> queue -> cause -> handlers -> patch).
package processing
