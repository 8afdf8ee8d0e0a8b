package processing

import (
	"context"
	"crypto/sha256"
	"sync"
	"sync/atomic"
	"time"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// DaemonRunner is implemented by runtimes that can run daemons (luabind.Runtime).
// RunDaemon blocks until the daemon returns (nil), fails, or ctx is cancelled.
type DaemonRunner interface {
	RunDaemon(ctx context.Context, call causes.Call) error
}

// defaultCancellationTimeout is how long a stopped daemon may take to exit before
// its context is cancelled (kopf's cancellation_timeout has no default; luaop does
// not wait forever: complaint 8 of kopf's users is daemons that never stop).
const defaultCancellationTimeout = 60 * time.Second

// daemonRun is one running daemon of one object.
type daemonRun struct {
	spec      causes.Spec
	stopCh    chan struct{}
	stopOnce  sync.Once
	cancel    context.CancelFunc
	done      chan struct{}
	returned  atomic.Bool // it returned by itself (or failed for good): not restarted
	startedAt time.Time
}

// stop asks the daemon to stop, then cancels it after timeout (0: at once).
func (d *daemonRun) stop(timeout time.Duration) {
	d.stopOnce.Do(func() {
		close(d.stopCh)
		if timeout <= 0 {
			d.cancel()
			return
		}
		t := time.AfterFunc(timeout, d.cancel)
		go func() { <-d.done; t.Stop() }()
	})
}

func (d *daemonRun) stopping() bool {
	select {
	case <-d.stopCh:
		return true
	default:
		return false
	}
}

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
// deleted, and matches the handler's filters.
func (c *cycle) adjustDaemons(ctx context.Context) {
	o := c.op
	runner, ok := o.handlers.(DaemonRunner)
	if !ok {
		return
	}
	deleting := deletionInProgress(c.body.Object)
	cause := causes.Cause{Resource: c.key.resource, Body: c.body.Object}
	for _, spec := range c.specs {
		if spec.Kind != causes.KindDaemon {
			continue
		}
		wanted := !deleting
		if wanted {
			m, err := o.handlers.Match(ctx, spec, cause)
			if err != nil {
				c.log.Error("daemon filter failed; leaving the daemon as it is", "handler", spec.ID, "error", err)
				continue
			}
			wanted = m
		}
		o.mu.Lock()
		d := c.mem.daemons[spec.ID]
		if d != nil && d.exited() && !d.returned.Load() {
			delete(c.mem.daemons, spec.ID) // stopped earlier: may start again
			d = nil
		}
		switch {
		case wanted && d == nil && o.daemonCtx != nil:
			d = o.startDaemon(runner, c.key, c.mem, spec)
			if c.mem.daemons == nil {
				c.mem.daemons = map[string]*daemonRun{}
			}
			c.mem.daemons[spec.ID] = d
		case !wanted && d != nil && !d.stopping() && !d.exited():
			c.log.Info("stopping daemon", "handler", spec.ID, "deleting", deleting)
			d.stop(cancellationTimeout(spec))
		case wanted && d != nil && d.spec.CodeHash != spec.CodeHash && !d.stopping() && !d.exited():
			// Its code changed in a reload: stop it gracefully; the next cycle
			// (its exit wakes one) starts the new code, with the same memo.
			c.log.Info("restarting daemon with its new code", "handler", spec.ID)
			d.stop(cancellationTimeout(spec))
		case wanted && d != nil && d.returned.Load() && d.spec.CodeHash != spec.CodeHash:
			// A daemon that had returned runs again when its code changed.
			delete(c.mem.daemons, spec.ID)
			c.mem.daemons[spec.ID] = o.startDaemon(runner, c.key, c.mem, spec)
		}
		o.mu.Unlock()
	}
	// Daemons whose handler no longer exists (a reload removed it) stop too.
	o.mu.Lock()
	for id, d := range c.mem.daemons {
		if !hasSpec(c.specs, id) && !d.stopping() {
			d.stop(defaultCancellationTimeout)
		}
	}
	o.mu.Unlock()
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
// restarted when it returns. Called with o.mu held.
func (o *Operator) startDaemon(runner DaemonRunner, key objectKey, mem *objectMemory, spec causes.Spec) *daemonRun {
	ctx, cancel := context.WithCancel(o.daemonCtx)
	d := &daemonRun{spec: spec, stopCh: make(chan struct{}), cancel: cancel, done: make(chan struct{}), startedAt: o.opts.Now()}
	log := o.log.With("resource", key.resource.String(), "object", objectName(key), "handler", spec.ID)
	latest := func() map[string]any {
		o.mu.Lock()
		defer o.mu.Unlock()
		if mem.latest == nil {
			return nil
		}
		return mem.latest.Object
	}
	flush := func(patch map[string]any) {
		o.mu.Lock()
		if mem.daemonPatch == nil {
			mem.daemonPatch = state.NewPatch().Map()
		}
		p := state.NewPatch()
		p.Merge(mem.daemonPatch)
		p.Merge(patch)
		mem.daemonPatch = p.Map()
		o.mu.Unlock()
		o.queue.Add(key)
	}
	o.daemonsGroup.Add(1)
	go func() {
		defer o.daemonsGroup.Done()
		defer func() { close(d.done); cancel(); o.queue.Add(key) }()
		if !sleepOrStop(ctx, d.stopCh, spec.InitialDelay) {
			return
		}
		backoff := spec.Backoff
		if backoff <= 0 {
			backoff = defaultBackoff
		}
		for attempt := 0; ; attempt++ {
			body := latest()
			if body == nil {
				return
			}
			log.Info("daemon started", "attempt", attempt)
			t0 := time.Now()
			err := runner.RunDaemon(ctx, causes.Call{
				// Only the identity: a daemon reads its newest body through Latest,
				// and must not keep its first body alive for its whole life.
				Handler: spec, Cause: causes.Cause{Resource: key.resource, Body: identityOf(body)},
				Retry: attempt, Started: d.startedAt, Logger: log,
				Stopped: d.stopCh, Latest: latest, Flush: flush, Indexes: o.indexes,
			})
			if err == nil {
				d.returned.Store(!d.stopping())
				log.Info("daemon exited", "took", time.Since(t0))
				o.observe(key, spec.ID, "daemon", OutcomeSuccess, time.Since(t0), nil)
				return
			}
			if d.stopping() || ctx.Err() != nil {
				log.Info("daemon stopped", "took", time.Since(t0))
				return
			}
			if causes.IsPermanent(err) {
				log.Error("daemon failed for good; not restarted", "error", err)
				o.observe(key, spec.ID, "daemon", OutcomeFailure, time.Since(t0), err)
				d.returned.Store(true)
				return
			}
			delay := backoff
			if tmp, ok := causes.AsTemporary(err); ok {
				delay = tmp.Delay
			}
			log.Error("daemon failed; restarting after the backoff", "error", err, "backoff", delay)
			o.observe(key, spec.ID, "daemon", OutcomeRetry, time.Since(t0), err)
			if !sleepOrStop(ctx, d.stopCh, delay) {
				return
			}
		}
	}()
	return d
}

// sleepOrStop waits for d; false when stopped or cancelled first.
func sleepOrStop(ctx context.Context, stop <-chan struct{}, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-stop:
		return false
	case <-ctx.Done():
		return false
	}
}

// daemonsRunning tells whether any daemon of the object has not exited yet.
func (o *Operator) daemonsRunning(mem *objectMemory) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, d := range mem.daemons {
		if !d.exited() {
			return true
		}
	}
	return false
}

