package processing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/luaop/luaop/handling"
	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// process runs one cycle for one object. It returns when to look at the object again
// without a new event (0: only on the next event), or an error of the framework
// itself (API failures), which the caller throttles.
//
// The worker calling it holds the object's key (the work queue gives a key to one
// worker at a time), so it owns st.mem; it holds no lock while handlers run.
func (o *Reactor) process(ctx context.Context, key objectKey) (time.Duration, error) {
	if o.releaseIfRequested(key) {
		return 0, nil // handed to another replica (shard.go)
	}
	st := o.objects.get(key)
	if st == nil {
		o.dropRelatedOfUnknown(key)
		if o.ready.forget(key) {
			o.wakeIndexWaiters()
		}
		return 0, nil
	}
	// A DELETED event of a selected watch may be the object leaving the selection
	// (departure.go): read before the inbox is taken, so that a failed read loses
	// no raw event.
	dep, err := o.departureOf(ctx, key, st)
	if err != nil {
		return 0, err
	}
	mem := &st.mem
	in := st.inbox.take()
	if o.cycleDone != nil {
		defer func() { o.cycleDone(key, in.lastSeenVersion, mem.expectedVersion != "") }()
	}
	if dep != nil && !(in.gone && in.uid == dep.uid) {
		dep = nil // something arrived since the read: it is handled as it comes
	}
	idx := o.specs()
	specs := idx.byResource[key.resource]
	log := o.log.With(objectAttrs(key, o.kindOf(key), in.uid)...)

	if dep != nil {
		in.events = withoutDeparture(in.events, dep.uid)
	}
	eventPatch := o.runRawEvents(ctx, log, key, specs, in)
	if dep != nil {
		return 0, o.leaveSelection(ctx, log, key, st, dep, specs)
	}
	if o.endIncarnation(ctx, log, key, st, in) {
		return 0, nil
	}
	latest := st.inbox.latestOf(in.uid)
	if latest == nil {
		return 0, nil // re-created meanwhile: the notification queued the key again
	}
	info := o.resourceInfo(key.resource)
	if info == nil {
		return 0, nil
	}
	now := o.clock.Now()
	if mem.uid == "" {
		mem.uid, mem.lastChangeAt = in.uid, now
	}
	if eventPatch != nil {
		// Kept until a cycle applies it (this one may wait for consistency).
		if mem.eventPatch == nil {
			mem.eventPatch = state.NewPatch()
		}
		mem.eventPatch.Merge(eventPatch.Map())
	}
	c := &cycle{op: o, key: key, info: info, store: info.storage(), body: latest, log: log, now: now, patch: state.NewPatch(), specs: specs, st: st, mem: mem}
	if wait, endsCycle, err := c.learnUnknownWrite(ctx); endsCycle {
		return wait, err
	}
	waitForConsistency := c.awaitConsistency(in.lastSeenVersion)

	// Indexes and daemons follow the newest body known at once; they need no
	// consistency (daemons read theirs through the inbox, as the watch delivers it).
	c.updateIndexes(ctx)
	c.adjustDaemons(ctx)
	newEvent := in.lastSeenVersion != mem.seenVersion
	mem.seenVersion = in.lastSeenVersion
	if mem.retryAt.After(now) && !newEvent && !st.inbox.hasDaemonPatch(mem.uid) && mem.eventPatch == nil {
		// The change handling failed on a framework error and waits for its
		// backoff; nothing new arrived: this wake-up is for the timers, which keep
		// their schedule (kopf's timers are tasks of their own).
		return soonest(c.runTimersAlone(ctx), mem.retryAt.Sub(now)), errBackingOff
	}
	if waitForConsistency > 0 {
		return waitForConsistency, nil
	}
	if !o.indexesReady(idx) {
		// kopf: change handlers wait until the initial listing is indexed, so that
		// lookups see every object. Parked first, then checked again: a wake-up
		// between the two is never missed.
		o.ready.park(key)
		if !o.indexesReady(idx) {
			return 0, nil
		}
	}
	c.carryTheirs()
	return c.handleChanges(ctx, objectFacts{noticedByListing: in.listed, resumeIsHandled: mem.resumeIsHandled})
}

// runRawEvents runs the raw event handlers on every event taken from the inbox, in
// order, never retried, errors only logged. They do not wait for consistency: they
// report what the watch said. It returns what they wrote about the object as it
// exists now, for the object's next patch.
func (o *Reactor) runRawEvents(ctx context.Context, log *slog.Logger, key objectKey, specs []causes.Spec, in inboxSnapshot) *state.Patch {
	var eventPatch *state.Patch
	for _, ev := range in.events {
		p := o.runEventHandlers(ctx, log, key, specs, ev)
		if p != nil && !p.IsEmpty() && ev.eventType != "DELETED" && string(ev.object.GetUID()) == in.uid && !in.gone {
			if eventPatch == nil {
				eventPatch = state.NewPatch()
			}
			eventPatch.Merge(p.Map())
		}
	}
	return eventPatch
}

// endIncarnation forgets an incarnation that is over: deleted, or deleted and
// re-created under the same name before this worker ran. Its daemons, index entries
// and memo go with it; the new one starts from nothing. It tells whether the object
// is gone (nothing more to do).
func (o *Reactor) endIncarnation(ctx context.Context, log *slog.Logger, key objectKey, st *objectState, in inboxSnapshot) bool {
	mem := &st.mem
	handled := mem.uid != "" && mem.uid == in.uid // a cycle saw this incarnation
	if mem.uid != "" && (in.gone || mem.uid != in.uid) {
		o.forgetIncarnation(key, mem)
		o.board.forget(key)
		*mem = objectMemory{}
	}
	if !in.gone {
		return false
	}
	o.relations.inbox.drop(key)
	if handled {
		// kopf: "Deleted, really deleted, and we are notified."
		log.Log(ctx, o.opts.SuccessLogLevel, "deleted, really deleted, and the operator is notified", "reason", string(causes.Gone))
	}
	if o.objects.dropIfGone(key, st) && o.ready.forget(key) {
		o.wakeIndexWaiters()
	}
	return true
}

