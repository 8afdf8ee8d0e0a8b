package processing

import (
	"context"
	"crypto/sha256"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"github.com/luaop/luaop/handling"
	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// DaemonRunner is implemented by runtimes that can run daemons (luabind.Runtime).
// StartDaemon runs the daemon until it returns, fails, or ctx is cancelled, and then
// calls done once (nil when the daemon returned), from any goroutine and with no lock
// of the runner held. It may return before the daemon ends: a runner that can park a
// sleeping daemon without a goroutine (luabind yields its coroutine) returns when it
// first sleeps, so that a sleeping daemon costs no goroutine here either.
type DaemonRunner interface {
	StartDaemon(ctx context.Context, call *causes.Call, done func(error))
}

// defaultCancellationTimeout is how long a stopped daemon may take to exit before
// its context is cancelled (kopf's cancellation_timeout has no default; luaop does
// not wait forever: complaint 8 of kopf's users is daemons that never stop).
const defaultCancellationTimeout = 60 * time.Second

// daemonRun is one running daemon of one object.
type daemonRun struct {
	// spec is the handler in its generation's specs (shared, never modified).
	spec *causes.Spec
	key  objectKey
	// stopped ends when the daemon is asked to stop (endStop): a context, so that a
	// sleeping daemon is woken by a callback rather than a waiting goroutine.
	// cancelled ends when it is cancelled, its cancellation backoff after the stop
	// (causes.DaemonLink.Cancelled); cancel ends its context, its cancellation
	// timeout after that (or at once: its object is gone, the operator stops).
	stopped   context.Context
	endStop   context.CancelFunc
	cancelled context.Context
	endCancel context.CancelFunc
	stopOnce  sync.Once
	cancel    context.CancelFunc
	done      chan struct{}
	returned  atomic.Bool // it returned by itself (or failed for good): not restarted
	startedAt time.Time
	clock     clock.WithTickerAndDelayedExecution

	// mu orders the stop and the start of an attempt (begin): a daemon stopped
	// before an attempt begins never begins it, whichever goroutine gets there first
	// (kopf checks the stop after each wait). Leaf lock.
	mu            sync.Mutex
	stopRequested bool
	// begun: an attempt began; stoppedBeforeStart: the stop came before any did.
	begun, stoppedBeforeStart bool
}

// stop asks the daemon to stop, as kopf terminates a daemon: at once its stop flag
// (ctx.stopped(), a sleep returning false); after backoff its cancellation (its
// blocking calls end it); timeout after that, its context (its Lua is interrupted
// wherever it is). Zero durations mean at once.
func (d *daemonRun) stop(backoff, timeout time.Duration) {
	d.stopOnce.Do(func() {
		d.mu.Lock()
		d.stopRequested = true
		d.stoppedBeforeStart = !d.begun
		d.mu.Unlock()
		// The timers are set before the stop is seen: whoever sees it sees them.
		var soft clock.Timer
		if backoff > 0 {
			soft = d.clock.AfterFunc(backoff, d.endCancel)
		}
		var hard clock.Timer
		if backoff+timeout > 0 {
			hard = d.clock.AfterFunc(backoff+timeout, d.cancel)
		}
		d.endStop()
		if backoff <= 0 {
			d.endCancel()
		}
		if hard == nil {
			d.cancel() // (backoff and timeout 0: nothing to stop later)
			return
		}
		go func() {
			<-d.done
			hard.Stop()
			if soft != nil {
				soft.Stop()
			}
		}()
	})
}

// begin tells whether an attempt may begin, and marks the daemon as begun: false
// once the daemon was asked to stop (or its context ended).
func (d *daemonRun) begin(ctx context.Context) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopRequested || ctx.Err() != nil {
		return false
	}
	d.begun = true
	return true
}

// objectDaemons are the daemons of one object, at most one per handler id: a
// slice, as an object has one or two (a map was 300 bytes per object).
type objectDaemons []*daemonRun

func (ds objectDaemons) get(id string) *daemonRun {
	for _, d := range ds {
		if d.spec.ID == id {
			return d
		}
	}
	return nil
}