// stopAllDaemons asks every daemon to stop (operator shutdown); each gets its
// cancellation timeout, bounded by the shutdown grace period.
func (o *Operator) stopAllDaemons() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.daemonCtx = nil // cycles still finishing start no new daemon
	for _, mem := range o.objects {
		for _, d := range mem.daemons {
			timeout := d.spec.CancellationTimeout
			if timeout <= 0 || timeout > o.opts.ShutdownGracePeriod {
				timeout = o.opts.ShutdownGracePeriod
			}
			d.stop(timeout)
		}
	}
}

// timerState is the schedule of one timer of one object.
type timerState struct {
	next time.Time
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
	o.mu.Lock()
	for id := range c.mem.timers {
		if !hasSpec(c.specs, id) {
			delete(c.mem.timers, id) // removed by a reload
		}
	}
	o.mu.Unlock()
	for _, spec := range c.specs {
		if spec.Kind != causes.KindTimer || spec.Interval <= 0 {
			continue
		}
		if spec.Idle > 0 && !essenceChecked {
			c.noteEssentialChange()
			essenceChecked = true
		}
		cause := causes.Cause{Resource: c.key.resource, Body: body}
		matches := !deleting
		if matches {
			m, err := o.handlers.Match(ctx, spec, cause)
			if err != nil {
				c.log.Error("timer filter failed; skipping", "handler", spec.ID, "error", err)
			}
			matches = m && err == nil
		}
		o.mu.Lock()
		ts := c.mem.timers[spec.ID]
		if !matches {
			delete(c.mem.timers, spec.ID)
			o.mu.Unlock()
			continue
		}
		if ts == nil {
			ts = &timerState{next: c.now.Add(spec.InitialDelay)}
			if c.mem.timers == nil {
				c.mem.timers = map[string]*timerState{}
			}
			c.mem.timers[spec.ID] = ts
		}
		lastChange := c.mem.lastChangeAt
		o.mu.Unlock()

		now := o.opts.Now()
		if !now.Before(ts.next) && spec.Idle > 0 && now.Sub(lastChange) < spec.Idle {
			// idle: only after spec.Idle without an essential change.
			ts.next = lastChange.Add(spec.Idle)
		}
		if !now.Before(ts.next) {
			c.runTimer(ctx, spec, ts, now)
		}
		wake = soonest(wake, max(ts.next.Sub(o.opts.Now()), time.Millisecond))
	}
	return wake
}