// learnUnknownWrite reads the object from the server before any handler runs on a
// body that may miss what the operator handled: after a write that got no answer,
// or a body older than what a consistent read showed at start (freshness.go).
// endsCycle: the cycle ends here, to look again after wait (or on error).
func (c *cycle) learnUnknownWrite(ctx context.Context) (wait time.Duration, endsCycle bool, err error) {
	mem := c.mem
	if mem.expectedVersion == "" && c.info.floor.Load().stale(c.key, c.body) {
		// Older than what a consistent read showed at start: what the operator
		// already handled may be missing from it. (While a version read from the
		// server is awaited, the consistency wait covers it.)
		mem.staleBody = true
	}
	if !(mem.writeUnknown && !c.op.opts.DryRun || mem.staleBody) {
		return 0, false, nil
	}
	wait, stop, err := c.readAfterUnknownWrite(ctx)
	if err == nil && wait <= 0 && !stop {
		return 0, false, nil
	}
	if wait > 0 && !stop && err == nil {
		// The change handling waits to learn what the unanswered write did; the
		// timers do not (kopf's timers are tasks of their own): they keep their
		// schedule while the API server answers writes with errors.
		return soonest(wait, c.runTimersAlone(ctx)), true, nil
	}
	return wait, true, err
}

// awaitConsistency keeps change handlers from a body older than the operator's own
// last write (they would run again what it recorded as done): they wait for the
// watch to deliver it, up to the consistency timeout. It returns how long to wait
// (0: go on, with c.body the body to handle).
func (c *cycle) awaitConsistency(lastSeenVersion string) time.Duration {
	mem := c.mem
	if mem.expectedVersion == "" {
		return 0
	}
	own := mem.expectedBody
	switch {
	case !versionOlder(lastSeenVersion, mem.expectedVersion):
		mem.expectedVersion, mem.expectedBody = "", nil // the watch delivered our own patch
	case c.now.Before(mem.consistencyDeadline):
		// The next event wakes us earlier than this.
		return mem.consistencyDeadline.Sub(c.now)
	case own != nil && versionNewer(own.GetResourceVersion(), c.body.GetResourceVersion()):
		// kopf handles the stale body here, and runs again what the patch recorded
		// as done. The patch's own response is the object right after our write,
		// newer than anything the watch delivered (resourceVersions are compared as
		// numbers, as the API server issues them): that is handled instead, in this
		// cycle and in every one until the watch catches up.
		c.body = own
		if !mem.lateWatchWarned {
			mem.lateWatchWarned = true
			c.log.Warn("the watch did not deliver the operator's own last patch in time; handling the body that patch returned",
				"expectedVersion", mem.expectedVersion, "timeout", c.op.opts.ConsistencyTimeout)
		}
	default:
		// Versions that do not compare as numbers: kopf's way, the newest body seen.
		c.log.Warn("the watch did not deliver the operator's own last patch in time; handling the newest body seen",
			"expectedVersion", mem.expectedVersion, "timeout", c.op.opts.ConsistencyTimeout)
		mem.expectedVersion, mem.expectedBody = "", nil
	}
	return 0
}

// carryTheirs puts into the cycle's patch what daemons handed over and what event
// handlers wrote: applied here, in order with this object's other writes, so that
// no update is lost between a daemon and a handler.
//
// A daemon's patch that changes nothing of the object (a status written again with
// the same values at every luaop.sleep) is dropped: it would cost a write, and
// every watcher an event, each time. c.body is at least as new as the operator's
// own last write here (awaitConsistency), so nothing the daemon asked for is lost:
// a value changed by someone else since shows as a change, and is written.
func (c *cycle) carryTheirs() {
	c.daemonPatch = c.st.inbox.takeDaemonPatch(c.mem.uid)
	if c.daemonPatch != nil && !state.Changes(c.body.Object, c.daemonPatch) {
		c.daemonPatch = nil
	}
	if c.daemonPatch != nil {
		c.patch.Merge(c.daemonPatch)
		c.carried = true
	}
	c.eventPatch = c.mem.eventPatch
	if c.eventPatch != nil {
		c.patch.Merge(c.eventPatch.Map())
		c.mem.eventPatch = nil
		c.carried = true
	}
}

// keepTheirs hands back what daemons and event handlers wrote when the cycle's
// write failed: it is theirs to lose only once written.
func (c *cycle) keepTheirs(err error) {
	if c.carriedWritten {
		return // written already: handing it back would write old values again
	}
	if c.refused || apierrors.IsInvalid(err) || refusedAsTooLarge(err) {
		c.log.Error("the server refused the object's patch; what daemons and event handlers wrote in it is dropped", "error", err)
		return
	}
	if c.daemonPatch != nil {
		c.st.inbox.restoreDaemonPatch(c.mem.uid, c.daemonPatch)
	}
	if c.eventPatch != nil {
		if c.mem.eventPatch != nil {
			c.eventPatch.Merge(c.mem.eventPatch.Map())
		}
		c.mem.eventPatch = c.eventPatch
	}
}

// handleChanges runs the change handling, then the timers that are due, and
// applies what they wrote.
func (c *cycle) handleChanges(ctx context.Context, facts objectFacts) (time.Duration, error) {
	o, mem := c.op, c.mem
	requeue, err := c.run(ctx, facts)
	// An object of the initial listing counts as processed after its first full
	// attempt, failed or not: one object the operator cannot patch (RBAC, a handler
	// writing invalid data) must not keep it unready forever.
	o.ready.processed(c.key)
	c.followRelated()
	if err != nil {
		c.keepTheirs(err)
		// The timers run all the same, in a write of their own.
		return c.frameworkFailed(ctx, c.runTimersAlone(ctx), err)
	}
	timersWake := c.runTimers(ctx)
	o.board.setTimers(c.key, mem.timers)
	if err := c.apply(ctx); err != nil { // what timers (or daemons) wrote
		c.keepTheirs(err)
		return c.frameworkFailed(ctx, timersWake, err)
	}
	mem.retryAt = time.Time{}
	if c.resumeIsHandled {
		mem.resumeIsHandled = true
	}
	return soonest(requeue, timersWake), nil
}

