package processing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/luaop/luaop/caching"
	"github.com/luaop/luaop/handling"
	"github.com/luaop/luaop/state"
)

// apply sends the cycle's patch: one merge patch of /status when status is a
// subresource (first, so a crash between the two re-runs a handler rather than
// losing its result), then one of the object. It remembers the version the last
// patch produced, so the next change handlers wait for it.
func (c *cycle) apply(ctx context.Context) error {
	after := c.takeRemovals()
	if c.patch.IsEmpty() {
		c.stored()
		return nil
	}
	w := c.startWrite(ctx)
	// The write that carries the bookkeeping goes last: if the other one fails, the
	// handlers are not recorded as done and run again rather than lose what they
	// wrote (kopf sends the object, then /status). With progress and diff-base in
	// different places, that is the diff-base's write when the cause ends (the
	// records' removal and the last results land first: a new diff-base beside
	// stale records would have the next cause skip handlers), else the records'.
	statusLast := c.store.progressInStatus
	if c.endsCause {
		statusLast = c.store.diffBaseInStatus
	}
	c.endsCause = false
	if err := w.sendInOrder(statusLast); err != nil {
		return c.refuseWrites(ctx, err)
	}
	w.removeStale(after)
	if w.last != nil {
		c.noteWritten(ctx, w.last)
	}
	c.stored()
	return nil
}

// takeRemovals takes from the cycle's patch the removals of what the storage no
// longer in use holds (state.Patch.After): they go in the same write when there is
// one write that cannot fall back (nothing kept in status), else after the others
// (returned).
func (c *cycle) takeRemovals() *state.Patch {
	after := c.patch.TakeAfter()
	inStatus := c.store.progressInStatus || c.store.diffBaseInStatus
	if after != nil && (c.patch.IsEmpty() || !c.info.statusSubresource && !inStatus) {
		c.patch.Merge(after.Map())
		after = nil
	}
	return after
}

// cycleWrite is one apply's writes of the cycle's patch: the object's part (main)
// and, when status is a subresource, the /status part.
type cycleWrite struct {
	c      *cycle
	ctx    context.Context
	client dynamic.ResourceInterface
	main   map[string]any
	status map[string]any
	// last is the object as the last successful write returned it.
	last *unstructured.Unstructured
	// mainSent: the object's write was sent; fellBack: the server pruned the status
	// storage and the bookkeeping moved to annotations.
	mainSent, fellBack bool
}

// startWrite splits the cycle's patch into its writes; what is written after this
// point goes into a patch of its own.
func (c *cycle) startWrite(ctx context.Context) *cycleWrite {
	w := &cycleWrite{c: c, ctx: ctx, client: c.op.dynamic.Resource(c.info.gvr).Namespace(c.key.namespace), main: c.patch.Map()}
	if c.info.statusSubresource {
		w.main, w.status = c.patch.Split()
	}
	c.patch = state.NewPatch()
	// The incarnation is a precondition: a patch meant for an object that was
	// deleted and re-created under its name meanwhile must not land on the new one
	// (it would mark it handled with the old one's essence). The server refuses a
	// merge patch that changes metadata.uid; on /status of a custom resource it
	// copies metadata from the stored object first, so there a JSON patch tests it.
	w.main = withUID(w.main, c.mem.uid)
	return w
}

// sendInOrder sends both writes: the /status one last when statusLast.
func (w *cycleWrite) sendInOrder(statusLast bool) error {
	if statusLast {
		if err := w.sendMain(); err != nil {
			return err
		}
		return w.sendStatus()
	}
	if err := w.sendStatus(); err != nil {
		return err
	}
	return w.sendMain()
}

// wrote records a successful write's answer.
func (w *cycleWrite) wrote(resp *unstructured.Unstructured) {
	w.last = resp
	w.c.carriedWritten = w.c.carriedWritten || w.c.carried
	w.c.expectVersion(resp)
}

// sendMain sends the object's part: a merge patch. Where status is an ordinary
// field, a storage the server pruned falls back to annotations, sent again.
func (w *cycleWrite) sendMain() error {
	c := w.c
	w.mainSent = true
	if len(w.main) == 0 {
		return nil
	}
	resp, err := c.send(w.ctx, "", func(data []byte) (*unstructured.Unstructured, error) {
		return w.client.Patch(w.ctx, c.key.name, types.MergePatchType, data, metav1.PatchOptions{})
	}, w.main)
	if err != nil || resp == nil {
		return err
	}
	w.wrote(resp)
	if c.info.statusSubresource {
		return nil
	}
	// Status is an ordinary field here: a built-in kind drops it, a CRD's schema may.
	if moved := c.fallBackIfStoragePruned(w.main, resp); moved != nil {
		w.fellBack = true
		w.main = withUID(moved, c.mem.uid)
		return w.sendMain()
	}
	c.checkPruning(w.main, resp)
	return nil
}