func (c *cycle) runTimer(ctx context.Context, spec causes.Spec, ts *timerState, now time.Time) {
	o := c.op
	t0 := time.Now()
	result, err := o.handlers.Invoke(ctx, causes.Call{
		Handler: spec, Cause: causes.Cause{Resource: c.key.resource, Body: c.body.Object},
		Patch: c.patch, Started: now, Logger: c.log.With("handler", spec.ID), Indexes: o.indexes,
	})
	took := time.Since(t0)
	switch {
	case err == nil:
		if result.Value != nil {
			c.patch.Set([]string{"status", spec.ID}, result.Value)
		}
		o.observe(c.key, spec.ID, "timer", OutcomeSuccess, took, nil)
	default:
		c.log.Error("timer failed; it runs again at its next interval", "handler", spec.ID, "error", err)
		o.observe(c.key, spec.ID, "timer", OutcomeRetry, took, err)
	}
	if spec.Sharp {
		// Aligned to the schedule, not to the end of the run: no drift; missed
		// ticks are skipped, not run in a burst.
		for !ts.next.After(o.opts.Now()) {
			ts.next = ts.next.Add(spec.Interval)
		}
	} else {
		ts.next = o.opts.Now().Add(spec.Interval)
	}
	if tmp, ok := causes.AsTemporary(err); ok {
		ts.next = o.opts.Now().Add(tmp.Delay)
	}
}

// updateIndexes runs the object's index functions when its body changed.
func (c *cycle) updateIndexes(ctx context.Context) {
	o := c.op
	rv := c.body.GetResourceVersion()
	o.mu.Lock()
	if c.mem.indexedVersion == rv {
		o.mu.Unlock()
		return
	}
	o.mu.Unlock()
	deleting := deletionInProgress(c.body.Object)
	ran := false
	for _, spec := range c.specs {
		if spec.Kind != causes.KindIndex {
			continue
		}
		ran = true
		o.indexes.Declare(spec.ID)
		cause := causes.Cause{Resource: c.key.resource, Body: c.body.Object}
		if m, err := o.handlers.Match(ctx, spec, cause); err != nil || !m || deleting {
			o.indexes.Set(spec.ID, c.key.String(), nil)
			continue
		}
		result, err := o.handlers.Invoke(ctx, causes.Call{Handler: spec, Cause: cause, Patch: state.NewPatch(),
			Started: c.now, Logger: c.log.With("handler", spec.ID), Indexes: o.indexes})
		if err != nil {
			c.log.Error("index function failed; the object's entries are left out", "handler", spec.ID, "error", err)
			o.indexes.Set(spec.ID, c.key.String(), nil)
			continue
		}
		o.indexes.Set(spec.ID, c.key.String(), indexEntries(result.Value))
	}
	o.mu.Lock()
	c.mem.indexedVersion = rv
	if ran && c.mem.countedForIndexing && !c.mem.indexed {
		c.mem.indexed = true
		o.pendingIndexing--
	}
	o.mu.Unlock()
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
// every object of it went through its index functions.
func (o *Operator) indexesReady() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.pendingIndexing > 0 {
		return false
	}
	for r, w := range o.watchers {
		if o.hasKind(r, causes.KindIndex) && !w.synced() {
			return false
		}
	}
	return true
}

// noteEssentialChange remembers when the object's essence (what users change, not
// status or the operator's annotations) last changed, for idle timers.
func (c *cycle) noteEssentialChange() {
	encoded, err := state.EncodeEssence(state.Essence(c.body.Object, c.op.opts.Prefix))
	if err != nil {
		return
	}
	sum := sha256.Sum256([]byte(encoded))
	c.op.mu.Lock()
	defer c.op.mu.Unlock()
	if c.mem.essenceHash != sum {
		if c.mem.essenceHash != ([32]byte{}) {
			c.mem.lastChangeAt = c.now
		}
		c.mem.essenceHash = sum
	}
}

// identityOf keeps what identifies an object (its metadata's uid, name, namespace).
func identityOf(body map[string]any) map[string]any {
	meta, _ := body["metadata"].(map[string]any)
	return map[string]any{"metadata": map[string]any{"uid": meta["uid"], "name": meta["name"], "namespace": meta["namespace"]}}
}