// errBackingOff: a cycle ran only the object's timers, while the change handling
// waits for the backoff of a framework error (processNext keeps that backoff).
var errBackingOff = errors.New("backing off after a framework error; only the timers ran")

// frameworkFailed is the end of a cycle that failed on a framework error: the
// change handling is tried again after the object's failure backoff, or on a new
// event; the timers' next run may come sooner.
func (c *cycle) frameworkFailed(ctx context.Context, timersWake time.Duration, err error) (time.Duration, error) {
	retryIn := c.op.failures.When(c.key)
	c.mem.retryAt = c.now.Add(retryIn)
	return soonest(retryIn, timersWake), err
}

// runTimersAlone runs the timers that are due, in a write of their own: in a cycle
// whose change handling failed or is backing off (its patch is not theirs to lose).
func (c *cycle) runTimersAlone(ctx context.Context) time.Duration {
	c.patch = state.NewPatch()
	c.carried, c.endsCause = false, false
	// The change handlers' write failed: their successes were not stored, and must
	// not be reported (or blamed, by a refusal of this write) as if they were.
	c.unreported, c.ran, c.succeeded = nil, nil, nil
	wake := c.runTimers(ctx)
	c.op.board.setTimers(c.key, c.mem.timers)
	// This write carries no handler's record: when its answer is lost, nothing is
	// to be learned before the change handling goes on (no handler could run twice),
	// so it does not open the wait after an unanswered write; the timers' own failing
	// writes would otherwise keep that wait, and the timers behind it, going.
	unknown, unknownUntil := c.mem.writeUnknown, c.mem.writeUnknownUntil
	if err := c.apply(ctx); err != nil {
		c.mem.writeUnknown, c.mem.writeUnknownUntil = unknown, unknownUntil
		c.log.Error("the timers' patch failed; their results are lost, they run again at their next time", "error", err)
	}
	return wake
}

// soonest returns the smaller positive duration (0 means none).
func soonest(a, b time.Duration) time.Duration {
	switch {
	case a <= 0:
		return b
	case b <= 0:
		return a
	case a < b:
		return a
	}
	return b
}

// forgetIncarnation drops everything known about an incarnation that is over: its
// daemons are cancelled at once (their object no longer exists), its index entries
// dropped, and its memo forgotten once the daemons exited (a daemon still unwinding
// would otherwise make a new memo for it).
func (o *Reactor) forgetIncarnation(key objectKey, mem *objectMemory) {
	var exiting []*daemonRun
	for _, d := range mem.daemons {
		d.stop(0, 0)
		exiting = append(exiting, d)
	}
	o.indexes.Remove(key.String())
	uid := mem.uid
	if len(exiting) == 0 {
		o.handlers.Forget(uid)
		return
	}
	o.forgetting.Add(1)
	go func() {
		defer o.forgetting.Done()
		for _, d := range exiting {
			<-d.done
		}
		o.handlers.Forget(uid)
	}()
}

// runEventHandlers runs the raw event handlers of one event. What they write into
// ctx.patch and return is kept for the object's next patch (kopf applies both), but
// only when the event is about the object as it exists now.
func (o *Reactor) runEventHandlers(ctx context.Context, log *slog.Logger, key objectKey, specs []causes.Spec, ev rawEvent) *state.Patch {
	cause := handling.ForEvent(key.resource, ev.object.Object, ev.eventType)
	var patch *state.Patch
	for _, spec := range specs {
		if spec.Kind != causes.KindEvent {
			continue
		}
		if ok, err := o.handlers.Match(ctx, spec, cause); err != nil || !ok {
			if err != nil {
				log.Error("event handler filter failed", "handler", spec.ID, "error", err)
			}
			continue
		}
		if patch == nil {
			patch = state.NewPatch()
		}
		start := time.Now()
		result, err := o.handlers.Invoke(ctx, causes.Call{Handler: spec, Cause: cause, Patch: patch, Started: start, Logger: log.With("handler", spec.ID, "reason", "event"), Indexes: o.indexes})
		took := time.Since(start)
		outcome := handling.Judge(spec, handling.Attempt{}, err).Outcome
		if err != nil {
			// kopf: event handlers' errors are ignored (never retried), and logged.
			log.Error("handler failed; event handlers are never retried", "handler", spec.ID, "reason", "event", "took_ms", tookMs(took), "error", err, "event", ev.eventType)
		} else {
			handling.StoreResult(patch, spec, result.Value)
			logOutcome(log, o.opts.SuccessLogLevel, spec.ID, "event", OutcomeSuccess, took, nil, "event", ev.eventType)
		}
		o.observe(key, spec.ID, "event", outcome, took, err)
	}
	return patch
}

func (o *Reactor) observe(key objectKey, id, reason string, outcome Outcome, d time.Duration, err error) {
	o.observeAs(key, id, id, reason, outcome, d, err)
}

// observeAs is observe with the id metrics label the run with (HandlerRun.MetricID).
func (o *Reactor) observeAs(key objectKey, id, metricID, reason string, outcome Outcome, d time.Duration, err error) {
	if o.opts.OnHandlerRun == nil {
		return
	}
	o.opts.OnHandlerRun(HandlerRun{Resource: key.resource.String(), Controller: ControllerName(key.resource), Namespace: key.namespace, Name: key.name,
		HandlerID: id, MetricID: metricID, Reason: reason, Outcome: outcome, Duration: d, Err: err})
}