// put adds d, replacing the daemon of the same handler.
func (ds *objectDaemons) put(d *daemonRun) {
	ds.remove(d.spec.ID)
	*ds = append(*ds, d)
}

func (ds *objectDaemons) remove(id string) {
	*ds = slices.DeleteFunc(*ds, func(d *daemonRun) bool { return d.spec.ID == id })
}

// daemonRegistry knows every running daemon of the operator, for the shutdown.
// Its lock is a leaf.
type daemonRegistry struct {
	mu sync.Mutex
	// ctx parents every daemon's context; nil before Start and once stopping, so
	// that no daemon starts then.
	ctx     context.Context
	running map[*daemonRun]struct{}
	group   sync.WaitGroup
	// paused: the Reactor is paused, no daemon starts (pause.go).
	paused bool
}

func (r *daemonRegistry) open(ctx context.Context) {
	r.mu.Lock()
	r.ctx = ctx
	r.mu.Unlock()
}

// add registers a daemon about to start and gives it its context and cancel
// function, both set before stopAll can see it; false once the operator is stopping.
func (r *daemonRegistry) add(d *daemonRun) (context.Context, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ctx == nil || r.paused {
		return nil, false
	}
	ctx, cancel := context.WithCancel(r.ctx)
	d.cancel = cancel
	r.running[d] = struct{}{}
	r.group.Add(1)
	return ctx, true
}

func (r *daemonRegistry) remove(d *daemonRun) {
	r.mu.Lock()
	delete(r.running, d)
	r.mu.Unlock()
	r.group.Done()
}

// stopAll asks every daemon to stop (operator shutdown); each gets its cancellation
// timeout, bounded by the shutdown grace period.
func (r *daemonRegistry) stopAll(grace time.Duration) {
	r.mu.Lock()
	r.ctx = nil
	all := make([]*daemonRun, 0, len(r.running))
	for d := range r.running {
		all = append(all, d)
	}
	r.mu.Unlock()
	for _, d := range all {
		// Both within the grace period: the backoff first, the timeout in what is left.
		backoff := min(d.spec.CancellationBackoff, grace)
		timeout := min(cancellationTimeout(*d.spec), grace-backoff)
		d.stop(backoff, timeout)
	}
}

func (r *daemonRegistry) wait() { r.group.Wait() }

func (d *daemonRun) stopping() bool { return d.stopped.Err() != nil }

func (d *daemonRun) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// adjustDaemons starts the daemons an object should have and stops those it should
// not: one per (object, daemon handler) while the object exists, is not being
// deleted, and matches the handler's filters. Runs in the object's worker, which
// owns c.mem.daemons.
func (c *cycle) adjustDaemons(ctx context.Context) {
	o := c.op
	runner, ok := o.handlers.(DaemonRunner)
	if !ok {
		return
	}
	deleting := deletionInProgress(c.body.Object)
	cause := handling.ForObject(c.key.resource, c.body.Object)
	for i := range c.specs {
		spec := &c.specs[i]
		if spec.Kind != causes.KindDaemon {
			continue
		}
		wanted := !deleting
		if wanted {
			m, err := o.handlers.Match(ctx, *spec, cause)
			if err != nil {
				c.log.Error("daemon filter failed; leaving the daemon as it is", "handler", spec.ID, "error", err)
				continue
			}
			wanted = m
		}
		d := c.mem.daemons.get(spec.ID)
		if d != nil && d.exited() && !d.returned.Load() {
			c.mem.daemons.remove(spec.ID) // stopped earlier: may start again
			d = nil
		}
		switch {
		case wanted && d == nil:
			c.startDaemon(runner, spec)
		case !wanted && d != nil && !d.stopping() && !d.exited():
			c.log.Info("stopping daemon", "handler", spec.ID, "deleting", deleting)
			d.stop(spec.CancellationBackoff, cancellationTimeout(*spec))
		case wanted && d != nil && d.spec.CodeHash != spec.CodeHash && !d.stopping() && !d.exited():
			// Its code changed in a reload: stop it gracefully; the next cycle
			// (its exit wakes one) starts the new code, with the same memo.
			c.log.Info("restarting daemon with its new code", "handler", spec.ID)
			d.stop(spec.CancellationBackoff, cancellationTimeout(*spec))
		case wanted && d != nil && d.returned.Load() && d.spec.CodeHash != spec.CodeHash:
			// A daemon that had returned runs again when its code changed.
			c.mem.daemons.remove(spec.ID)
			c.startDaemon(runner, spec)
		}
	}
	// Daemons whose handler no longer exists (a reload removed it) stop too.
	for _, d := range c.mem.daemons {
		if !hasSpec(c.specs, d.spec.ID) && !d.stopping() {
			d.stop(d.spec.CancellationBackoff, cancellationTimeout(*d.spec))
		}
	}
}

