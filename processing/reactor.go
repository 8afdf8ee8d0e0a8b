package processing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/luaop/luaop/caching"
	"github.com/luaop/luaop/kubeclient/slim"
	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// Reactor is the core of an operator (kopf's word for it): it watches the resources
// the handlers are registered for, turns what it sees into causes and runs the
// handlers, persisting their progress on the objects. operator.Operator wraps one
// together with the Lua runtime. Who owns what is in doc.go.
type Reactor struct {
	opts     Options
	clock    clock.WithTickerAndDelayedExecution
	handlers Handlers
	dynamic  dynamic.Interface
	metadata metadata.Interface // nil: the freshness floor lists through dynamic
	disco    discovery.DiscoveryInterface
	events   kubernetes.Interface // nil when events are off
	recorder record.EventRecorder
	log      *slog.Logger
	filter   namespaceFilter

	queue    workqueue.TypedRateLimitingInterface[objectKey]
	failures workqueue.TypedRateLimiter[objectKey] // the queue's; set by Start
	// qmetrics feeds the work queue's metrics per resource; nil without
	// Options.QueueMetrics.
	qmetrics *queueMetrics
	// front marks the keys the queue serves first (lanes.go); nil when not
	// sharded. Set by Start.
	front *frontMarks
	// board is what /debug shows: objects in flight, timers (status.go).
	board   statusBoard
	objects objectTable
	ready   *readiness
	res     *resources
	// cache holds the informers of the watches and of the declared reads, and
	// answers the scripts' reads (caching.Cache; its doc says who owns what).
	cache   *caching.Cache
	reads   readViews
	specIdx specIndexCache
	indexes *state.Indexes
	daemons daemonRegistry
	// pause gates the workers while the Reactor is paused (pause.go).
	pause pauseGate
	// rel are the objects waiting to be released to another replica (shard.go).
	rel releases
	// relations are the related objects' watches and triggers (related.go).
	relations *relations
	// forgetting counts the goroutines that forget old incarnations after their
	// daemons exited (Start waits for them).
	forgetting sync.WaitGroup

	// startMu guards ctx: set once by Start, read by Refresh (a reload may come
	// before Start). A leaf lock.
	startMu sync.Mutex
	ctx     context.Context
	started atomic.Bool
	// stopping is set when Start's context ends: workers take no new key, reloads
	// start no new watcher.
	stopping atomic.Bool
	// enginesMu guards engines, the signature of the handlers of the last Refresh
	// that follow a reload only through a cycle of every object (engineSignature),
	// needed only when it changed. Held around Handlers.Specs (an atomic load).
	enginesMu sync.Mutex
	engines   string
	// changeCodes are the change handlers' code hashes at the last Refresh
	// (RetryOnReload: reloadretry.go); enginesMu guards them too.
	changeCodes map[string]string
	pruned      sync.Map // "resource field" -> struct{}: schema pruning reported once

	// cycleDone is for tests only (nil otherwise; set before Start): after every
	// cycle of an object it is told the newest resourceVersion the cycle had seen
	// and whether the object still waits for the watch to deliver the operator's
	// own write. The harness builds its barriers on it (harness_test.go).
	cycleDone func(key objectKey, seen string, waitingForOwnWrite bool)
}

// Clients are the API clients a Reactor uses. New builds them from a rest.Config;
// tests give client-go's fakes.
type Clients struct {
	Dynamic   dynamic.Interface
	Discovery discovery.DiscoveryInterface
	// Metadata lists objects' metadata only (the freshness floor, freshness.go); nil:
	// Dynamic lists them whole.
	Metadata metadata.Interface
	// Events posts the framework's Events when Options.Recorder is nil; nil: none.
	Events kubernetes.Interface
}