// cycle is one pass of change handling over one body of one object.
type cycle struct {
	op    *Reactor
	key   objectKey
	info  *resourceInfo
	store *storage // where this resource's bookkeeping lives, for this cycle
	body  *unstructured.Unstructured
	specs []causes.Spec
	log   *slog.Logger
	now   time.Time
	patch *state.Patch
	// endsCause: the patch stores a new diff-base (the cause is done); apply then
	// sends the write that carries it last.
	endsCause bool

	st  *objectState
	mem *objectMemory // owned by this cycle's worker

	// subhandlerIDs are the subhandlers that ran or were registered in this cycle;
	// their records are purged with their parents'.
	subhandlerIDs []string
	// topIDs maps the subhandlers of this cycle to the top-level handler that
	// registered them (directly or not): the id of their runs in metrics.
	topIDs          map[string]string
	resumeIsHandled bool
	// releaseFinalizer: the delete cause completed; the finalizer goes in a patch of
	// its own after the cycle's patch.
	releaseFinalizer bool
	// last is the object as the cycle's last patch returned it.
	last *unstructured.Unstructured
	// finishEssence, when set, is the essence stored as the diff-base when the cause
	// completes: the pinned one (run).
	finishEssence any
	// carried: the cycle's patch holds what daemons and event handlers wrote
	// (daemonPatch, eventPatch: carryTheirs); carriedWritten: some write of it
	// succeeded, so it is not handed back (keepTheirs).
	carried, carriedWritten bool
	daemonPatch             map[string]any
	eventPatch              *state.Patch
	// succeeded are the handlers ("id/reason") that succeeded in this cycle, noted
	// in the memory with the version of the write that stored them.
	succeeded []string
	// ran are the change handlers that ran in this cycle, in order, with the
	// records they got; unreported holds their successes, reported (log, Event,
	// metrics) once a write stored them (apply).
	ran        []ranHandler
	unreported []unreportedSuccess
	// refused: the server refused to store a write of this cycle for good; the
	// handlers whose content was in it were recorded as failed instead
	// (refuseWrites), and the cause, if it ended, ends in the next cycle.
	refused bool
	// held are the field handlers' held-back values stored with the diff-base;
	// outOfFilter, those this cycle's cause passed by (heldback.go); heldOnly: the
	// cause is there for held-back handlers only (nothing else changed).
	held, outOfFilter map[string]heldValue
	heldOnly          bool
	// related is what this cycle took of the object's related triggers (a Related
	// cause), by handler; causeCompleted: a cause completed in this cycle (its
	// write done), so pending triggers get the next cycle (related.go).
	related         map[string]relatedTaken
	relatedFinished []string
	causeCompleted  bool
}

// ranHandler is one change handler run of a cycle. wrote: its result or its
// ctx.patch went into the cycle's patch.
type ranHandler struct {
	spec   causes.Spec
	reason causes.Reason
	record state.HandlerRecord
	wrote  bool
	// wroteMain and wroteStatus: what it wrote went to the object's write, to the
	// /status write (a status subresource splits the cycle's patch in two writes).
	wroteMain, wroteStatus bool
}

// unreportedSuccess is a success that no write stored yet.
type unreportedSuccess struct {
	id     string
	report func()
}

func (c *cycle) run(ctx context.Context, facts objectFacts) (time.Duration, error) {
	o := c.op
	body := c.body.Object
	finalizer := o.opts.finalizer()
	detected := detectChangeCause(body, c.key.resource, o.opts.Prefix, o.opts.StatusField, finalizer, c.store.diffBase, facts, c.handlerFields())
	if detected.diffBaseProblem != nil {
		c.log.Warn(detected.diffBaseProblem.Error())
	}
	base := detected.Cause
	c.held = detected.held

	if c.mem.released && deletionInProgress(body) {
		// Our part of the deletion is done: only the DELETED event is left.
		return 0, nil
	}
	switch detected.Reason {
	case causes.Free:
		c.mem.pinned = nil
		o.relations.inbox.drop(c.key) // a parent being deleted runs no related handler
		o.board.progress(c.key, c.info.kind, c.mem.uid, "", nil, c.now)
		return 0, nil
	case causes.Delete:
		// Delete handlers run while the daemons stop (kopf): the finalizer stays
		// until both are done.
		c.mem.pinned = nil
		o.relations.inbox.drop(c.key)
		return c.handle(ctx, base, facts)
	}

	// The finalizer is added or removed in a cycle of its own, before handlers run:
	// an object deleted right after a create handler ran must still be held for its
	// delete handlers.
	needed, err := c.finalizerNeeded(ctx, base)
	if err != nil {
		return 0, err
	}
	if needed != hasFinalizer(body, finalizer) {
		if err := c.apply(ctx); err != nil { // what daemons and event handlers wrote
			return 0, err
		}
		if err := c.patchFinalizers(ctx, needed); err != nil || !o.opts.DryRun {
			return 0, err
		}
		// A dry run writes no finalizer, so no event follows: go on as if it had.
	}

	// A cause runs over several cycles (one handler per cycle by default). Once one
	// of its handlers has finished, the cause is pinned: handlers still to run get
	// the newest change (a retrying handler sees the user's fix), and when the cause
	// completes the diff-base becomes the state the first finishers saw, so a change
	// made meanwhile reaches them as the next cause instead of being swallowed
	// (handlers that saw it already may get it twice: at least once, never lost).
	if pin := c.mem.pinned; pin != nil {
		switch {
		case !pin.continues(detected):
			c.mem.pinned = nil
		case detected.Reason == causes.Noop:
			// Changed back meanwhile: the pinned change is still to finish.
			base = handling.ChangeCause(pin.reason, c.key.resource, body, pin.old, pin.new)
			c.finishEssence = pin.new
		default:
			c.finishEssence = pin.new
		}
	}
	if base.Reason == causes.Noop && len(c.held) > 0 && c.heldPending(ctx, base) {
		// Nothing changed since the last cause, but a field handler that was out of
		// its filter then matches now, and has a change of its field to see.
		base.Reason = causes.Update
		c.heldOnly = true
	}
	if base.Reason == causes.Noop {
		o.board.progress(c.key, c.info.kind, c.mem.uid, "", nil, c.now)
		if c.refreshDiffBase() {
			return 0, c.apply(ctx) // its event brings the next cycle, with the related triggers still pending
		}
		return c.handleRelated(ctx, base, facts)
	}
	if !c.prematched(ctx, base) {
		// kopf stores nothing for objects no change handler is interested in: the
		// first time one is, that is their creation.
		return c.handleRelated(ctx, base, facts)
	}
	return c.handle(ctx, base, facts)
}

