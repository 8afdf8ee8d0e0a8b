package processing

import (
	"context"
	"fmt"
	"log/slog"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/luaop/luaop/caching"
	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// Departures. A watch that selects (by label, name or namespace: selection.go) is
// told about an object that stops matching its selectors as the API server tells it:
// a DELETED event (with the object as it was before the change). It is not a
// deletion, and the core must not take it for one: no "gone", no DELETED for the
// raw event handlers, no lost progress. As in kopf, where filters are matched after
// the watch, and in controller-runtime, where the object simply leaves the cache:
//   - the object is forgotten in memory as when no handler matches it any more:
//     its daemons stop and its timers end, its index entries go, and its memo with
//     them (the operator cannot see its deletion while it is out of the selection,
//     so a memo kept would never be forgotten);
//   - nothing is written on it but the finalizer, removed when no handler requires
//     it now (kopf removes it when the filters stop matching; left there, it would
//     block the object's deletion forever, since no handler of this operator sees
//     the object any more). Its progress and diff-base stay on it: when it matches
//     again it comes back as ADDED, a change from what was handled last (or a
//     creation for the handlers that never saw it, as kopf's prematch has it).
//
// Which one a DELETED of a selected watch is, the worker learns by reading the
// object from the server (one read per deletion of such a resource): gone, or
// another incarnation under its name, is a deletion; the same incarnation still
// there is a departure.

// departure is an object that left the watch's selection: it exists, as read.
type departure struct {
	uid  string
	body *unstructured.Unstructured
}

// departureOf tells whether the DELETED event pending for key is a departure. It
// reads the object only when the watch of its resource is narrowed.
func (o *Reactor) departureOf(ctx context.Context, key objectKey, st *objectState) (*departure, error) {
	w := o.watcherOf(key.resource)
	if w == nil || !w.narrowed() {
		return nil, nil
	}
	gone, uid := st.inbox.goneIncarnation()
	if !gone || uid == "" {
		return nil, nil
	}
	got, err := o.dynamic.Resource(w.info.gvr).Namespace(key.namespace).Get(ctx, key.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading %s, which the watch no longer holds (deleted, or no longer selected): %w", key, err)
	case string(got.GetUID()) != uid:
		return nil, nil // deleted, and another object under its name since
	}
	caching.StripManagedFields(got)
	return &departure{uid: uid, body: got}, nil
}

// withoutDeparture drops the departure's DELETED event from the raw events: nothing
// was deleted.
func withoutDeparture(events []rawEvent, uid string) []rawEvent {
	if n := len(events); n > 0 && events[n-1].eventType == "DELETED" && string(events[n-1].object.GetUID()) == uid {
		return events[:n-1]
	}
	return events
}

// leaveSelection handles a departure: the finalizer goes when no handler requires
// it now, then the object is forgotten in memory. A failure to write the finalizer
// is the cycle's error (retried after the object's backoff).
func (o *Reactor) leaveSelection(ctx context.Context, log *slog.Logger, key objectKey, st *objectState, dep *departure, specs []causes.Spec) error {
	if err := o.releaseDeparted(ctx, log, key, st, dep, specs); err != nil {
		return err
	}
	mem := &st.mem
	if mem.uid != "" {
		o.forgetIncarnation(key, mem)
		o.board.forget(key)
		*mem = objectMemory{}
	}
	log.Log(ctx, o.opts.SuccessLogLevel, "left the watch's selection (no handler's filter selects it now); forgotten in memory until it is selected again, its progress stays on it",
		"reason", "departed")
	if o.objects.dropIfGone(key, st) && o.ready.forget(key) {
		o.wakeIndexWaiters()
	}
	return nil
}

// releaseDeparted removes this operator's finalizer from a departed object unless a
// handler requires it for the object as it is now, as a cycle would.
func (o *Reactor) releaseDeparted(ctx context.Context, log *slog.Logger, key objectKey, st *objectState, dep *departure, specs []causes.Spec) error {
	finalizer := o.opts.finalizer()
	info := o.resourceInfo(key.resource)
	if info == nil || !hasFinalizer(dep.body.Object, finalizer) {
		return nil
	}
	c := &cycle{op: o, key: key, info: info, store: info.storage(), body: dep.body, specs: specs, log: log, now: o.clock.Now(),
		patch: state.NewPatch(), st: st, mem: &objectMemory{uid: dep.uid}}
	detected := detectChangeCause(dep.body.Object, key.resource, o.opts.Prefix, o.opts.StatusField, finalizer, c.store.diffBase, objectFacts{}, c.handlerFields())
	needed, err := c.finalizerNeeded(ctx, detected.Cause)
	if err != nil || needed {
		return err
	}
	log.Info("removing the finalizer of an object that left the watch's selection: no handler requires it now")
	return c.patchFinalizers(ctx, false)
}
