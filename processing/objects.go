package processing

import (
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// objectKey identifies one object of one watched resource. The resource is the
// canonical GroupVersionResource the server serves, never the spelling a script
// used: "v1/cm" and "v1/configmaps" name one object, one key, one worker.
type objectKey struct {
	resource  causes.Resource
	namespace string
	name      string
}

func (k objectKey) String() string {
	if k.namespace == "" {
		return k.resource.String() + " " + k.name
	}
	return k.resource.String() + " " + k.namespace + "/" + k.name
}

// rawEvent is one watch notification kept for the raw event handlers (on.event).
type rawEvent struct {
	eventType string // ADDED, MODIFIED, DELETED
	object    *unstructured.Unstructured
}

// objectState is everything the operator keeps about one object between cycles,
// in two halves with two owners:
//   - inbox is written by the informer side (watch notifications) and by daemons,
//     and read by the object's worker;
//   - mem belongs to the worker that holds the object's key: the work queue hands a
//     key to one worker at a time, so mem needs no lock at all.
type objectState struct {
	inbox objectInbox
	mem   objectMemory
}

// objectInbox is what arrives for an object between two cycles.
type objectInbox struct {
	// latest is the newest body the watch delivered (nil once it was DELETED). It is
	// published atomically, so daemons and the worker read it without a lock.
	latest atomic.Pointer[unstructured.Unstructured]

	// mu guards the fields below. It is a leaf lock: held only to copy or swap
	// them, never while calling out of this package or waiting.
	mu sync.Mutex
	// pending are the notifications for raw event handlers, in arrival order; kept
	// only while the resource has event handlers.
	pending []rawEvent
	// uid is the incarnation of the newest notification; gone, whether that was a
	// DELETED event.
	uid  string
	gone bool
	// listedUID is the incarnation the initial listing found (resume causes are
	// only for objects that existed before the operator started).
	listedUID       string
	lastSeenVersion string
	// daemonPatch is what daemons of incarnation daemonPatchUID wrote, for the next
	// cycle to apply in order with the change handlers' patches.
	daemonPatch    map[string]any
	daemonPatchUID string
}

// inboxSnapshot is what a cycle takes from the inbox at its start.
type inboxSnapshot struct {
	events          []rawEvent
	uid             string
	gone            bool
	listed          bool
	lastSeenVersion string
}

func (in *objectInbox) take() inboxSnapshot {
	in.mu.Lock()
	defer in.mu.Unlock()
	s := inboxSnapshot{events: in.pending, uid: in.uid, gone: in.gone, listed: in.uid != "" && in.uid == in.listedUID,
		lastSeenVersion: in.lastSeenVersion}
	in.pending = nil
	return s
}

// goneIncarnation tells whether the newest notification was a DELETED event, and of
// which incarnation.
func (in *objectInbox) goneIncarnation() (gone bool, uid string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.gone, in.uid
}

// takeDaemonPatch hands over what the daemons of incarnation uid wrote; patches of
// an older incarnation (a daemon that wrote while its object was re-created) are
// dropped: they are about an object that no longer exists.
func (in *objectInbox) takeDaemonPatch(uid string) map[string]any {
	in.mu.Lock()
	defer in.mu.Unlock()
	p, owner := in.daemonPatch, in.daemonPatchUID
	in.daemonPatch, in.daemonPatchUID = nil, ""
	if owner != uid {
		return nil
	}
	return p
}

// hasDaemonPatch tells whether daemons of incarnation uid handed over a patch.
func (in *objectInbox) hasDaemonPatch(uid string) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.daemonPatch != nil && in.daemonPatchUID == uid
}

// restoreDaemonPatch hands back a daemon patch that could not be written, under
// what daemons wrote since (newer writes win).
func (in *objectInbox) restoreDaemonPatch(uid string, p map[string]any) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.daemonPatchUID != "" && in.daemonPatchUID != uid {
		return
	}
	merged := state.NewPatch()
	merged.Merge(p)
	if in.daemonPatch != nil {
		merged.Merge(in.daemonPatch)
	}
	in.daemonPatch, in.daemonPatchUID = merged.Map(), uid
}