func cancellationTimeout(spec causes.Spec) time.Duration {
	if spec.CancellationTimeout > 0 {
		return spec.CancellationTimeout
	}
	return defaultCancellationTimeout
}

func hasSpec(specs []causes.Spec, id string) bool {
	for _, s := range specs {
		if s.ID == id {
			return true
		}
	}
	return false
}

// startDaemon runs a daemon in its own goroutine (a Lua coroutine underneath):
// after the initial delay; restarted with the handler's backoff when it fails; not
// restarted when it returns. The daemon reads its object's newest body from the
// inbox (atomically, no lock) and hands its patches to the inbox for the worker.
func (c *cycle) startDaemon(runner DaemonRunner, spec *causes.Spec) {
	o, key, in, uid := c.op, c.key, &c.st.inbox, c.mem.uid
	d := &daemonRun{spec: spec, key: key, done: make(chan struct{}), startedAt: c.now, clock: o.clock}
	// Set before add: stopAll may stop d as soon as it is registered.
	d.stopped, d.endStop = context.WithCancel(context.Background())
	d.cancelled, d.endCancel = context.WithCancel(context.Background())
	ctx, ok := o.daemons.add(d)
	if !ok {
		d.endStop()
		d.endCancel()
		return // the operator is stopping or paused (Resume gives the object a cycle)
	}
	c.mem.daemons.put(d)
	log := o.log.With(objectAttrs(key, c.info.kind, uid)...)
	latest := func() map[string]any {
		if b := in.latestOf(uid); b != nil {
			return b.Object
		}
		return nil
	}
	flush := func(patch map[string]any) {
		in.mu.Lock()
		if in.daemonPatchUID != uid {
			in.daemonPatch, in.daemonPatchUID = nil, uid
		}
		p := state.NewPatch()
		if in.daemonPatch != nil {
			p.Merge(in.daemonPatch)
		}
		p.Merge(patch)
		in.daemonPatch = p.Map()
		in.mu.Unlock()
		o.queue.Add(key)
	}
	link := &causes.DaemonLink{Stopped: d.stopped, Cancelled: d.cancelled, Latest: latest, Flush: flush, UID: uid, Name: key.name, Namespace: key.namespace}
	go (&daemonLoop{op: o, runner: runner, d: d, ctx: ctx, log: log, callLog: log.With("handler", spec.ID, "reason", "daemon"), link: link}).run()
}

