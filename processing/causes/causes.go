package causes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/luaop/luaop/state"
)

// Reason is the high-level cause of a processing cycle, as kopf names them.
type Reason string

const (
	Create Reason = "create"
	Update Reason = "update"
	Delete Reason = "delete"
	Resume Reason = "resume"
	// Related: objects related to the object (owned, labelled or mapped to it,
	// Spec.Related) were created, changed or deleted; Cause.Related says which.
	Related Reason = "related"
	// Informational reasons: no change handler runs for them.
	Gone Reason = "gone" // the object disappeared from the API (DELETED event)
	Free Reason = "free" // deletion in progress and our finalizer is already gone
	Noop Reason = "noop" // nothing changed since the last handled state
)

// Kind tells which engine drives a handler.
type Kind string

const (
	KindChange Kind = "change" // on.create/update/delete/resume/field
	KindEvent  Kind = "event"  // on.event: every raw watch event, never retried
	KindDaemon Kind = "daemon"
	KindTimer  Kind = "timer"
	KindIndex  Kind = "index"
	// Admission handlers (luaop.on.validate, luaop.on.mutate) answer the API
	// server's admission reviews: they are served by the admission package, never
	// by the processing core (no watch, no progress).
	KindValidate Kind = "validate"
	KindMutate   Kind = "mutate"

	// Operator-level hooks: not tied to a resource, run by the operator itself.
	KindStartup Kind = "startup" // on.startup: before any watch starts
	KindCleanup Kind = "cleanup" // on.cleanup: when the operator stops
	KindProbe   Kind = "probe"   // on.probe: answers /healthz
)

// IsAdmission tells whether a kind is an admission handler's.
func (k Kind) IsAdmission() bool { return k == KindValidate || k == KindMutate }

// IsHook reports whether handlers of kind k are operator-level hooks.
func (k Kind) IsHook() bool { return k == KindStartup || k == KindCleanup || k == KindProbe }

// ErrorMode says what an arbitrary (non-Temporary, non-Permanent) error means.
type ErrorMode string

const (
	ErrorsTemporary ErrorMode = "temporary" // retry after the backoff (default)
	ErrorsPermanent ErrorMode = "permanent" // fail the handler for good
	ErrorsIgnored   ErrorMode = "ignored"   // count the handler as succeeded
)

// Resource names one watched API resource.
type Resource struct {
	schema.GroupVersionResource
}

func (r Resource) String() string {
	if r.Group == "" {
		return r.Version + "/" + r.Resource
	}
	return r.Group + "/" + r.Version + "/" + r.Resource
}

// Spec describes one registered handler: everything processing needs to decide when
// to run it and how to treat its outcome. Filters that need Lua (when=function,
// label/annotation callbacks) are evaluated by the binding; the rest is data here.
type Spec struct {
	ID       string
	Kind     Kind
	Resource Resource
	// Reasons lists the change reasons this handler serves (change handlers only).
	Reasons []Reason
	// Field, when set, restricts a change handler to changes of this path; it then
	// receives old/new/diff of that field only. FieldValue, when non-nil, requires the
	// field's new value to equal it.
	Field []string
	// NamedField is the field the handler's field option (or on.field's path) names,
	// for every kind: for a change handler it is Field; for a daemon, a timer, an
	// event handler or an index it is a filter (evaluated by the binding). kopf adds
	// the fields every handler names to the essence: a change of one resets the
	// object's idle timers.
	NamedField []string
	// Retries is the maximum number of attempts; 0 means unlimited.
	Retries int
	// Backoff is the delay after an arbitrary error. Defaults to 60s (kopf).
	Backoff time.Duration
	// Timeout bounds the total time since the first attempt; 0 means none.
	Timeout time.Duration
	Errors  ErrorMode
	// Optional delete handlers do not require a finalizer.
	Optional bool
	// Deleted resume handlers also run on objects being deleted.
	Deleted bool
	// Timer and daemon settings.
	Interval     time.Duration
	InitialDelay time.Duration
	Idle         time.Duration
	Sharp        bool
	// CancellationBackoff is how long a stopped daemon's blocking calls keep working
	// after the stop (kopf's graceful termination): when it is over, the daemon is
	// cancelled (see DaemonLink.Cancelled). Defaults to 0: at once.
	CancellationBackoff time.Duration
	// CancellationTimeout is how long a cancelled daemon may take to exit before its
	// Lua is interrupted wherever it is (kopf abandons it then). Defaults to 60s.
	CancellationTimeout time.Duration
	// Admission handlers (KindValidate, KindMutate): the operations they serve
	// (CREATE, UPDATE, DELETE, CONNECT; empty means all of them, as in kopf),
	// whether they have side effects other than on dry runs (kopf's side_effects:
	// sideEffects NoneOnDryRun instead of None), their failure policy ("Fail", the
	// default, or "Ignore") and the subresource they serve ("" the resource
	// itself). Timeout is then the webhook's timeout (1 to 30 s, default 10 s).
	Operations    []string
	SideEffects   bool
	FailurePolicy string
	Subresource   string
	// Related are the relations of a handler serving Related (luaop.on.related):
	// the resources whose objects, related to the handler's object, trigger it.
	Related []Relation
	// Source is "file:line" of the registration, for messages.
	Source string
	// CodeHash identifies the handler's code and options: a reload restarts a
	// daemon only when it changes.
	CodeHash string
	// EvalHash identifies everything a cycle evaluates for this handler besides the
	// object, for the handlers a reload must revisit every object for
	// (RevisitedOnReload): its code and options (CodeHash), the file that registered
	// it (filters, constants and helpers it reads) and every module; for an index,
	// the whole script set. A reload gives every object a cycle only when such a
	// handler was added, removed or changed its EvalHash; "" for other handlers.
	EvalHash string
}