// sendStatus sends the /status part. What the server pruned of the status storage
// moves to annotations: into the object's write when it is still to be sent, else
// in one of its own.
func (w *cycleWrite) sendStatus() error {
	c := w.c
	if len(w.status) == 0 {
		return nil
	}
	resp, err := c.patchStatus(w.ctx, w.status)
	if err != nil || resp == nil {
		return err
	}
	w.wrote(resp)
	moved := c.fallBackIfStoragePruned(w.status, resp)
	if moved == nil {
		c.checkPruning(w.status, resp)
		return nil
	}
	w.fellBack = true
	if w.mainSent { // what was pruned goes in a patch of its own
		w.main = withUID(moved, c.mem.uid)
		return w.sendMain()
	}
	merged := state.NewPatch()
	merged.Merge(w.main)
	merged.Merge(moved)
	w.main = withUID(merged.Map(), c.mem.uid)
	return nil
}

// removeStale sends the removals taken aside (takeRemovals). After a fallback the
// storage in use is annotations, which the removals are about: what was moved
// there must stay. A failed removal leaves a stale copy in the storage not in use,
// read only when the one in use has none; the next write of the same record
// removes it again.
func (w *cycleWrite) removeStale(after *state.Patch) {
	if after == nil || w.fellBack {
		return
	}
	c := w.c
	w.main, w.status = after.Map(), nil
	if c.info.statusSubresource {
		w.main, w.status = after.Split()
	}
	w.main = withUID(w.main, c.mem.uid)
	err := w.sendMain()
	if err == nil {
		err = w.sendStatus()
	}
	if err != nil {
		c.log.Warn("the old copy of the bookkeeping in the storage no longer in use was not removed; it is removed at the next handled change",
			"error", err)
	}
}

// noteWritten keeps the object as the cycle's last write returned it, and the
// version that stored each success of the cycle.
func (c *cycle) noteWritten(ctx context.Context, last *unstructured.Unstructured) {
	c.last = last
	if c.log.Enabled(ctx, slog.LevelDebug) {
		c.log.Debug("patched", "resourceVersion", last.GetResourceVersion(), "expectedVersion", c.mem.expectedVersion)
	}
	for _, id := range c.succeeded {
		if c.mem.succeededAt == nil {
			c.mem.succeededAt = map[string]string{}
		}
		c.mem.succeededAt[id] = last.GetResourceVersion()
	}
	c.succeeded = nil
}

// stored: what the handlers of the cycle wrote so far is on the object (or there
// was nothing to write); their successes are reported now.
func (c *cycle) stored() {
	for _, u := range c.unreported {
		u.report()
	}
	c.unreported, c.ran = nil, nil
}