// daemonLoop runs one daemon: after its initial delay, attempt after attempt until it
// ends for good; then it finishes the daemon. It keeps no goroutine of its own: an
// attempt starts on the goroutine startDaemon started, or on one that the end of a
// delay (daemonLoop.after) or of the previous attempt started; a delay waits on
// timers and callbacks, and the runner keeps none while the daemon sleeps
// (DaemonRunner). Its fields are set before the first attempt starts
// and never change (first: before the first attempt).
//
// Why small methods that are not inlined: a daemon that sleeps where its coroutine
// cannot yield (inside pcall) parks its goroutine in luaop.sleep under attempt's
// frame. The Go runtime shrinks a parked goroutine's stack at a GC only while less
// than a quarter of it is in use, and a daemon's stack sometimes grows to 16 KB (a
// deep conversion, a luaop.kube call, the allocator's slow path). Under a 2 KB frame
// here (the call built on the stack and copied as an argument, the log lines'
// attributes) the parked daemon used just over 4 KB, so such a stack never shrank
// back: in the soak, 2,000 daemons' stacks crept from 10 to 16 KB each. So the call
// is built on the heap, and what needs room (logging, judging an error) happens in
// functions of their own.
type daemonLoop struct {
	op     *Reactor
	runner DaemonRunner
	d      *daemonRun
	ctx    context.Context // d's context: d.cancel ends it
	// log is the object's logger (its lines add handler, reason and took_ms, as
	// every handler's outcome line does); callLog the daemon's ctx.logger.
	log, callLog *slog.Logger
	link         *causes.DaemonLink
	// first is when the first attempt started: retries' timeout counts from it.
	first time.Time
	// lastError is what the last failed attempt said, quoted when the next finds
	// the retries or the time spent (written before the next attempt is scheduled).
	lastError string
}

// run starts the daemon, on the goroutine startDaemon made for it (its first stretch
// of Lua must not run on the object's worker): the first attempt, after the initial
// delay.
func (l *daemonLoop) run() {
	l.after(l.d.spec.InitialDelay, func() {
		// kopf: a daemon is run until it ends for good. ctx.retry counts its failed
		// runs; retries bounds them (a failure at the last allowed run is final),
		// timeout bounds the total time since its first run, errors says what an
		// arbitrary error means ("ignored" counts as a success: not restarted).
		l.first = l.op.clock.Now()
		l.attempt(0)
	})
}

// attempt starts attempt n; the runner reports its end to ended.
//
//go:noinline
func (l *daemonLoop) attempt(n int) {
	if !l.d.begin(l.ctx) {
		l.finish() // stopped before this attempt began: it never does
		return
	}
	call := l.callFor(n, l.first)
	if call == nil {
		l.finish()
		return
	}
	t0 := time.Now()
	l.runner.StartDaemon(l.ctx, call, func(err error) { l.ended(err, n, t0) })
}

// ended judges how attempt n ended: the daemon finishes, or attempt n+1 starts after
// the backoff, on a goroutine of its own: ended may run on the goroutine that
// started attempt n (a daemon failing before it sleeps), and retrying there would
// nest attempts as deep as they keep failing.
//
//go:noinline
func (l *daemonLoop) ended(err error, n int, t0 time.Time) {
	delay, again := l.judge(err, n, l.first, t0)
	if !again {
		l.finish()
		return
	}
	l.lastError = handling.ErrorMessage(err)
	go l.after(delay, func() { l.attempt(n + 1) }) // a goroutine of its own for a delay of 0
}

// after runs then once d has passed, on a goroutine of its own, or finishes the
// daemon when it is stopped or cancelled first; d <= 0 runs then at once, here.
// Nothing waits meanwhile: the clock's timer and callbacks on the daemon's stop and
// context hold it, so a daemon in its initial delay or in a backoff costs no
// goroutine either.
func (l *daemonLoop) after(d time.Duration, then func()) {
	if d <= 0 {
		then()
		return
	}
	w := &delayedAttempt{}
	w.mu.Lock()
	defer w.mu.Unlock()
	fire := func(ok bool) func() {
		return func() {
			if !w.fired.CompareAndSwap(false, true) {
				return
			}
			// A goroutine of its own: the fake clock calls back with its lock held,
			// and the attempt runs Lua.
			go func() {
				w.mu.Lock() // after has armed all three
				w.timer.Stop()
				w.stopStopped()
				w.stopCtx()
				w.mu.Unlock()
				// kopf checks the stop again after every wait: a daemon stopped while
				// its timer was firing does not start (attempt checks it again, in
				// order with the stop: daemonRun.begin).
				if ok && !l.d.stopping() && l.ctx.Err() == nil {
					then()
				} else {
					l.finish()
				}
			}()
		}
	}
	w.timer = l.op.clock.AfterFunc(d, fire(true))
	w.stopStopped = context.AfterFunc(l.d.stopped, fire(false))
	w.stopCtx = context.AfterFunc(l.ctx, fire(false))
}

