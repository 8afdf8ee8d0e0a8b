package processing

import (
	"fmt"
	"log/slog"
	"time"

	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/luaop/luaop/handling"
	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// Options configure a Reactor. The zero value of every field means its default.
type Options struct {
	// Namespaces selects where to watch namespaced resources: exact names, glob
	// patterns ("team-*") and exclusions ("!kube-*"). Empty means cluster-wide.
	Namespaces []string
	// Workers bounds how many objects are processed at once. Defaults to 16.
	Workers int
	// Prefix is the annotation and finalizer prefix of this operator. Defaults to
	// "luaop.dev". Two operators handling the same objects need different prefixes.
	Prefix string
	// ProgressStorage and DiffBaseStorage say where per-handler progress and the
	// last handled essence are kept: StorageAuto (the default) chooses per resource:
	// status when the resource has a status subresource whose schema keeps the
	// field StatusField (one /status patch per handled change), annotations
	// otherwise; StorageAnnotations or StorageStatus force one. Whatever is chosen,
	// the other storage is read too, so switching never handles anything twice.
	ProgressStorage, DiffBaseStorage StorageMode
	// StatusField is the field of status used by status storage. Defaults to Prefix
	// with dots as underscores ("luaop_dev").
	StatusField string
	// Progress and DiffBase, when set, replace the storages above for every
	// resource, as they are (custom storages).
	Progress state.ProgressStorage
	DiffBase state.DiffBaseStorage
	// Lifecycle picks the handlers run per cycle. Defaults to LifecycleAsap.
	Lifecycle Lifecycle
	// DefaultBackoff is the delay before retrying a handler that failed with an
	// arbitrary error (not a temporary_error, which says its own delay), for the
	// handlers that set no backoff of their own (kopf's
	// settings.execution.default_backoff). Defaults to 60s.
	DefaultBackoff time.Duration
	// ConsistencyTimeout is how long change handlers of an object wait for the watch
	// to deliver the version the operator's own last patch produced. Defaults to 5s.
	ConsistencyTimeout time.Duration
	// PostEvents posts Kubernetes Events for handler outcomes. Defaults to true.
	PostEvents *bool
	// Recorder, when set, posts the framework's Events (and is shared with the
	// scripts' luaop.info/warn/exception, so one rate limit and one aggregation cover
	// both). When nil and PostEvents is true, Start makes a recorder of its own.
	Recorder record.EventRecorder
	// Logger receives framework and handler logs. Defaults to slog.Default().
	Logger *slog.Logger
	// SuccessLogLevel is the level of the "handler succeeded" line logged for every
	// handler that succeeds on an object. Defaults to info (the zero value); `luaop
	// run` logs them at debug, so that production logs show what needs attention.
	SuccessLogLevel slog.Level
	// OnHandlerRun, when set, is told about every handler run (live views, metrics).
	// It is called from worker goroutines and must return quickly.
	OnHandlerRun func(HandlerRun)
	// Observer, when set, is told about watch notifications and patches (metrics).
	// It is called from informer and worker goroutines and must return quickly.
	Observer Observer
	// QueueMetrics, when set, receives the work queue's metrics.
	QueueMetrics workqueue.MetricsProvider
	// ResyncPeriod re-delivers every object to the queue periodically as a safety net.
	// Defaults to 0 (off): causes come from events, and delays live in the queue.
	ResyncPeriod time.Duration
	// ShutdownGracePeriod is how long cycles in flight may take to finish after the
	// context of Start is done, before they are cancelled. Defaults to 20s.
	ShutdownGracePeriod time.Duration
	// StopAtOnce, when set, is closed when the operator must stop writing at once,
	// with no shutdown grace: a replica that lost its shard membership (sharding)
	// must have stopped before the others take its objects, which a grace period
	// of cycles finishing their patches would overrun. Once it is closed (with the
	// context of Start done), the cycles and daemons in flight are cancelled: what
	// they had not written is the next owner's to do again. Nil: never.
	StopAtOnce <-chan struct{}
	// RetryOnReload retries at once, after a reload, the handlers waiting in their
	// backoff after an error whose code (causes.Spec.CodeHash: what their function
	// can reach) the reload changed: change handlers and their subhandlers, and
	// timers. Off by default (luaop run: a production reload must not retry every
	// failing handler at once); `luaop dev` turns it on. Daemons whose code changed
	// are restarted either way.
	RetryOnReload bool
	// DryRun logs every write the core would send (patches of objects, status and
	// finalizers) instead of sending it. Handlers still run.
	DryRun bool
	// Shard, when set, limits the Reactor to its share of the objects (sharding
	// across replicas: shard.go). Nil: every object.
	Shard Shard
	// Clock drives every wait of the core: the work queue's delays and backoffs,
	// retries, timers, daemons' delays, consistency waits. Tests give a fake clock
	// (k8s.io/utils/clock/testing). Defaults to the real clock.
	Clock clock.WithTickerAndDelayedExecution
}

// Observer is told about what crosses the API boundary (metrics.Metrics implements it).
// resource is the resource's ControllerName ("widgets.example.com").
type Observer interface {
	EventReceived(resource, eventType string)
	PatchSent(resource, subresource, result string)
}

// HandlerRun describes one finished handler attempt.
type HandlerRun struct {
	Resource string // as the scripts spell it: group/version/plural
	// Controller is the resource's ControllerName ("widgets.example.com").
	Controller string
	Namespace  string
	Name       string
	HandlerID  string
	// MetricID is the id metrics label the run with: HandlerID, except for a
	// subhandler, whose id (parent/<sub id>) is data-driven: there it is the id of
	// the top-level handler that registered it, so the series stay as many as the
	// scripts' handlers.
	MetricID string
	Reason   string
	Outcome  Outcome
	Duration time.Duration
	Err      error
}

func (o *Options) setDefaults() {
	if o.Workers <= 0 {
		o.Workers = 16
	}
	if o.Prefix == "" {
		o.Prefix = "luaop.dev"
	}
	if o.StatusField == "" {
		o.StatusField = handling.StatusField(o.Prefix)
	}
	if o.ProgressStorage == "" {
		o.ProgressStorage = StorageAuto
	}
	if o.DiffBaseStorage == "" {
		o.DiffBaseStorage = StorageAuto
	}
	if o.Lifecycle == "" {
		o.Lifecycle = LifecycleAsap
	}
	if o.DefaultBackoff <= 0 {
		o.DefaultBackoff = handling.DefaultBackoff
	}
	if o.ConsistencyTimeout <= 0 {
		o.ConsistencyTimeout = 5 * time.Second
	}
	if o.PostEvents == nil {
		t := true
		o.PostEvents = &t
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.ShutdownGracePeriod <= 0 {
		o.ShutdownGracePeriod = 20 * time.Second
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
}

// StorageMode chooses where the operator's bookkeeping is kept on objects.
type StorageMode string

const (
	StorageAuto        StorageMode = "auto"
	StorageAnnotations StorageMode = "annotations"
	StorageStatus      StorageMode = "status"
)

// ParseStorageMode checks a storage setting.
func ParseStorageMode(s string) (StorageMode, error) {
	switch m := StorageMode(s); m {
	case StorageAuto, StorageAnnotations, StorageStatus:
		return m, nil
	}
	return "", fmt.Errorf("unknown storage %q: use auto, annotations or status", s)
}

// withBackoff is spec with its backoff, or the operator's default when it sets none.
func (o *Options) withBackoff(spec causes.Spec) causes.Spec {
	return handling.WithBackoff(spec, o.DefaultBackoff)
}

// Finalizer is the finalizer this operator puts on objects that need it.
func (o *Options) finalizer() string { return Finalizer(o.Prefix) }

// Finalizer is the finalizer an operator with this prefix puts on objects.
func Finalizer(prefix string) string { return prefix + "/finalizer" }