// latestOf returns the newest body of incarnation uid, or nil when that incarnation
// is gone (deleted, or replaced by a new object under the same name).
func (in *objectInbox) latestOf(uid string) *unstructured.Unstructured {
	b := in.latest.Load()
	if b == nil || string(b.GetUID()) != uid {
		return nil
	}
	return b
}

// objectMemory is the worker-owned half (kopf's "memories"): only in memory,
// rebuilt from the objects after a restart. Every field is about incarnation uid.
type objectMemory struct {
	uid             string // "" until the first cycle of an incarnation
	resumeIsHandled bool
	// expectedVersion is what the operator's own last patch returned, until the
	// watch delivers it; consistencyDeadline bounds the wait. expectedBody is that
	// response: past the deadline it is newer than anything the watch delivered, and
	// cycles handle it instead until the watch catches up (lateWatchWarned: logged once).
	expectedVersion     string
	expectedBody        *unstructured.Unstructured
	consistencyDeadline time.Time
	lateWatchWarned     bool
	// writeUnknown: the operator's last write got no answer (the connection broke,
	// a timeout), so the server may have applied it, or still may until
	// writeUnknownUntil (a request the client gave up on runs on in the server). The
	// next cycles read the object from the server before running anything, until
	// they see the write or that time passes (readAfterUnknownWrite).
	writeUnknown      bool
	writeUnknownUntil time.Time
	// staleBody: the watch's body is older than a consistent read at start showed
	// (freshnessFloor): the next cycle reads the object from the server as after a
	// write without answer, and waits for the watch to bring that version.
	staleBody bool

	// Background engines (engines.go).
	daemons        objectDaemons
	timers         map[string]*timerState
	lastChangeAt   time.Time // the last essential change, for idle timers
	essenceHash    [32]byte
	indexedVersion string
	// pinned is the cause in progress, until it completes (process.go).
	pinned *pinnedCause
	// released: this worker removed the finalizer of this incarnation while it was
	// being deleted. The write that deletes the object answers with its previous
	// resourceVersion, so the consistency wait cannot cover it: without this, the
	// watch's event of the write before (still showing the finalizer) would make a
	// new delete cause and run the delete handlers again.
	released bool
	// succeededAt remembers, per handler and reason, the resourceVersion of the
	// write that stored its success, to name a re-run and the write it did not see.
	succeededAt map[string]string
	// eventPatch is what event handlers wrote, until a cycle applies it.
	eventPatch *state.Patch
	// retryAt is when the change handling that failed on a framework error (a
	// write the server refused) may be tried again without a new event; until
	// then the object's wake-ups run its timers only (kopf's timers are tasks of
	// their own). seenVersion is the newest resourceVersion a cycle took from the
	// inbox: a newer one is a new event.
	retryAt     time.Time
	seenVersion string
	// failedCode is, per change handler waiting after an error, the code hash it
	// failed with (Options.RetryOnReload: reloadretry.go).
	failedCode map[string]string
}

// readiness derives /readyz from the set of keys still to process, never from
// counters that a missed decrement would leave wrong forever.
type readiness struct {
	mu sync.Mutex // leaf lock
	// initial are keys found by the initial listings, not through a cycle yet.
	initial map[objectKey]struct{}
	// unindexed are keys found by the initial listings of resources with index
	// handlers, not indexed yet: change handlers wait until it is empty (kopf).
	unindexed map[objectKey]struct{}
	// parked are keys whose change handlers wait for the indexes: woken (not
	// polled) when the last listed key is indexed or a watcher finishes its listing.
	parked map[objectKey]struct{}
}

func newReadiness() *readiness {
	return &readiness{initial: map[objectKey]struct{}{}, unindexed: map[objectKey]struct{}{}, parked: map[objectKey]struct{}{}}
}