// delayedAttempt is one wait of daemonLoop.after: the first of its timer, the
// daemon's stop and its context to fire wins; mu covers the arming.
type delayedAttempt struct {
	fired                atomic.Bool
	mu                   sync.Mutex
	timer                clock.Timer
	stopStopped, stopCtx func() bool
}

// finish marks the daemon exited and lets its object's worker see it. It leaves
// the registry first: whoever waited for done (Pause, a deletion) then finds the
// registry without it (/debug, the daemons gauge).
//
//go:noinline
func (l *daemonLoop) finish() {
	l.op.daemons.remove(l.d)
	close(l.d.done)
	l.d.cancel()
	l.op.queue.Add(l.d.key)
}

// callFor is the call of one attempt, or nil when the daemon must not run again: its
// object is gone (or is another object now), or its retries or timeout are spent.
//
//go:noinline
func (l *daemonLoop) callFor(attempt int, first time.Time) *causes.Call {
	o, spec := l.op, l.d.spec
	body := l.link.Latest()
	if body == nil {
		return nil
	}
	if msg, over := engineExhausted(*spec, attempt, o.clock.Now().Sub(first), l.lastError); over {
		logOutcome(l.log, o.opts.SuccessLogLevel, spec.ID, "daemon", OutcomeFailure, 0, errors.New(msg), "restarted", false)
		l.d.returned.Store(true)
		return nil
	}
	l.log.Info("daemon started", "handler", spec.ID, "reason", "daemon", "attempt", attempt)
	return &causes.Call{
		// No body: a daemon reads its newest body through Latest, and its identity
		// from the link; it must not keep its first body alive for its whole life.
		Handler: *spec, Cause: handling.ForDaemon(l.d.key.resource),
		Retry: attempt, Started: l.d.startedAt, Runtime: o.clock.Now().Sub(first), Logger: l.callLog,
		Daemon: l.link, Indexes: o.indexes,
	}
}

// judge logs and records how an attempt ended: again is true when the daemon is
// restarted after delay.
//
//go:noinline
func (l *daemonLoop) judge(err error, attempt int, first, t0 time.Time) (delay time.Duration, again bool) {
	o, d, spec := l.op, l.d, l.d.spec
	took := time.Since(t0)
	if err == nil {
		d.returned.Store(!d.stopping())
		// kopf: a daemon that returns succeeded; it is not restarted.
		logOutcome(l.log, o.opts.SuccessLogLevel, spec.ID, "daemon", OutcomeSuccess, took, nil, "restarted", false)
		o.observe(d.key, spec.ID, "daemon", OutcomeSuccess, took, nil)
		return 0, false
	}
	if errors.Is(err, causes.ErrDaemonCancelled) {
		// kopf: "is cancelled. Will escalate." A daemon that went on after its stop
		// (a loop relying on cancellation, as kopf's async daemons do) ends here.
		l.log.Info("daemon cancelled: it went on after its stop", "handler", spec.ID, "reason", "daemon", "took_ms", tookMs(took))
		return 0, false
	}
	if d.stopping() || l.ctx.Err() != nil {
		l.log.Info("daemon stopped", "handler", spec.ID, "reason", "daemon", "took_ms", tookMs(took))
		return 0, false
	}
	outcome, delay, msg := judgeEngineAttempt(o.opts.withBackoff(*spec), attempt, o.clock.Now().Sub(first), err)
	o.observe(d.key, spec.ID, "daemon", outcome, took, err)
	switch outcome {
	case OutcomeIgnored:
		logOutcome(l.log, o.opts.SuccessLogLevel, spec.ID, "daemon", outcome, took, err, "restarted", false)
		d.returned.Store(true)
		return 0, false
	case OutcomeFailure:
		logOutcome(l.log, o.opts.SuccessLogLevel, spec.ID, "daemon", outcome, took, errors.New(msg), "restarted", false)
		d.returned.Store(true)
		return 0, false
	}
	logOutcome(l.log, o.opts.SuccessLogLevel, spec.ID, "daemon", OutcomeRetry, took, err, "backoff", delay, "retry", attempt+1)
	return delay, true
}

