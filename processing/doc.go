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
// is a subresource).
//
// Progress of every handler is persisted on the object (state.ProgressStorage), so a
// restarted operator resumes where it stopped. After its own patch a worker does not
// run change handlers on a body older than what that patch returned: it waits for the
// watch to deliver that version, or for Options.ConsistencyTimeout, and is woken as
// soon as a newer event arrives (kopf's "consistency after its own patch").
//
// Delays that handlers ask for (TemporaryError, backoff) are kept in the work queue:
// no dummy "touch" patches load the API server, unlike kopf.
//
// The package never imports the Lua binding: it declares the Handlers interface it
// needs, and luabind.Runtime satisfies it.
package processing