// refuseWrites turns a write the API server will never store (refusedAsTooLarge:
// the object would be over what etcd keeps) into permanent failures of the change
// handlers whose results or ctx.patch went into it, as a PermanentError would:
// never retried, the failure in their progress records, written in a patch of its
// own without what they wrote; no success of theirs is reported. Running them again
// would only be refused again, for ever. A parent that finished in the refused
// write is recorded unfinished, so that the next cycle folds its children's
// outcomes again; a cause that ended in it ends in the next cycle (the event of
// this write). What daemons, event handlers and timers wrote in it is dropped.
// Any other error, or a refusal with no handler's content in it (the write is
// retried without what daemons and event handlers wrote: keepTheirs), is returned.
func (c *cycle) refuseWrites(ctx context.Context, err error) error {
	var refusal *tooLargeError
	if !errors.As(err, &refusal) || c.refused {
		return err // a refusal of the failure records too: the object is full already
	}
	culprits := 0
	for _, r := range c.ran {
		if c.inRefusedWrite(r, refusal) {
			culprits++
		}
	}
	if culprits == 0 {
		return err
	}
	c.refused = true
	c.patch = state.NewPatch()
	if c.carried {
		c.log.Error("the server refused the object's patch as too large; what daemons and event handlers wrote in it is dropped", "error", refusal.cause)
	}
	var failedIDs, failedRuns []string
	for i, r := range c.ran {
		rec := r.record
		switch {
		case c.inRefusedWrite(r, refusal):
			msg := fmt.Sprintf("the API server refused to store the object with what handler %s wrote (its result or ctx.patch): %s; "+
				"keep big data out of the object (in a ConfigMap or Secret of its own)", r.spec.ID, refusal.reason())
			now := c.now
			rec.Success, rec.Failure, rec.Stopped, rec.Delayed, rec.Message = false, true, &now, nil, truncate(msg, 1000)
			failedIDs, failedRuns = append(failedIDs, r.spec.ID), append(failedRuns, r.spec.ID+"/"+string(r.reason))
			c.log.Error("handler failed for good", "handler", r.spec.ID, "reason", string(r.reason), "error", msg)
			c.post("Warning", "HandlerFailed", fmt.Sprintf("Handler %s failed permanently: %s", r.spec.ID, msg))
			c.op.observeAs(c.key, r.spec.ID, c.topID(r.spec.ID), string(r.reason), OutcomeFailure, 0, errors.New(msg))
		case len(rec.Subrefs) > 0 && rec.Finished():
			// Its outcome came from children this refusal may have failed.
			rec.Success, rec.Failure, rec.Stopped, rec.Message = false, false, nil, ""
			failedIDs, failedRuns = append(failedIDs, r.spec.ID), append(failedRuns, r.spec.ID+"/"+string(r.reason))
		}
		c.ran[i].record = rec
		c.store.progress.Store(c.body.Object, c.patch, r.spec.ID, rec)
	}
	c.unreported = slices.DeleteFunc(c.unreported, func(u unreportedSuccess) bool { return slices.Contains(failedIDs, u.id) })
	c.succeeded = slices.DeleteFunc(c.succeeded, func(s string) bool { return slices.Contains(failedRuns, s) })
	return c.apply(ctx)
}

// tooLargeError is a write the API server refused because the object would be larger
// than it stores (refusedAsTooLarge).
type tooLargeError struct {
	key   objectKey
	cause error
	// subresource is the write refused: "" the object's, "status" its /status.
	subresource string
}

// inRefusedWrite tells whether what a handler wrote went into the refused write:
// with a status subresource the cycle's patch goes in two writes, and the one sent
// first may have been stored (its handlers' results are on the object).
func (c *cycle) inRefusedWrite(r ranHandler, refusal *tooLargeError) bool {
	if !r.wrote {
		return false
	}
	if !c.info.statusSubresource {
		return true
	}
	if refusal.subresource == "status" {
		return r.wroteStatus
	}
	return r.wroteMain
}

func (e *tooLargeError) Error() string {
	return fmt.Sprintf("the API server refused to store %s: %s", e.key, e.reason())
}

func (e *tooLargeError) Unwrap() error { return e.cause }

// reason is the server's own words.
func (e *tooLargeError) reason() string {
	if r := apierrors.ReasonForError(e.cause); r != metav1.StatusReasonUnknown && r != metav1.StatusReasonInternalError {
		return fmt.Sprintf("%s (%s)", e.cause, r)
	}
	return e.cause.Error()
}

// refusedAsTooLarge tells whether the API server will never store a write: the
// object (or the request) is larger than it keeps. It answers 413
// RequestEntityTooLarge for a request over its own limit, and passes on etcd's
// refusal of a value over etcd's limit (`etcdserver: request is too large`, 1.5 MiB
// by default) as a 500 with that message. The one place that says so: such a write
// was not applied (writeOutcomeUnknown) and is not retried (refuseWrites).
func refusedAsTooLarge(err error) bool {
	if err == nil {
		return false
	}
	if apierrors.IsRequestEntityTooLargeError(err) {
		return true
	}
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "request is too large") || strings.Contains(msg, "request entity too large")
}