// daemonsRunning tells whether any daemon of the object has not exited yet.
func (c *cycle) daemonsRunning() bool {
	for _, d := range c.mem.daemons {
		if !d.exited() {
			return true
		}
	}
	return false
}

// timerState is the schedule of one timer of one object.
type timerState struct {
	next time.Time
	// schedule is what next was computed from: a reload that changes it starts the
	// timer over (a shortened interval must not wait out the old one).
	schedule timerSchedule
	// retries counts the consecutive failed attempts (ctx.retry), since started: both
	// are reset once an attempt ends for good (success, or a final failure).
	retries int
	started time.Time
	// lastError is what the last failed attempt said (quoted by the strict check);
	// failedCode the code hash it failed with (Options.RetryOnReload).
	lastError  string
	failedCode string
	// waitChange: an idle timer without an interval ran at ranAt and runs again only
	// after the next essential change (then after idle seconds without one).
	waitChange bool
	ranAt      time.Time
}

// timerSchedule: the options of a timer that decide when it runs.
type timerSchedule struct {
	interval, idle, initialDelay time.Duration
	sharp                        bool
}

func scheduleOf(spec causes.Spec) timerSchedule {
	return timerSchedule{interval: spec.Interval, idle: spec.Idle, initialDelay: spec.InitialDelay, sharp: spec.Sharp}
}

// runTimers runs the timers that are due, in the object's worker: runs of one timer
// never overlap, and their patches join the cycle's. It returns when the next timer
// is due (0: none).
func (c *cycle) runTimers(ctx context.Context) time.Duration {
	o := c.op
	body := c.body.Object
	deleting := deletionInProgress(body)
	var wake time.Duration
	essenceChecked := false
	for id := range c.mem.timers {
		if !hasSpec(c.specs, id) {
			delete(c.mem.timers, id) // removed by a reload
		}
	}
	for _, spec := range c.specs {
		if spec.Kind != causes.KindTimer || (spec.Interval <= 0 && spec.Idle <= 0) {
			continue
		}
		if spec.Idle > 0 && !essenceChecked {
			c.noteEssentialChange()
			essenceChecked = true
		}
		cause := handling.ForObject(c.key.resource, body)
		matches := !deleting
		if matches {
			m, err := o.handlers.Match(ctx, spec, cause)
			if err != nil {
				c.log.Error("timer filter failed; skipping", "handler", spec.ID, "error", err)
			}
			matches = m && err == nil
		}
		ts := c.mem.timers[spec.ID]
		if !matches {
			delete(c.mem.timers, spec.ID)
			continue
		}
		if ts == nil || ts.schedule != scheduleOf(spec) {
			ts = &timerState{next: c.now.Add(spec.InitialDelay), schedule: scheduleOf(spec)}
			if c.mem.timers == nil {
				c.mem.timers = map[string]*timerState{}
			}
			c.mem.timers[spec.ID] = ts
		}
		lastChange := c.mem.lastChangeAt
		if ts.waitChange {
			if !lastChange.After(ts.ranAt) {
				continue // idle-only: nothing to do until the object changes
			}
			ts.waitChange = false
			ts.next = lastChange.Add(spec.Idle)
		}

		now := o.clock.Now()
		c.wakeTimerForReload(spec, ts, now)
		if !now.Before(ts.next) && spec.Idle > 0 && now.Sub(lastChange) < spec.Idle {
			// idle: only after spec.Idle without an essential change.
			ts.next = lastChange.Add(spec.Idle)
		}
		if !now.Before(ts.next) {
			c.runTimer(ctx, spec, ts, now)
		}
		if ts.waitChange {
			continue
		}
		wake = soonest(wake, max(ts.next.Sub(o.clock.Now()), time.Millisecond))
	}
	return wake
}