// pinnedCause is a cause that started and did not complete (worker-owned memory).
type pinnedCause struct {
	reason   causes.Reason
	old, new any
}

// continues tells whether a newly detected cause is still the pinned one: the stored
// diff-base did not move (nobody finished a cause in between).
func (p *pinnedCause) continues(d detectedCause) bool {
	switch {
	case d.Reason == causes.Delete || d.Reason == causes.Free:
		return false
	case p.old == nil:
		return d.Old == nil && d.Reason == causes.Create
	default:
		return d.Old != nil && reflect.DeepEqual(p.old, d.Old)
	}
}

// handlerFields are the fields named by change handlers, added to the essence.
func (c *cycle) handlerFields() [][]string { return handling.ChangeFields(c.specs) }

// prematched tells whether any change handler's filters match the object (its
// reasons and fields aside): kopf's pre-matching, which decides whether the object
// gets a diff-base at all.
func (c *cycle) prematched(ctx context.Context, cause causes.Cause) bool {
	for _, spec := range c.specs {
		if spec.Kind != causes.KindChange || onlyRelated(spec) {
			continue
		}
		pc, present := handling.FieldCause(spec, cause)
		if !present {
			continue
		}
		pc.Prematch = true
		ok, err := c.op.handlers.Match(ctx, spec, pc)
		if err != nil {
			c.log.Error("handler filter failed; counting the handler as interested", "handler", spec.ID, "error", err)
			return true
		}
		if ok {
			return true
		}
	}
	return false
}

// finalizerNeeded: some matching handler must block deletion (a non-optional delete
// handler, a timer, or a daemon that has not returned by itself).
func (c *cycle) finalizerNeeded(ctx context.Context, cause causes.Cause) (bool, error) {
	for _, spec := range c.specs {
		if !spec.RequiresFinalizer() {
			continue
		}
		if d := c.mem.daemons.get(spec.ID); spec.Kind == causes.KindDaemon && d != nil && d.returned.Load() && d.spec.CodeHash == spec.CodeHash {
			continue // it returned and is not restarted: nothing to wait for (kopf)
		}
		fc, present := handling.FieldCause(spec, cause)
		if !present {
			continue
		}
		ok, err := c.op.handlers.Match(ctx, spec, fc)
		if err != nil {
			c.log.Error("handler filter failed; keeping the finalizer to be safe", "handler", spec.ID, "error", err)
			return true, nil
		}
		if ok {
			return true, nil
		}
	}
	return false, nil
}

// selectHandlers returns the change handlers that serve this cause, with the cause
// each receives (field handlers get old/new/diff of their field only).
func (c *cycle) selectHandlers(ctx context.Context, cause causes.Cause, facts objectFacts) ([]causes.Spec, []causes.Cause) {
	var specs []causes.Spec
	var perHandler []causes.Cause
	for _, spec := range c.specs {
		if spec.Kind != causes.KindChange || !servesCause(spec, cause.Reason, facts) {
			continue
		}
		old, diff := c.heldBackOld(spec, cause)
		hc, takesPart, changeOfField := handling.View(spec, cause, old, diff)
		if takesPart && cause.Reason == causes.Related {
			hc.Related, takesPart = c.relatedOf(spec)
		}
		if !takesPart {
			continue
		}
		ok, err := c.op.handlers.Match(ctx, spec, hc)
		if err != nil {
			c.log.Error("handler filter failed; skipping the handler for this cause", "handler", spec.ID, "error", err)
			if cause.Reason == causes.Related {
				c.op.relations.inbox.drop(c.key, spec.ID)
			}
			continue
		}
		if ok {
			specs = append(specs, spec)
			perHandler = append(perHandler, hc)
		} else if changeOfField {
			c.passedBy(spec, cause)
		} else if cause.Reason == causes.Related {
			c.op.relations.inbox.drop(c.key, spec.ID) // not for this object: its filters say so
		}
	}
	return specs, perHandler
}

// servesCause tells whether a change handler takes part in a cause. Resume handlers
// are kopf's "initial" handlers: they join the first cause of an object found at
// startup when that cause is an update or a resume, never a creation (a resume
// handler registered for creation too runs once), and a deletion only when
// registered with deleted = true.
func servesCause(spec causes.Spec, reason causes.Reason, facts objectFacts) bool {
	if spec.Serves(reason) {
		return true
	}
	if !spec.Serves(causes.Resume) || !facts.noticedByListing || facts.resumeIsHandled {
		return false
	}
	switch reason {
	case causes.Update:
		return true
	case causes.Delete:
		return spec.Deleted
	}
	return false
}

func (c *cycle) hasChangeHandlers() bool {
	for _, s := range c.specs {
		if s.Kind == causes.KindChange {
			return true
		}
	}
	return false
}

// handle runs the change handlers of a cause, persists their progress and, once all
// are finished, the diff-base; then applies the cycle's patch.
func (c *cycle) handle(ctx context.Context, cause causes.Cause, facts objectFacts) (time.Duration, error) {
	specs, perHandler := c.selectHandlers(ctx, cause, facts)
	if c.heldOnly && len(specs) == 0 {
		// A cause only for held-back field handlers, whose filters no longer match
		// (a filter that changed its mind): nothing to run, nothing to write.
		return 0, nil
	}
	states := c.handlerStates(specs, cause.Reason)
	c.runSelected(ctx, states, perHandler, cause.Reason)

	finished := allFinished(states)
	if finished && cause.Reason == causes.Delete && c.daemonsRunning() {
		// The delete handlers are done; the daemons were asked to stop and hold the
		// finalizer until they exit (their exit wakes this object).
		finished = false
	}
	if finished {
		c.op.board.progress(c.key, c.info.kind, c.mem.uid, "", nil, c.now)
		err := c.completeCause(ctx, cause, states)
		c.causeCompleted = err == nil
		return 0, err
	}
	c.op.board.progress(c.key, c.info.kind, c.mem.uid, string(cause.Reason), states, c.now)
	return c.persistProgress(ctx, cause, states)
}