// patchFinalizers adds or removes this operator's finalizer and nothing else: a JSON
// patch that tests the resourceVersion it was computed from, so a finalizer another
// controller added or removed meanwhile is never lost (kopf 1.44). On a conflict the
// object is read again and the patch recomputed, a few times.
func (c *cycle) patchFinalizers(ctx context.Context, present bool) error {
	o := c.op
	finalizer := o.opts.finalizer()
	client := o.dynamic.Resource(c.info.gvr).Namespace(c.key.namespace)
	current := c.body
	if c.last != nil {
		current = c.last
	}
	for attempt := 0; ; attempt++ {
		if hasFinalizer(current.Object, finalizer) == present {
			return nil
		}
		ops := []map[string]any{
			{"op": "test", "path": "/metadata/resourceVersion", "value": current.GetResourceVersion()},
			{"op": "add", "path": "/metadata/finalizers", "value": finalizersWith(current.Object, finalizer, present)},
		}
		data, err := json.Marshal(ops)
		if err != nil {
			return fmt.Errorf("encoding the finalizer patch of %s: %w", c.key, err)
		}
		if o.opts.DryRun {
			c.log.Info("dry run: not sent", "finalizers", string(data))
			return nil
		}
		if err := notSent(ctx, c.key); err != nil {
			return err
		}
		resp, err := client.Patch(ctx, c.key.name, types.JSONPatchType, data, metav1.PatchOptions{})
		if err != nil && writeOutcomeUnknown(err) {
			// Applied or not: the next cycle reads the object first (a removal
			// applied may have deleted it: its delete handlers must not run again).
			c.mem.writeUnknown = true
			c.mem.writeUnknownUntil = o.clock.Now().Add(o.opts.ConsistencyTimeout)
		}
		if obs := o.opts.Observer; obs != nil {
			obs.PatchSent(ControllerName(c.key.resource), "", patchResult(err))
		}
		switch {
		case err == nil:
			c.last = resp
			c.expectVersion(resp)
			if !present && deletionInProgress(current.Object) {
				c.mem.released = true
			}
			c.log.Debug("finalizer changed", "present", present, "resourceVersion", resp.GetResourceVersion())
			return nil
		case apierrors.IsNotFound(err):
			return nil
		case (apierrors.IsConflict(err) || apierrors.IsInvalid(err)) && attempt < 4:
			// Someone else wrote the object since: read it again.
			fresh, gerr := client.Get(ctx, c.key.name, metav1.GetOptions{})
			if apierrors.IsNotFound(gerr) {
				return nil
			}
			if gerr != nil {
				return fmt.Errorf("reading %s again after a conflict on its finalizers: %w", c.key, gerr)
			}
			if string(fresh.GetUID()) != c.mem.uid {
				return nil // re-created meanwhile: the new one gets its own cycle
			}
			current = fresh
		default:
			return fmt.Errorf("changing the finalizer of %s (%s): %w", c.key, apierrors.ReasonForError(err), err)
		}
	}
}

// notSent is the error of a write not sent because the cycle's context ended (a
// stop past its grace, or at once: StopAtOnce): known not applied, unlike a
// request cancelled in flight, so nothing has to be read back.
func notSent(ctx context.Context, key objectKey) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("the write of %s was not sent: the operator is stopping (%w)", key, err)
	}
	return nil
}

// send marshals and sends one patch. A vanished object is not an error (nil, nil).
func (c *cycle) send(ctx context.Context, subresource string, do func([]byte) (*unstructured.Unstructured, error), patch any) (*unstructured.Unstructured, error) {
	data, err := json.Marshal(patch)
	if err != nil {
		return nil, fmt.Errorf("encoding the patch of %s: %w", c.key, err)
	}
	if c.op.opts.DryRun {
		c.log.Info("dry run: not sent", "subresource", subresource, "patch", string(data))
		return nil, nil
	}
	if err := notSent(ctx, c.key); err != nil {
		return nil, err
	}
	resp, err := do(data)
	if refusedAsTooLarge(err) {
		err = &tooLargeError{key: c.key, cause: err, subresource: subresource}
	}
	if err != nil && writeOutcomeUnknown(err) {
		c.mem.writeUnknown = true
		c.mem.writeUnknownUntil = c.op.clock.Now().Add(c.op.opts.ConsistencyTimeout)
	}
	if resp != nil {
		caching.StripManagedFields(resp) // it may stand for the watch's body (objects.go)
	}
	if obs := c.op.opts.Observer; obs != nil {
		obs.PatchSent(ControllerName(c.key.resource), subresource, patchResult(err))
	}
	switch {
	case err == nil:
		return resp, nil
	case apierrors.IsNotFound(err):
		c.log.Debug("object vanished before the patch; nothing to do")
		return nil, nil
	case (apierrors.IsConflict(err) || apierrors.IsInvalid(err)) && c.replaced():
		c.log.Debug("object was re-created under its name before the patch; the new one gets its own cycle")
		return nil, nil
	case errors.As(err, new(*tooLargeError)):
		return nil, err
	case apierrors.IsInvalid(err), apierrors.IsConflict(err):
		return nil, fmt.Errorf("the server rejected the patch of %s (%s): %w; the patch was %s", c.key, apierrors.ReasonForError(err), err, truncate(string(data), 500))
	default:
		return nil, fmt.Errorf("patching %s: %w", c.key, err)
	}
}