// RevisitedOnReload tells whether a reload that adds, removes or changes this
// handler must give every object a cycle: daemons and timers run on objects between
// their changes and indexes keep what they computed from them, and a handler that
// requires a finalizer needs it added to (or removed from) objects that do not change.
func (s Spec) RevisitedOnReload() bool {
	return s.IsEngine() || s.RequiresFinalizer()
}

// IsEngine tells whether the handler runs on an object between its changes (a daemon,
// a timer) or keeps state computed from it (an index): what a reload must revisit on
// every object.
func (s Spec) IsEngine() bool {
	return s.Kind == KindDaemon || s.Kind == KindTimer || s.Kind == KindIndex
}

// RequiresFinalizer tells whether the presence of this handler must block deletion.
func (s Spec) RequiresFinalizer() bool {
	switch s.Kind {
	case KindDaemon, KindTimer:
		return true
	case KindChange:
		for _, r := range s.Reasons {
			if r == Delete && !s.Optional {
				return true
			}
		}
	}
	return false
}

// Serves tells whether a change handler serves a reason.
func (s Spec) Serves(r Reason) bool {
	for _, x := range s.Reasons {
		if x == r {
			return true
		}
	}
	return false
}

// Cause is one high-level reason to run handlers for one object. Body, Old and New
// are read-only: they belong to the informer cache or the cycle, never to a handler.
type Cause struct {
	Reason   Reason
	Resource Resource
	Body     map[string]any
	Old, New any
	Diff     state.Diff
	// WholeOld and WholeNew are the whole essences when Old and New were reduced to
	// a field handler's field (subhandlers' filters match against them, as kopf's).
	WholeOld, WholeNew any
	// EventType is the raw watch event type for event handlers (ADDED, MODIFIED, DELETED).
	EventType string
	// Related are the changes of related objects since the handler last saw them
	// (a Related cause; one handler's, as its relations select them), in the order
	// they were first seen.
	Related []RelatedChange
	// Prematch asks whether a change handler could be interested in the object at
	// all (kopf's pre-matching, which decides whether an object gets a diff-base):
	// the old and new filters, which judge a particular change, are left out.
	Prematch bool
}

// Read is a resource the scripts declared they read (luaop.reads): the operator keeps
// it in its informer cache, where luaop.kube.get and list find it.
type Read struct {
	Resource Resource
	// LabelSelector narrows what is kept ("" every object).
	LabelSelector string
	// Metadata keeps the objects' metadata only (PartialObjectMetadata).
	Metadata bool
	// Source is "file:line" of the declaration, for messages.
	Source string
}

// RelationKind is how an object is related to the object of a handler.
type RelationKind string

const (
	// RelationOwned: the object's ownerReferences name the handler's object (its
	// controller reference only, unless Relation.AnyOwner): controller-runtime's
	// Owns.
	RelationOwned RelationKind = "owned"
	// RelationLabelled: the object carries Relation.Label, whose value names the
	// handler's object: "namespace.name" for a namespaced one, "name" for a
	// cluster-scoped one (relations across namespaces, or to cluster-scoped
	// objects, which owner references cannot express).
	RelationLabelled RelationKind = "labelled"
	// RelationMapped: a function of the scripts maps the object to zero or more
	// objects of the handler's resource: controller-runtime's
	// Watches(EnqueueRequestsFromMapFunc).
	RelationMapped RelationKind = "mapped"
)