// handlerStates are the selected handlers with their stored progress for this
// cause: a record another cause left is started afresh, or re-purposed for a
// resume handler joining the update that supersedes the resume (kopf).
func (c *cycle) handlerStates(specs []causes.Spec, reason causes.Reason) []handlerState {
	body := c.body.Object
	states := make([]handlerState, len(specs))
	var superseded superseding
	for i, spec := range specs {
		rec, found := c.store.progress.Fetch(body, spec.ID)
		stored := rec
		rec = c.wakeForReload(spec.ID, spec.ID, rec)
		switch {
		case !found || rec.Purpose == "" || rec.Purpose == string(reason):
		case rec.Purpose == string(causes.Resume) && !spec.Serves(reason):
			// A resume handler that joins the update superseding a resume keeps its
			// progress (kopf re-purposes it): one that succeeded does not run again.
			superseded.count(rec)
			rec.Purpose = string(reason)
		default:
			// A record left by another cause (a resume superseded by an update, for
			// a handler of both): this cause starts it afresh. The subhandlers its
			// earlier calls registered stay listed, so that the cause's end purges
			// their records too (kopf keeps the union of subrefs).
			superseded.count(rec)
			rec, found = state.HandlerRecord{Subrefs: rec.Subrefs}, false
		}
		states[i] = handlerState{spec: spec, record: rec, found: found, stored: stored}
	}
	startedBefore := slices.ContainsFunc(states, func(h handlerState) bool { return h.stored.Purpose == string(reason) })
	if superseded.any() && !startedBefore {
		// kopf: "Resuming is superseded by updating: 1 succeeded; 0 failed; 1 left."
		// Once, in the new cause's first cycle (no record of it yet).
		c.log.Info("a cause in progress is superseded by "+string(reason), "reason", string(reason),
			"succeeded", superseded.succeeded, "failed", superseded.failed, "left", superseded.left)
	}
	return states
}

// runSelected runs the handlers the lifecycle selects among states, each with its
// view of the cause (perHandler), and keeps their new records in states.
func (c *cycle) runSelected(ctx context.Context, states []handlerState, perHandler []causes.Cause, reason causes.Reason) {
	for _, h := range selectToRun(c.op.opts.Lifecycle, states, c.now) {
		i := indexOf(states, h.spec.ID)
		// Why a handler runs: with this line a re-run shows which version of the
		// object it ran on and what its stored progress said then.
		if c.log.Enabled(ctx, slog.LevelDebug) {
			c.log.Debug("running handler", "handler", h.spec.ID, "reason", string(reason),
				"resourceVersion", c.body.GetResourceVersion(), "expectedVersion", c.mem.expectedVersion,
				"progressFound", h.found, "retries", h.record.Retries)
		}
		if at, ok := c.mem.succeededAt[h.spec.ID+"/"+string(reason)]; ok && !h.found && reason != causes.Update && reason != causes.Related {
			c.log.Warn("running a handler again after its success: the object seen does not show it",
				"handler", h.spec.ID, "reason", string(reason), "succeededInWrite", at, "resourceVersionSeen", c.body.GetResourceVersion())
		}
		states[i].record = c.runChangeHandler(ctx, h, perHandler[i], reason)
		if reason == causes.Related && states[i].record.Finished() {
			c.relatedFinished = append(c.relatedFinished, h.spec.ID)
		}
		if states[i].record.Success {
			c.succeeded = append(c.succeeded, h.spec.ID+"/"+string(reason))
		}
	}
}

// completeCause ends a cause whose handlers all finished: the diff-base and the
// purge of their records go in the cycle's write, then the finalizer's release
// after delete handlers.
func (c *cycle) completeCause(ctx context.Context, cause causes.Cause, states []handlerState) error {
	c.finishCause(cause, states)
	if err := c.apply(ctx); err != nil {
		return err // the pin stays: the cause is not complete until written
	}
	if c.refused {
		// Failures recorded instead of what the server refused: the cause
		// ends in the next cycle, which this write's event starts.
		return nil
	}
	c.mem.pinned = nil
	if c.releaseFinalizer {
		return c.patchFinalizers(ctx, false)
	}
	return nil
}

// persistProgress writes the progress of a cause still in progress (pinning it once
// a handler finished) and returns when a sleeping handler is due.
func (c *cycle) persistProgress(ctx context.Context, cause causes.Cause, states []handlerState) (time.Duration, error) {
	// A resume is not pinned: it changes nothing, and a change made meanwhile
	// supersedes it (kopf), with the resume handlers' progress kept (above).
	if cause.Reason != causes.Delete && cause.Reason != causes.Resume && cause.Reason != causes.Related && c.mem.pinned == nil && anyFinished(states) {
		c.mem.pinned = &pinnedCause{reason: cause.Reason, old: cause.Old, new: cause.New}
	}
	for _, h := range states {
		if h.changed() {
			c.store.progress.Store(c.body.Object, c.patch, h.spec.ID, h.record)
		}
	}
	if err := c.apply(ctx); err != nil {
		return 0, err
	}
	// Handlers still awake run on the event our patch causes; sleeping ones need a
	// wake-up from the queue.
	for _, h := range states {
		if h.record.Awake(c.now) {
			return 0, nil
		}
	}
	if at, ok := earliestWakeup(states, c.now); ok {
		return at.Sub(c.now), nil
	}
	return 0, nil
}

// superseding counts the records of the cause a new one supersedes, for the log.
type superseding struct{ succeeded, failed, left int }

func (s *superseding) count(rec state.HandlerRecord) {
	switch {
	case rec.Success:
		s.succeeded++
	case rec.Failure:
		s.failed++
	default:
		s.left++
	}
}

func (s superseding) any() bool { return s.succeeded+s.failed+s.left > 0 }