// writeOutcomeUnknown tells whether a failed write may have been applied anyway: no
// answer came from the API server (the connection broke, the client gave up), or it
// answered that it could not tell (a timeout, an internal error, unavailable: a proxy
// in between may say so after the server applied it). A refused connection and the
// server's other answers (a conflict, a rejection) say it was not applied.
func writeOutcomeUnknown(err error) bool {
	if errors.Is(err, syscall.ECONNREFUSED) || refusedAsTooLarge(err) {
		return false
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return true
	}
	return apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) || apierrors.IsInternalError(err) ||
		apierrors.IsUnexpectedServerError(err) || apierrors.IsServiceUnavailable(err)
}

// readAfterUnknownWrite reads the object from the server after a write whose outcome
// is unknown (objectMemory.writeUnknown), or when the watch's body is older than a
// consistent read showed at start (objectMemory.staleBody). Handling the cached body
// instead would run again a handler whose success that write (or the operator before
// this one) stored (kopf does: a known limit there). A newer version read is expected
// from the watch as the answer of a write would be, and handled past the consistency
// timeout. While the server shows nothing newer and may still apply the write
// (writeUnknownUntil), the object waits (the returned delay) and is read again. An
// incarnation the server no longer has (gone, or another object under its name)
// stops the cycle (stop): nothing runs on what the operator holds of it, and what the
// watch brings next (the deletion, the namesake) is handled as it comes.
func (c *cycle) readAfterUnknownWrite(ctx context.Context) (wait time.Duration, stop bool, err error) {
	got, err := c.op.dynamic.Resource(c.info.gvr).Namespace(c.key.namespace).Get(ctx, c.key.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) || err == nil && string(got.GetUID()) != c.mem.uid:
		c.log.Debug("the object the operator holds is gone from the server; waiting for the watch to say so",
			"afterUnknownWrite", c.mem.writeUnknown, "staleBody", c.mem.staleBody)
		c.mem.writeUnknown, c.mem.staleBody = false, false
		return 0, true, nil
	case err != nil:
		if c.mem.staleBody {
			return 0, false, fmt.Errorf("reading %s, whose watched body is older than the server's state at start: %w", c.key, err)
		}
		return 0, false, fmt.Errorf("reading %s after a write that got no answer (it may have been applied): %w", c.key, err)
	case versionNewer(got.GetResourceVersion(), c.body.GetResourceVersion()):
		if c.mem.staleBody {
			c.log.Info("the watch's body is older than the server's state at start (a lagging list or watch); the object read from the server is waited for",
				"resourceVersion", got.GetResourceVersion(), "watched", c.body.GetResourceVersion())
		} else {
			c.log.Info("the last write got no answer; the object read from the server is newer than the watch's, and is waited for",
				"resourceVersion", got.GetResourceVersion(), "watched", c.body.GetResourceVersion())
		}
		if !c.expectVersion(got) {
			// The watch delivered it (or newer) while the object was read: this
			// cycle's body is the old one, and the notification queued the object
			// again for a cycle on the new. (Whatever version an earlier write made
			// the cycle wait for is older: the watch is past it too.)
			c.mem.writeUnknown, c.mem.staleBody = false, false
			return 0, true, nil
		}
	default:
		if now := c.op.clock.Now(); c.mem.writeUnknown && now.Before(c.mem.writeUnknownUntil) {
			return min(c.mem.writeUnknownUntil.Sub(now), time.Second), false, nil
		}
	}
	c.mem.writeUnknown, c.mem.staleBody = false, false
	return 0, false, nil
}

// checkPruning reports, once per field, a status field that the server dropped: the
// CRD's schema does not declare it, so it is pruned. Retrying would loop forever
// (kopf's "patching failed with inconsistencies"); the fix is in the schema.
func (c *cycle) checkPruning(sent map[string]any, resp *unstructured.Unstructured) {
	status, _ := sent["status"].(map[string]any)
	got, _, _ := unstructured.NestedMap(resp.Object, "status")
	for field, v := range status {
		if v == nil {
			continue
		}
		if _, ok := got[field]; ok {
			continue
		}
		key := c.key.resource.String() + " status." + field
		if _, seen := c.op.pruned.LoadOrStore(key, struct{}{}); seen {
			continue
		}
		msg := handling.StatusPrunedMessage(field, c.info.kind)
		c.log.Error(msg)
		c.post("Warning", "StatusPruned", msg)
	}
}