// New prepares a Reactor; nothing runs until Start.
func New(cfg *rest.Config, handlers Handlers, opts Options) (*Reactor, error) {
	opts.setDefaults()
	cfg = rest.CopyConfig(cfg)
	// Server warnings (such as "unknown field status.x" when a schema prunes) go to
	// the operator's log, not to klog's stderr; pruning is reported on its own.
	cfg.WarningHandlerWithContext = warningLogger{opts.Logger}
	// Objects decoded from JSON come without metadata.managedFields, cut before
	// decoding (nothing here reads it, and it is often a third of an object): less
	// CPU and garbage per event.
	dyn, err := slim.NewDynamicForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the dynamic client: %w", err)
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the discovery client: %w", err)
	}
	meta, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the metadata client: %w", err)
	}
	clients := Clients{Dynamic: dyn, Discovery: disco, Metadata: meta}
	if *opts.PostEvents && opts.Recorder == nil {
		if clients.Events, err = kubernetes.NewForConfig(cfg); err != nil {
			return nil, fmt.Errorf("creating the events client: %w", err)
		}
	}
	return NewWithClients(clients, handlers, opts)
}

// NewWithClients prepares a Reactor on the given clients; nothing runs until Start.
func NewWithClients(clients Clients, handlers Handlers, opts Options) (*Reactor, error) {
	opts.setDefaults()
	filter, err := newNamespaceFilter(opts.Namespaces)
	if err != nil {
		return nil, err
	}
	return &Reactor{
		opts:     opts,
		clock:    opts.Clock,
		handlers: handlers,
		dynamic:  clients.Dynamic,
		metadata: clients.Metadata,
		disco:    clients.Discovery,
		events:   clients.Events,
		log:      opts.Logger,
		filter:   filter,
		objects:  objectTable{objects: map[objectKey]*objectState{}},
		ready:    newReadiness(),
		res:      newResources(),
		cache: caching.New(clients.Dynamic, clients.Metadata, caching.Options{ResyncPeriod: opts.ResyncPeriod,
			ReadYourWritesTimeout: opts.ConsistencyTimeout, Logger: opts.Logger, Clock: opts.Clock}),
		indexes:   state.NewIndexes(),
		daemons:   daemonRegistry{running: map[*daemonRun]struct{}{}},
		relations: newRelations(),
	}, nil
}

// Start watches and processes until ctx is done; it blocks, then waits for running
// handlers to finish.
func (o *Reactor) Start(ctx context.Context) error {
	if !o.started.CompareAndSwap(false, true) {
		return fmt.Errorf("operator already started")
	}
	// The queue is made here, not in New: client-go queues start goroutines at once.
	// Its storage is laneFIFO (lanes.go), metered or not: a sharded Reactor puts
	// the objects that come to it after its initial listing in front. With
	// QueueMetrics, the storage reports per resource (metrics.go); the queue itself
	// is unnamed, so client-go keeps no metrics of its own for it.
	if o.opts.Shard != nil {
		o.front = newFrontMarks()
	}
	if o.opts.QueueMetrics != nil {
		o.qmetrics = newQueueMetrics(o.opts.QueueMetrics, o.clock)
		updates, stopUpdates := context.WithCancel(ctx)
		defer stopUpdates()
		go o.qmetrics.runUpdates(updates, o.clock)
	}
	baseConfig := workqueue.TypedQueueConfig[objectKey]{Clock: o.clock, Queue: newLaneFIFO(o.qmetrics, o.front)}
	// The failure backoff of framework errors: process asks it (When) and keeps the
	// retry time in the object's memory; the queue's Forget resets it.
	o.failures = workqueue.NewTypedItemExponentialFailureRateLimiter[objectKey](time.Second, 5*time.Minute)
	o.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		o.failures,
		workqueue.TypedRateLimitingQueueConfig[objectKey]{Clock: o.clock,
			DelayingQueue: workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[objectKey]{
				Clock: o.clock, Queue: workqueue.NewTypedWithConfig(baseConfig)})},
	)
	o.recorder = o.opts.Recorder
	if !*o.opts.PostEvents {
		o.recorder = nil
	}
	if o.recorder == nil && o.events != nil {
		var shutdown func()
		o.recorder, shutdown = newEventRecorder(o.events)
		defer shutdown()
	}
	o.startMu.Lock()
	o.ctx = ctx
	o.startMu.Unlock()
	o.Refresh()

	// Workers get a context that outlives ctx by up to the shutdown grace period:
	// cycles in flight finish their patches instead of losing them to a cancelled
	// request (their handlers' progress would be lost, and they would run again).
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	daemonCtx, stopDaemons := context.WithCancel(work)
	defer stopDaemons()
	o.daemons.open(daemonCtx)
	var workers sync.WaitGroup
	for i := 0; i < o.opts.Workers; i++ {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for o.processNext(work) {
			}
		}()
	}
	<-ctx.Done()
	o.stopping.Store(true)
	o.pause.shutdown()
	o.res.close()
	o.log.Info("stopping: finishing the cycles in flight", "grace", o.opts.ShutdownGracePeriod)
	stopped := make(chan struct{})
	go func() { workers.Wait(); close(stopped) }()
	// Queued but not yet started objects are left for the next start: their
	// causes are rebuilt from the objects.
	o.queue.ShutDown()
	o.daemons.stopAll(o.opts.ShutdownGracePeriod)
	daemonsDone := make(chan struct{})
	go func() {
		o.daemons.wait()
		workers.Wait() // no worker starts a forget after this
		o.forgetting.Wait()
		close(daemonsDone)
	}()
	grace, atOnce := time.After(o.opts.ShutdownGracePeriod), o.opts.StopAtOnce
	for stopped != nil || daemonsDone != nil {
		select {
		case <-stopped:
			stopped = nil
		case <-daemonsDone:
			daemonsDone = nil
		case <-atOnce:
			o.log.Warn("told to stop writing at once: cancelling the cycles and daemons still running, with no grace")
			cancelWork()
			atOnce, grace = nil, nil
		case <-grace:
			o.log.Warn("shutdown grace period over: cancelling the cycles and daemons still running")
			cancelWork()
			grace, atOnce = nil, nil
		}
	}
	workers.Wait()
	// Informers and resolvers end with ctx; nothing is held while waiting for them.
	o.res.running.Wait()
	o.cache.Wait()
	return nil
}