// runTimer runs one timer once and schedules its next run, as kopf does: a failure
// is retried after the handler's backoff (or the TemporaryError's delay), counting
// ctx.retry up, until retries or timeout give up; a success, an ignored error or a
// final failure wait for the interval (or, for an idle timer without one, for the
// next change and then idle seconds), with ctx.retry back at 0.
func (c *cycle) runTimer(ctx context.Context, spec causes.Spec, ts *timerState, now time.Time) {
	o := c.op
	if ts.started.IsZero() {
		ts.started = now
	}
	var err error
	var outcome Outcome
	var delay time.Duration
	t0 := time.Now()
	if msg, over := engineExhausted(spec, ts.retries, now.Sub(ts.started), ts.lastError); over {
		// Strict check: the time or the tries ran out while the timer waited.
		err, outcome = &causes.PermanentError{Message: msg}, OutcomeFailure
		logOutcome(c.log, o.opts.SuccessLogLevel, spec.ID, "timer", outcome, 0, err, "next", "its next interval")
	} else {
		var result causes.Result
		result, err = o.handlers.Invoke(ctx, causes.Call{
			Handler: spec, Cause: handling.ForObject(c.key.resource, c.body.Object),
			Patch: c.patch, Retry: ts.retries, Started: ts.started, Runtime: now.Sub(ts.started),
			Logger: c.log.With("handler", spec.ID, "reason", "timer"), Indexes: o.indexes,
		})
		if err == nil {
			handling.StoreResult(c.patch, spec, result.Value)
		}
		var msg string
		outcome, delay, msg = judgeEngineAttempt(o.opts.withBackoff(spec), ts.retries, o.clock.Now().Sub(ts.started), err)
		took := time.Since(t0)
		switch outcome {
		case OutcomeRetry:
			logOutcome(c.log, o.opts.SuccessLogLevel, spec.ID, "timer", outcome, took, err, "backoff", delay, "retry", ts.retries+1)
		case OutcomeFailure:
			logOutcome(c.log, o.opts.SuccessLogLevel, spec.ID, "timer", outcome, took, errors.New(msg), "next", "its next interval")
		default:
			logOutcome(c.log, o.opts.SuccessLogLevel, spec.ID, "timer", outcome, took, err)
		}
	}
	o.observe(c.key, spec.ID, "timer", outcome, time.Since(t0), err)
	if outcome == OutcomeRetry {
		ts.retries++
		ts.next = o.clock.Now().Add(delay)
		ts.lastError, ts.failedCode = handling.ErrorMessage(err), spec.CodeHash
		return
	}
	ts.retries, ts.started, ts.lastError = 0, time.Time{}, ""
	switch {
	case spec.Interval > 0 && spec.Sharp:
		// Aligned to the schedule, not to the end of the run: no drift; missed
		// ticks are skipped, not run in a burst.
		for !ts.next.After(o.clock.Now()) {
			ts.next = ts.next.Add(spec.Interval)
		}
	case spec.Interval > 0:
		ts.next = o.clock.Now().Add(spec.Interval)
	default:
		// kopf: an idle timer without an interval runs again only after the next
		// essential change, once the object was idle for spec.Idle again.
		ts.waitChange, ts.ranAt = true, now
	}
}

// engineExhausted is kopf's strict check before an attempt of a timer or a daemon
// (handling.Exhausted): retries is the number of failed attempts before it,
// runtime the time since the first, lastError what the last failed one said (its
// final message quotes it, as a change handler's does).
func engineExhausted(spec causes.Spec, retries int, runtime time.Duration, lastError string) (string, bool) {
	return handling.Exhausted(spec, handling.Attempt{Retries: retries, Runtime: runtime}, lastError)
}

// judgeEngineAttempt is handling.Judge for an in-memory handler (a timer's run, a
// daemon's run): the outcome, the delay before a retry and, for a failure, the
// handler's final message.
func judgeEngineAttempt(spec causes.Spec, retries int, runtime time.Duration, err error) (Outcome, time.Duration, string) {
	v := handling.Judge(spec, handling.Attempt{Retries: retries, Runtime: runtime}, err)
	return v.Outcome, v.Delay, v.Message
}