// Relation is one kind of related object of a handler's object.
type Relation struct {
	Kind RelationKind
	// Resource is the related resource, as the script spells it.
	Resource Resource
	// AnyOwner (owned): any owner reference naming the object counts, not only
	// the controller's (controller-runtime's MatchEveryOwner).
	AnyOwner bool
	// Label (labelled) is the label whose value names the object.
	Label string
}

// RelatedChange is what happened to one related object since its parent's
// handler last ran for it. Several watch events of one object between two runs
// are coalesced into one change: Type is the newest event's (ADDED, MODIFIED,
// DELETED), except that an object added and then modified stays ADDED; Old is
// the object before the first of them (nil for ADDED), Object the newest state
// seen (the last one known for DELETED).
type RelatedChange struct {
	Relation  RelationKind
	Resource  Resource // canonical
	Kind      string
	Namespace string
	Name      string
	Type      string
	Object    map[string]any
	Old       map[string]any
}

// ObjectRef names an object of a handler's resource: what a mapped relation's
// function returns.
type ObjectRef struct {
	Namespace, Name string
}

// Call is one invocation of one handler.
type Call struct {
	Handler Spec
	Cause   Cause
	// Patch accumulates what the handler changes; the cycle applies it once.
	Patch *state.Patch
	// Retry is 0 on the first attempt.
	Retry   int
	Started time.Time
	Runtime time.Duration
	Logger  *slog.Logger
	// Daemon links a daemon to its object while it runs; nil for every other kind.
	Daemon *DaemonLink
	// Indexes are the operator-wide indexes, readable by every handler.
	Indexes *state.Indexes
}

// DaemonLink is what a running daemon has of its object besides its first cause:
// a daemon outlives the body it started with and writes while other handlers run.
type DaemonLink struct {
	// Stopped ends (without an error of its own meaning anything) when the daemon
	// must stop: a context rather than a channel, so that a sleeping daemon can be
	// woken by a callback (context.AfterFunc) instead of a goroutine waiting on it.
	Stopped context.Context
	// Cancelled ends when a stopped daemon is cancelled: its cancellation backoff
	// after the stop (kopf's cancellation_backoff; at once by default). From then on,
	// once the daemon has been told of its stop (a luaop.sleep returned false), its
	// next blocking call ends it with ErrDaemonCancelled, which it cannot catch.
	// nil: never (the daemon only sees Stopped).
	Cancelled context.Context
	// Latest returns the newest body of the object (nil once it is gone).
	Latest func() map[string]any
	// UID, Name and Namespace are the object's identity: what a daemon has of its
	// object besides Latest (the Call's Cause.Body may then be nil, so that a
	// daemon keeps no body of its own for its whole life).
	UID, Name, Namespace string
	// Flush hands what the daemon wrote into ctx.patch to the object's worker, which
	// applies it in order with the change handlers' patches.
	Flush func(patch map[string]any)
}

// Result is what one handler call produced.
type Result struct {
	// Value, when not nil, is stored in status.<handler id>.
	Value any
	// Subhandlers the handler registered during this call (kopf's subhandlers). Their
	// ids are "<parent id>/<child id>"; each has its own persisted progress, and the
	// parent counts as finished only when all of them are.
	Subhandlers []Spec
}

// TemporaryError asks for a retry after Delay (kopf TemporaryError).
type TemporaryError struct {
	Message string
	Delay   time.Duration
}

func (e *TemporaryError) Error() string {
	return fmt.Sprintf("%s (retry in %s)", e.Message, e.Delay)
}

// PermanentError fails the handler for good: retries are useless (kopf PermanentError).
type PermanentError struct {
	Message string
}

func (e *PermanentError) Error() string { return e.Message }

// ErrDaemonCancelled ends a daemon that went on after its stop: kopf's asyncio
// cancellation of an async daemon, raised at its next blocking call.
var ErrDaemonCancelled = errors.New("the daemon was cancelled: it was stopped and went on after luaop.sleep returned false")

// IsPermanent reports whether err is (or wraps) a PermanentError.
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}

// AsTemporary returns the TemporaryError that err is or wraps, if any.
func AsTemporary(err error) (*TemporaryError, bool) {
	var t *TemporaryError
	ok := errors.As(err, &t)
	return t, ok
}