// finishCause stores the diff-base (the essence now handled), purges progress records
// (of every handler of the resource, kopf: not only those that ran in this cause),
// and marks the finalizer for release after delete handlers.
func (c *cycle) finishCause(cause causes.Cause, states []handlerState) {
	o := c.op
	body := c.body.Object
	if cause.Reason == causes.Delete {
		// The object goes: its records go with it. Purging them first would make a
		// write of its own, and if the finalizer's removal then failed, the next
		// cycle would find no record and run the delete handlers again.
		c.releaseFinalizer = hasFinalizer(body, o.opts.finalizer())
		return
	}
	purged := map[string]bool{}
	purge := func(id string) {
		if !purged[id] {
			purged[id] = true
			c.store.progress.Purge(body, c.patch, id)
		}
	}
	for _, h := range states {
		purge(h.spec.ID)
		c.purgeSubrefs(h.record.Subrefs, 0)
	}
	for _, id := range c.subhandlerIDs {
		purge(id)
	}
	for _, spec := range c.specs {
		if spec.Kind == causes.KindChange {
			if rec, ok := c.store.progress.Fetch(body, spec.ID); ok {
				c.purgeSubrefs(rec.Subrefs, 0)
				purge(spec.ID)
			}
		}
	}
	c.resumeIsHandled = true
	if !c.hasChangeHandlers() {
		return
	}
	if cause.Reason == causes.Resume || cause.Reason == causes.Related {
		// Nothing of the object changed, so the stored diff-base is already right (unless it still
		// holds a Secret's values as they are).
		c.refreshDiffBase()
		return
	}
	handled := cause.New
	if c.finishEssence != nil {
		handled = c.finishEssence // what the first finishers saw (see run)
	}
	essence, _ := handled.(map[string]any)
	ran := make(map[string]bool, len(states))
	for _, h := range states {
		ran[h.spec.ID] = h.record.Finished()
	}
	essence = withHeldBack(essence, o.opts.Prefix, heldAfterCause(c.held, c.outOfFilter, ran, handled, c.fieldHandlers()))
	if err := c.store.diffBase.Store(body, c.patch, essence); err != nil {
		c.log.Error("cannot store the diff-base: the next change will be seen as a creation again; "+
			"keep big data out of the spec or use a custom storage", "error", err)
		return
	}
	c.endsCause = true
}

// purgeSubrefs purges the records of subhandlers (and theirs) named by a record.
func (c *cycle) purgeSubrefs(ids []string, depth int) {
	if depth > handling.MaxSubhandlerDepth {
		return
	}
	for _, id := range ids {
		if rec, ok := c.store.progress.Fetch(c.body.Object, id); ok {
			c.purgeSubrefs(rec.Subrefs, depth+1)
		}
		c.store.progress.Purge(c.body.Object, c.patch, id)
	}
}

func anyFinished(states []handlerState) bool {
	for _, h := range states {
		if h.record.Finished() {
			return true
		}
	}
	return false
}

func indexOf(states []handlerState, id string) int {
	for i, s := range states {
		if s.spec.ID == id {
			return i
		}
	}
	return -1
}

// runChangeHandler makes one attempt of one handler and returns its new record. A
// handler that registers subhandlers is finished only when they all are: they run
// (per the lifecycle) right after it, each with its own persisted progress, and the
// parent runs again next cycle to register them again (closures live per call).
func (c *cycle) runChangeHandler(ctx context.Context, h handlerState, cause causes.Cause, reason causes.Reason) state.HandlerRecord {
	o := c.op
	rec := h.record
	rec.Purpose = string(reason)
	if msg, ex := exhausted(h.spec, rec, c.now); ex {
		rec.Failure, rec.Stopped, rec.Delayed, rec.Message = true, &c.now, nil, msg
		logOutcome(c.log, o.opts.SuccessLogLevel, h.spec.ID, string(reason), OutcomeFailure, 0, errors.New(msg))
		c.post("Warning", "HandlerFailed", msg)
		o.observeAs(c.key, h.spec.ID, c.topID(h.spec.ID), string(reason), OutcomeFailure, 0, errors.New(msg))
		c.ran = append(c.ran, ranHandler{spec: h.spec, reason: reason, record: rec})
		return rec
	}
	started := c.now
	if rec.Started != nil {
		started = *rec.Started
	}
	// The handler writes into a patch of its own, merged into the cycle's: what it
	// wrote is known, should the server refuse to store it (refuseWrites).
	own := state.NewPatch()
	call := causes.Call{
		Handler: h.spec, Cause: cause, Patch: own, Retry: rec.Retries,
		Started: started, Runtime: c.now.Sub(started),
		Logger: c.log.With("handler", h.spec.ID, "reason", string(reason)), Indexes: o.indexes,
	}
	t0 := time.Now()
	result, err := o.handlers.Invoke(ctx, call)
	took := time.Since(t0)
	if err == nil {
		handling.StoreResult(own, h.spec, result.Value)
	}
	wrote := !own.IsEmpty()
	var wroteMain, wroteStatus bool
	if wrote {
		c.patch.Merge(own.Map())
		main, status := own.Split()
		wroteMain, wroteStatus = len(main) > 0, len(status) > 0
	}
	if err == nil && len(result.Subhandlers) > 0 {
		rec = c.runSubhandlers(ctx, h.spec, rec, result.Subhandlers, cause, reason)
	} else {
		var outcome Outcome
		rec, outcome = foldOutcome(o.opts.withBackoff(h.spec), rec, c.now, err)
		if outcome == OutcomeFailure && err != nil && rec.Message != err.Error() {
			err = errors.New(rec.Message) // "exceeded its N retries (last error: ...)"
		}
		c.report(h.spec.ID, reason, rec, outcome, took, err)
	}
	c.ran = append(c.ran, ranHandler{spec: h.spec, reason: reason, record: rec, wrote: wrote, wroteMain: wroteMain, wroteStatus: wroteStatus})
	return rec
}