// updateIndexes runs the object's index functions when its body changed. An object
// being deleted stays indexed (kopf keeps it until the DELETED event): handlers
// cleaning up after it can still find it; the forget path drops its entries.
func (c *cycle) updateIndexes(ctx context.Context) {
	o := c.op
	rv := c.body.GetResourceVersion()
	if c.mem.indexedVersion == rv {
		if o.ready.indexed(c.key) {
			o.wakeIndexWaiters()
		}
		return
	}
	for _, spec := range c.specs {
		if spec.Kind != causes.KindIndex {
			continue
		}
		o.indexes.Declare(spec.ID)
		cause := handling.ForObject(c.key.resource, c.body.Object)
		if m, err := o.handlers.Match(ctx, spec, cause); err != nil || !m {
			o.indexes.Set(spec.ID, c.key.String(), nil)
			continue
		}
		t0 := time.Now()
		result, err := o.handlers.Invoke(ctx, causes.Call{Handler: spec, Cause: cause, Patch: state.NewPatch(),
			Started: c.now, Logger: c.log.With("handler", spec.ID, "reason", "index"), Indexes: o.indexes})
		took := time.Since(t0)
		if err != nil {
			c.log.Error("handler failed; the object's index entries are left out", "handler", spec.ID, "reason", "index", "took_ms", tookMs(took), "error", err)
			o.indexes.Set(spec.ID, c.key.String(), nil)
			continue
		}
		// At debug level whatever the setting, as kopf's terse logger of indexes:
		// they run on every change of every object of the resource.
		logOutcome(c.log, slog.LevelDebug, spec.ID, "index", OutcomeSuccess, took, nil)
		o.indexes.Set(spec.ID, c.key.String(), indexEntries(result.Value))
	}
	c.mem.indexedVersion = rv
	if o.ready.indexed(c.key) {
		o.wakeIndexWaiters()
	}
}

// wakeIndexWaiters queues the keys parked until the indexes are complete.
func (o *Reactor) wakeIndexWaiters() {
	for _, key := range o.ready.unpark() {
		o.queue.Add(key)
	}
}

// indexEntries: a table result gives key -> value entries; any other value is kept
// under the key "" (kopf keeps it under None); nil leaves the object out.
func indexEntries(v any) map[string]any {
	switch x := v.(type) {
	case nil:
		return nil
	case map[string]any:
		return x
	default:
		return map[string]any{"": x}
	}
}

// indexesReady: every resource with index handlers finished its initial listing and
// every object found there went through its index functions.
func (o *Reactor) indexesReady(idx *specIndex) bool {
	if _, unindexed := o.ready.pending(); unindexed > 0 {
		return false
	}
	watchers, _ := o.watchersSnapshot()
	for _, w := range watchers {
		if idx.has(w.resource, causes.KindIndex) && !w.synced() {
			return false
		}
	}
	return true
}

// noteEssentialChange remembers when the object's essence (what users change, not
// status or the operator's annotations) last changed, for idle timers. The fields
// the resource's handlers name (a timer's field = "status.phase" included) are part
// of it, as kopf adds them to the essence; they are read without luaop's own
// bookkeeping.
func (c *cycle) noteEssentialChange() {
	var named [][]string
	for _, s := range c.specs {
		if len(s.NamedField) > 0 {
			named = append(named, s.NamedField)
		}
	}
	essence := handling.Essence(c.body.Object, c.op.opts.Prefix, c.op.opts.StatusField, named)
	encoded, err := state.EncodeEssence(essence)
	if err != nil {
		return
	}
	sum := sha256.Sum256([]byte(encoded))
	if c.mem.essenceHash != sum {
		if c.mem.essenceHash != ([32]byte{}) {
			c.mem.lastChangeAt = c.now
		}
		c.mem.essenceHash = sum
	}
}