// Refresh starts watching resources that handlers were registered for since the last
// call (after a script reload), and gives every known object a cycle when a daemon,
// timer, index or handler needing a finalizer was added, removed or changed (its
// code, options, file or a module edited: Spec.EvalHash), so that daemons, timers and
// indexes follow the new handlers and finalizers are added or removed. Otherwise no
// object needs a cycle: change handlers act on the next change, as they would have,
// and unchanged daemons keep running (saving a file of change handlers queues nothing).
// Watchers of resources no longer used keep running: their objects are simply not
// handled, and a later reload may need them.
func (o *Reactor) Refresh() {
	o.startMu.Lock()
	ctx := o.ctx
	o.startMu.Unlock()
	if ctx == nil || o.stopping.Load() {
		return
	}
	o.refreshResources(ctx, o.handlers.Specs())
	o.refreshReads(ctx)
	watchers, _ := o.watchersSnapshot()
	for _, w := range watchers {
		w.askReselect() // the handlers' filters may select otherwise now
	}
	o.refreshRelated(ctx, o.handlers.Specs())
	// The specs are read again under the lock: a Refresh that stalled in discovery
	// while a later reload's Refresh stored its signature must not store an older one.
	o.enginesMu.Lock()
	specs := o.handlers.Specs()
	engines := engineSignature(specs)
	changed := engines != o.engines
	o.engines = engines
	if o.opts.RetryOnReload {
		o.retryChangedCode(specs)
	}
	o.enginesMu.Unlock()
	if !changed {
		return
	}
	for _, key := range o.objects.keys() {
		o.queue.Add(key)
	}
}