func (r *readiness) park(key objectKey) {
	r.mu.Lock()
	r.parked[key] = struct{}{}
	r.mu.Unlock()
}

// unpark returns the parked keys, for the caller to queue.
func (r *readiness) unpark() []objectKey {
	r.mu.Lock()
	defer r.mu.Unlock()
	keys := make([]objectKey, 0, len(r.parked))
	for k := range r.parked {
		keys = append(keys, k)
	}
	clear(r.parked)
	return keys
}

func (r *readiness) listed(key objectKey, indexed bool) {
	r.mu.Lock()
	r.initial[key] = struct{}{}
	if indexed {
		r.unindexed[key] = struct{}{}
	}
	r.mu.Unlock()
}

func (r *readiness) processed(key objectKey) {
	r.mu.Lock()
	delete(r.initial, key)
	r.mu.Unlock()
}

// indexed removes a key from the keys to index; true when it was the last one.
func (r *readiness) indexed(key objectKey) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, was := r.unindexed[key]
	delete(r.unindexed, key)
	return was && len(r.unindexed) == 0
}

// forget drops a gone key; true when it was the last one to index.
func (r *readiness) forget(key objectKey) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, was := r.unindexed[key]
	delete(r.initial, key)
	delete(r.unindexed, key)
	delete(r.parked, key)
	return was && len(r.unindexed) == 0
}

// pending counts the keys still to process and to index.
func (r *readiness) pending() (initial, unindexed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.initial), len(r.unindexed)
}

// objectTable maps keys to their state. Its lock is a leaf: get-or-create and
// delete only.
type objectTable struct {
	mu      sync.RWMutex
	objects map[objectKey]*objectState
}

func (t *objectTable) get(key objectKey) *objectState {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.objects[key]
}

// record stores one notification in the object's inbox, creating the object's state
// on its first notification (created: the object was new to the table). The table's
// lock is held across the inbox update, so a worker dropping a gone object
// (dropIfGone) never drops a notification that arrived meanwhile.
func (t *objectTable) record(key objectKey, eventType string, obj *unstructured.Unstructured, initial, keepEvents bool) (created bool) {
	t.mu.RLock()
	st := t.objects[key]
	if st != nil {
		st.inbox.put(eventType, obj, initial, keepEvents)
		t.mu.RUnlock()
		return false
	}
	t.mu.RUnlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	if st = t.objects[key]; st == nil {
		st = &objectState{}
		t.objects[key] = st
		created = true
	}
	st.inbox.put(eventType, obj, initial, keepEvents)
	return created
}

func (in *objectInbox) put(eventType string, obj *unstructured.Unstructured, initial, keepEvents bool) {
	uid := string(obj.GetUID())
	in.mu.Lock()
	defer in.mu.Unlock()
	if keepEvents {
		in.pending = append(in.pending, rawEvent{eventType: eventType, object: obj})
	}
	in.uid = uid
	if initial {
		in.listedUID = uid
	}
	in.lastSeenVersion = obj.GetResourceVersion()
	if eventType == "DELETED" {
		in.gone = true
		in.latest.Store(nil)
	} else {
		in.gone = false
		in.latest.Store(obj)
	}
}

// dropIfGone removes a gone object's state, unless a notification arrived since.
func (t *objectTable) dropIfGone(key objectKey, st *objectState) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	st.inbox.mu.Lock()
	defer st.inbox.mu.Unlock()
	if t.objects[key] != st || !st.inbox.gone || len(st.inbox.pending) > 0 {
		return false
	}
	delete(t.objects, key)
	return true
}

func (t *objectTable) keys() []objectKey {
	t.mu.RLock()
	defer t.mu.RUnlock()
	keys := make([]objectKey, 0, len(t.objects))
	for k := range t.objects {
		keys = append(keys, k)
	}
	return keys
}
