package processing

import (
	"strings"
	"time"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// Retry on reload (Options.RetryOnReload, `luaop dev`'s default): a handler waiting
// in its backoff after an error is retried at once when a reload changed its code
// (Spec.CodeHash: what its function can reach), instead of after the backoff; the
// fix a developer saved is what it was waiting for. A production reload keeps the
// backoffs (it must not retry every failing handler of every object at once).
//
// Who owns what: the code hash each failure happened with is in the object's
// memory (objectMemory.failedCode, worker-owned: set when a change handler's
// attempt ends in a retry, cleared when it ends otherwise); a timer's in its
// timerState. Refresh only wakes the objects the status board shows waiting on a
// handler whose code changed (their cycle then decides, from the memory); timers
// follow a reload anyway (a timer's change gives every object a cycle). After a
// restart the memory is empty: handlers wait out their backoff, as before.

// noteRetry remembers the code a change handler failed with when its attempt ends
// in a retry, and forgets it otherwise.
func (c *cycle) noteRetry(id string, outcome Outcome) {
	if !c.op.opts.RetryOnReload {
		return
	}
	if outcome != OutcomeRetry {
		delete(c.mem.failedCode, id)
		return
	}
	if c.mem.failedCode == nil {
		c.mem.failedCode = map[string]string{}
	}
	c.mem.failedCode[id] = c.codeOf(c.topID(id))
}

// codeOf is the code hash of the top-level handler top of this cycle (a
// subhandler's function is made by its top-level handler's code).
func (c *cycle) codeOf(top string) string {
	for i := range c.specs {
		if c.specs[i].ID == top {
			return c.specs[i].CodeHash
		}
	}
	return ""
}

// wakeForReload wakes the record of handler id (of the top-level handler top)
// waiting in its backoff when its code changed since the failure it waits after.
// A parent waiting for its subhandlers is woken when one of them is to be: it
// runs, registers them again, and they are woken in turn.
func (c *cycle) wakeForReload(id, top string, rec state.HandlerRecord) state.HandlerRecord {
	if len(c.mem.failedCode) == 0 || !rec.Sleeping(c.now) {
		return rec
	}
	code := c.codeOf(top)
	failed, ok := c.mem.failedCode[id]
	switch {
	case ok && failed != code:
		delete(c.mem.failedCode, id)
	case ok || !c.subhandlerFailedWithOtherCode(id, code):
		return rec
	}
	c.log.Info("retrying at once: the handler's code changed since it failed", "handler", id,
		"retry", rec.Retries, "was_due", rec.Delayed.Format(time.RFC3339))
	rec.Delayed = nil
	return rec
}

// subhandlerFailedWithOtherCode tells whether a subhandler of parent (at any
// depth) waits after a failure with code other than code.
func (c *cycle) subhandlerFailedWithOtherCode(parent, code string) bool {
	for id, failed := range c.mem.failedCode {
		if failed != code && strings.HasPrefix(id, parent+"/") {
			return true
		}
	}
	return false
}

// wakeTimerForReload makes a timer waiting in its backoff due now when its code
// changed since the failure.
func (c *cycle) wakeTimerForReload(spec causes.Spec, ts *timerState, now time.Time) {
	if !c.op.opts.RetryOnReload || ts.retries == 0 || ts.failedCode == spec.CodeHash || !now.Before(ts.next) {
		return
	}
	c.log.Info("retrying at once: the timer's code changed since it failed", "handler", spec.ID, "retry", ts.retries)
	ts.next = now
}

// retryChangedCode gives a cycle to the objects waiting on a change handler whose
// code changed since the last Refresh (RetryOnReload). enginesMu held (a leaf: the
// board's lock and the queue's are taken under it, nothing calls out).
func (o *Reactor) retryChangedCode(specs []causes.Spec) {
	codes := make(map[string]string, len(specs))
	changed := map[string]bool{}
	for _, s := range specs {
		if s.Kind != causes.KindChange {
			continue
		}
		codes[s.ID] = s.CodeHash
		if prev, ok := o.changeCodes[s.ID]; ok && prev != s.CodeHash {
			changed[s.ID] = true
		}
	}
	o.changeCodes = codes
	if len(changed) == 0 {
		return
	}
	for _, key := range o.board.waitingOn(changed) {
		o.queue.Add(key)
	}
}

// waitingOn lists the objects with a handler among ids (a subhandler of one of
// them too) waiting for its delay.
func (b *statusBoard) waitingOn(ids map[string]bool) []objectKey {
	b.mu.Lock()
	defer b.mu.Unlock()
	var keys []objectKey
	for key, e := range b.objects {
		for _, h := range e.handlers {
			if h.State == "waiting" && ids[h.ID] {
				keys = append(keys, key)
				break
			}
		}
	}
	return keys
}