// patchStatus sends the status part of the cycle's patch as a JSON patch computed
// against the object as last seen (statusOps). When the object changed meanwhile so
// that a test fails, it is read again and the patch recomputed, a few times.
func (c *cycle) patchStatus(ctx context.Context, status map[string]any) (*unstructured.Unstructured, error) {
	client := c.op.dynamic.Resource(c.info.gvr).Namespace(c.key.namespace)
	seen := c.body
	if c.last != nil {
		seen = c.last // this cycle already patched: its answer is newer
	}
	for attempt := 0; ; attempt++ {
		ops := statusOps(seen.Object, status, c.mem.uid)
		resp, err := c.send(ctx, "status", func(data []byte) (*unstructured.Unstructured, error) {
			return client.Patch(ctx, c.key.name, types.JSONPatchType, data, metav1.PatchOptions{}, "status")
		}, ops)
		if err == nil || attempt >= 3 || !apierrors.IsInvalid(err) {
			return resp, err
		}
		fresh, gerr := client.Get(ctx, c.key.name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(gerr):
			return nil, nil
		case gerr != nil:
			return nil, err
		case string(fresh.GetUID()) != c.mem.uid:
			return nil, nil // re-created meanwhile: the new one gets its own cycle
		}
		seen = fresh
	}
}

// statusOps turns a merge patch of status into JSON patch operations that do the same
// on the object as the operator last saw it, after a test of the object's uid. Maps
// the object already has are descended into (a merge, not a replacement); a null
// removes a field the object has and is skipped otherwise.
func statusOps(body, patch map[string]any, uid string) []map[string]any {
	ops := []map[string]any{}
	if uid != "" {
		ops = append(ops, map[string]any{"op": "test", "path": "/metadata/uid", "value": uid})
	}
	for _, op := range state.MergePatchOps(body, patch) {
		switch {
		case op.Remove:
			ops = append(ops, map[string]any{"op": "remove", "path": op.Path})
		case !op.Existed:
			// Absent as far as the operator knows: the test keeps a member that
			// someone else added meanwhile from being replaced wholesale.
			ops = append(ops, map[string]any{"op": "test", "path": op.Path, "value": nil},
				map[string]any{"op": "add", "path": op.Path, "value": op.Value})
		default:
			// Sent even when unchanged: the object seen may be stale, and the
			// write must leave the server's copy holding this value.
			ops = append(ops, map[string]any{"op": "add", "path": op.Path, "value": op.Value})
		}
	}
	return ops
}

// withUID adds metadata.uid to a non-empty patch (a copy; the cycle's map is kept).
func withUID(patch map[string]any, uid string) map[string]any {
	if len(patch) == 0 || uid == "" {
		return patch
	}
	out := make(map[string]any, len(patch)+1)
	for k, v := range patch {
		out[k] = v
	}
	meta, _ := patch["metadata"].(map[string]any)
	m := make(map[string]any, len(meta)+1)
	for k, v := range meta {
		m[k] = v
	}
	m["uid"] = uid
	out["metadata"] = m
	return out
}

// replaced tells whether the cycle's incarnation is over (deleted, or another
// object under the same name now).
func (c *cycle) replaced() bool {
	c.st.inbox.mu.Lock()
	defer c.st.inbox.mu.Unlock()
	return c.st.inbox.gone || c.st.inbox.uid != c.mem.uid
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// expectVersion records the version our patch produced, unless the watch already
// delivered it (notifications can be faster than the patch's response): false then.
// The response itself is kept as the newest body known, for when the watch stays late.
func (c *cycle) expectVersion(resp *unstructured.Unstructured) bool {
	caching.StripManagedFields(resp) // it may stand for the watch's body (every write's answer comes here)
	rv := resp.GetResourceVersion()
	c.st.inbox.mu.Lock()
	seen := c.st.inbox.lastSeenVersion
	c.st.inbox.mu.Unlock()
	if rv == "" || !versionOlder(seen, rv) {
		return false
	}
	c.mem.expectedVersion, c.mem.expectedBody, c.mem.lateWatchWarned = rv, resp, false
	c.mem.consistencyDeadline = c.op.clock.Now().Add(c.op.opts.ConsistencyTimeout)
	return true
}

func patchResult(err error) string {
	switch {
	case err == nil:
		return "ok"
	case apierrors.IsNotFound(err):
		return "not_found"
	case apierrors.IsConflict(err):
		return "conflict"
	case apierrors.IsInvalid(err):
		return "invalid"
	}
	return "error"
}