// engineSignature identifies the handlers among specs that a reload must revisit every
// object for (Spec.RevisitedOnReload: daemons, timers, indexes, handlers that need a
// finalizer): their ids, kinds, resources and hashes, in a stable order. "" when
// there are none.
func engineSignature(specs []causes.Spec) string {
	var lines []string
	for _, s := range specs {
		if s.RevisitedOnReload() {
			lines = append(lines, strings.Join([]string{s.ID, string(s.Kind), s.Resource.String(), s.CodeHash, s.EvalHash}, "\x00"))
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// Indexes are the operator-wide indexes the index handlers build: operator-level
// hooks (startup, cleanup, probes) read them too, as kopf's activities do.
func (o *Reactor) Indexes() *state.Indexes { return o.indexes }

// Synced tells whether every watched resource finished its initial listing and the
// objects found there went through one cycle at least.
func (o *Reactor) Synced() bool {
	if !o.allResolved(o.handlers.Specs()) {
		return false
	}
	watchers, _ := o.watchersSnapshot()
	for _, w := range watchers {
		if !w.synced() {
			return false
		}
	}
	initial, _ := o.ready.pending()
	return initial == 0 && o.readsSynced() && o.relatedSynced()
}

// Cache is the operator's informer cache: the scripts' reads (luaop.kube.get and
// list) are answered from it, and related watches may share it.
func (o *Reactor) Cache() *caching.Cache { return o.cache }

// versionOlder and versionNewer compare resourceVersions (caching.VersionOlder and
// VersionNewer: one rule for the core and the cache).
func versionOlder(rv, than string) bool { return caching.VersionOlder(rv, than) }
func versionNewer(rv, than string) bool { return caching.VersionNewer(rv, than) }

func (o *Reactor) processNext(ctx context.Context) bool {
	key, shutdown := o.queue.Get()
	if shutdown {
		return false
	}
	defer func() {
		o.queue.Done(key)
		if o.qmetrics != nil {
			o.qmetrics.done(key)
		}
	}()
	if o.stopping.Load() {
		// Queued objects are left for the next start (their causes are rebuilt
		// from the objects): the grace period is for the cycles in flight only,
		// and a replica that lost its lease must stop handling at once.
		return false
	}
	// A paused Reactor holds the key here until it resumes (pause.go).
	if !o.pause.enter() {
		return false
	}
	defer o.pause.leave()
	if o.stopping.Load() {
		return false
	}
	controller := ControllerName(key.resource)
	rec, _ := o.opts.Observer.(ReconcileObserver)
	if rec != nil {
		rec.ReconcileStarted(controller)
	}
	o.board.begin(key, o.clock.Now())
	start := time.Now()
	requeueAfter, err := o.processSafely(ctx, key)
	took := time.Since(start)
	o.board.end(key)
	result := "success"
	switch {
	case errors.Is(err, errBackingOff):
		// Only the timers ran: the failure's backoff goes on (no Forget).
		result = "requeue_after"
		o.queue.AddAfter(key, requeueAfter)
		if o.qmetrics != nil {
			o.qmetrics.retry(key)
		}
	case err != nil:
		// Framework errors (API failures) are throttled per object (process took
		// the delay from o.failures, and the object's timers may be due sooner);
		// handler failures never come here, they are outcomes.
		result = "error"
		o.log.Error("processing failed; will retry", objectAttrs(key, o.kindOf(key), "", "error", err)...)
		if requeueAfter > 0 {
			o.queue.AddAfter(key, requeueAfter)
		} else {
			o.queue.AddRateLimited(key)
		}
		if o.qmetrics != nil {
			o.qmetrics.retry(key)
		}
	case requeueAfter > 0:
		result = "requeue_after"
		o.queue.Forget(key)
		o.queue.AddAfter(key, requeueAfter)
		if o.qmetrics != nil {
			o.qmetrics.retry(key)
		}
	default:
		o.queue.Forget(key)
	}
	if rec != nil {
		rec.ReconcileFinished(controller, result, took)
	}
	return true
}

// processSafely turns a panic of the framework into an error of this object, so
// that every other object keeps being served.
func (o *Reactor) processSafely(ctx context.Context, key objectKey) (requeue time.Duration, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("internal error while processing %s: %v (please report it)", key, r)
			if po, ok := o.opts.Observer.(PanicObserver); ok {
				po.ReconcilePanicked(ControllerName(key.resource))
			}
		}
	}()
	return o.process(ctx, key)
}

// warningLogger passes API server warnings to the operator's log at debug level.
type warningLogger struct{ log *slog.Logger }

func (w warningLogger) HandleWarningHeaderWithContext(ctx context.Context, code int, agent string, text string) {
	w.log.Debug("API server warning", "warning", text)
}