func (c *cycle) runSubhandlers(ctx context.Context, parent causes.Spec, rec state.HandlerRecord, subs []causes.Spec, cause causes.Cause, reason causes.Reason) state.HandlerRecord {
	o := c.op
	body := c.body.Object
	if rec.Started == nil {
		rec.Started = &c.now
	}
	if msg, tooDeep := handling.NestedTooDeep(parent.ID); tooDeep {
		rec.Failure, rec.Stopped, rec.Message = true, &c.now, msg
		return rec
	}
	children := make([]handlerState, len(subs))
	// Every child the parent ever registered stays listed (kopf keeps the union), so
	// that the cause's end purges the records of children a later call dropped.
	registeredBefore := rec.Subrefs
	rec.Subrefs = make([]string, 0, len(subs)+len(registeredBefore))
	for i, sub := range subs {
		child, found := c.store.progress.Fetch(body, sub.ID)
		stored := child
		child = c.wakeForReload(sub.ID, c.topID(parent.ID), child)
		if found && child.Purpose != "" && child.Purpose != string(reason) {
			child, found = state.HandlerRecord{}, false
		}
		children[i] = handlerState{spec: sub, record: child, found: found, stored: stored}
		rec.Subrefs = append(rec.Subrefs, sub.ID)
		c.subhandlerIDs = append(c.subhandlerIDs, sub.ID)
	}
	if !slices.Equal(registeredBefore, rec.Subrefs) {
		registered := make(map[string]bool, len(rec.Subrefs))
		for _, id := range rec.Subrefs {
			registered[id] = true
		}
		for _, id := range registeredBefore {
			if !registered[id] {
				registered[id] = true
				rec.Subrefs = append(rec.Subrefs, id)
			}
		}
	}
	if c.topIDs == nil {
		c.topIDs = map[string]string{}
	}
	for _, h := range selectToRun(o.opts.Lifecycle, children, c.now) {
		i := indexOf(children, h.spec.ID)
		c.topIDs[h.spec.ID] = c.topID(parent.ID)
		children[i].record = c.runChangeHandler(ctx, h, cause, reason)
		// Only the children that ran have new records: the others' are on the
		// object as they are (kopf's asap lifecycle runs one child per cycle, so
		// looking at every record again would make each cycle cost all of them).
		if children[i].changed() {
			c.store.progress.Store(body, c.patch, h.spec.ID, children[i].record)
		}
	}
	if !allFinished(children) {
		// kopf counts the attempt (HandlerChildrenRetry is an outcome like any):
		// the parent's ctx.retry goes up, and its retries and timeout bound how
		// long its subhandlers may take.
		rec.Retries++
		rec.Message = "subhandlers pending: " + pendingSummary(pendingIDs(children))
		rec.Delayed = nil
		if !anyAwake(children, c.now) {
			if at, ok := earliestWakeup(children, c.now); ok {
				rec.Delayed = &at
			}
		}
		return rec
	}
	rec.Stopped, rec.Delayed = &c.now, nil
	for _, ch := range children {
		if ch.record.Failure {
			rec.Failure, rec.Message = true, fmt.Sprintf("subhandler %s failed: %s", ch.spec.ID, ch.record.Message)
			c.report(parent.ID, reason, rec, OutcomeFailure, 0, errors.New(rec.Message))
			return rec
		}
	}
	rec.Success, rec.Message = true, ""
	c.report(parent.ID, reason, rec, OutcomeSuccess, 0, nil)
	return rec
}

// pendingIDs are the ids of the handlers not finished yet.
// pendingListed is how many pending subhandlers a parent's message names: the
// message is written into the parent's record at every cycle, so naming all of
// 20,000 would outgrow the 256 KiB annotations may hold (and cost each write).
const pendingListed = 5

// pendingSummary names the first pendingListed ids and counts the others.
func pendingSummary(ids []string) string {
	if len(ids) <= pendingListed {
		return strings.Join(ids, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(ids[:pendingListed], ", "), len(ids)-pendingListed)
}

func pendingIDs(states []handlerState) []string {
	var ids []string
	for _, h := range states {
		if !h.record.Finished() {
			ids = append(ids, h.spec.ID)
		}
	}
	return ids
}

func anyAwake(states []handlerState, now time.Time) bool {
	for _, h := range states {
		if h.record.Awake(now) {
			return true
		}
	}
	return false
}

// report logs, posts and observes one handler outcome.
func (c *cycle) report(id string, reason causes.Reason, rec state.HandlerRecord, outcome Outcome, took time.Duration, err error) {
	c.noteRetry(id, outcome)
	if outcome == OutcomeSuccess {
		// Reported once a write stored it: a success the server refused to store is
		// a failure (refuseWrites).
		c.unreported = append(c.unreported, unreportedSuccess{id: id, report: func() {
			logOutcome(c.log, c.op.opts.SuccessLogLevel, id, string(reason), outcome, took, err)
			c.post("Normal", "HandlerSucceeded", fmt.Sprintf("Handler %s succeeded (%s).", id, reason))
			c.op.observeAs(c.key, id, c.topID(id), string(reason), outcome, took, err)
		}})
		return
	}
	var more []any
	if outcome == OutcomeRetry {
		more = []any{"retry", rec.Retries, "at", rec.Delayed.Format(time.RFC3339)}
	}
	logOutcome(c.log, c.op.opts.SuccessLogLevel, id, string(reason), outcome, took, err, more...)
	switch outcome {
	case OutcomeRetry:
		c.post("Warning", "HandlerRetrying", fmt.Sprintf("Handler %s failed, retry %d: %s", id, rec.Retries, err))
	case OutcomeFailure:
		c.post("Warning", "HandlerFailed", fmt.Sprintf("Handler %s failed permanently: %s", id, err))
	}
	c.op.observeAs(c.key, id, c.topID(id), string(reason), outcome, took, err)
}

// topID is the id of the top-level handler of a handler of this cycle: its own for
// a top-level one.
func (c *cycle) topID(id string) string {
	if top, ok := c.topIDs[id]; ok {
		return top
	}
	return id
}

// tookMs is a duration as milliseconds with a fraction, the unit of every "*_ms" field.
func tookMs(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
