package processing

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// objectKey identifies one object of one watched resource; the resource is the one
// the scripts registered for, so handlers are matched without a lookup.
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

// objectMemory is what the operator remembers of one object between cycles (kopf's
// "memories"): only in memory, rebuilt from the objects after a restart.
type objectMemory struct {
	uid    string
	latest *unstructured.Unstructured // nil once the object is gone
	gone   bool
	// pending events for raw event handlers, in arrival order; only kept while the
	// resource has event handlers.
	pending []rawEvent
	// noticedByListing: the object came with the initial listing (resume causes).
	noticedByListing bool
	resumeIsHandled  bool
	// lastSeenVersion is the newest resourceVersion the watch delivered.
	lastSeenVersion string
	// expectedVersion is what the operator's own last patch returned, until the watch
	// delivers it; consistencyDeadline bounds the wait.
	expectedVersion     string
	consistencyDeadline time.Time

	// Background engines (engines.go).
	daemons            map[string]*daemonRun
	timers             map[string]*timerState
	daemonPatch        map[string]any // handed over by daemons, applied by the next cycle
	lastChangeAt       time.Time      // the last essential change, for idle timers
	essenceHash        [32]byte
	indexedVersion     string
	countedForIndexing bool
	indexed            bool
	// initialPending: found by the initial listing, not through a cycle yet.
	initialPending bool
}

// Operator watches the resources the handlers are registered for and runs them.
type Operator struct {
	opts     Options
	handlers Handlers
	dynamic  dynamic.Interface
	disco    discovery.DiscoveryInterface
	events   kubernetes.Interface // nil when events are off
	recorder record.EventRecorder
	log      *slog.Logger
	filter   namespaceFilter

	queue workqueue.TypedRateLimitingInterface[objectKey]

	mu       sync.Mutex
	objects  map[objectKey]*objectMemory
	watchers map[causes.Resource]*watcher

	indexes *state.Indexes
	// pendingIndexing counts objects of the initial listings not indexed yet.
	pendingIndexing int
	// pendingInitial counts objects of the initial listings not processed yet.
	pendingInitial int
	// daemonCtx parents every daemon's context; nil before Start and once stopping,
	// so that no daemon starts then.
	daemonCtx    context.Context
	daemonsGroup sync.WaitGroup

	ctx     context.Context // set by Start; watchers started later use it
	started atomic.Bool
	pruned  sync.Map // "resource field" -> struct{}: schema pruning reported once
}

// New prepares an Operator; nothing runs until Start.
func New(cfg *rest.Config, handlers Handlers, opts Options) (*Operator, error) {
	opts.setDefaults()
	cfg = rest.CopyConfig(cfg)
	// Server warnings (such as "unknown field status.x" when a schema prunes) go to
	// the operator's log, not to klog's stderr; pruning is reported on its own.
	cfg.WarningHandlerWithContext = warningLogger{opts.Logger}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the dynamic client: %w", err)
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the discovery client: %w", err)
	}
	filter, err := newNamespaceFilter(opts.Namespaces)
	if err != nil {
		return nil, err
	}
	o := &Operator{
		opts:     opts,
		handlers: handlers,
		dynamic:  dyn,
		disco:    disco,
		log:      opts.Logger,
		filter:   filter,
		objects:  map[objectKey]*objectMemory{},
		indexes:  state.NewIndexes(),
		watchers: map[causes.Resource]*watcher{},
	}
	if *opts.PostEvents && opts.Recorder == nil {
		if o.events, err = kubernetes.NewForConfig(cfg); err != nil {
			return nil, fmt.Errorf("creating the events client: %w", err)
		}
	}
	return o, nil
}

// Start watches and processes until ctx is done; it blocks, then waits for running
// handlers to finish.
func (o *Operator) Start(ctx context.Context) error {
	if !o.started.CompareAndSwap(false, true) {
		return fmt.Errorf("operator already started")
	}
	// The queue is made here, not in New: client-go queues start goroutines at once.
	o.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[objectKey](time.Second, 5*time.Minute),
		workqueue.TypedRateLimitingQueueConfig[objectKey]{Name: "luaop", MetricsProvider: o.opts.QueueMetrics},
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
	o.mu.Lock()
	o.ctx = ctx
	o.mu.Unlock()
	o.Refresh()

	// Workers get a context that outlives ctx by up to the shutdown grace period:
	// cycles in flight finish their patches instead of losing them to a cancelled
	// request (their handlers' progress would be lost, and they would run again).
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	daemonCtx, stopDaemons := context.WithCancel(work)
	defer stopDaemons()
	o.mu.Lock()
	o.daemonCtx = daemonCtx
	o.mu.Unlock()
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
	o.log.Info("stopping: finishing the cycles in flight", "grace", o.opts.ShutdownGracePeriod)
	stopped := make(chan struct{})
	go func() { workers.Wait(); close(stopped) }()
	// Queued but not yet started objects are left for the next start: their
	// causes are rebuilt from the objects.
	o.queue.ShutDown()
	o.stopAllDaemons()
	daemonsDone := make(chan struct{})
	go func() { o.daemonsGroup.Wait(); close(daemonsDone) }()
	grace := time.After(o.opts.ShutdownGracePeriod)
	for stopped != nil || daemonsDone != nil {
		select {
		case <-stopped:
			stopped = nil
		case <-daemonsDone:
			daemonsDone = nil
		case <-grace:
			o.log.Warn("shutdown grace period over: cancelling the cycles and daemons still running")
			cancelWork()
			grace = nil
		}
	}
	workers.Wait()
	o.mu.Lock()
	for _, w := range o.watchers {
		w.wait()
	}
	o.mu.Unlock()
	return nil
}

// Refresh starts watching resources that handlers were registered for since the last
// call (after a script reload), and gives every known object a cycle, so that daemons
// and timers follow the new handlers. Watchers of resources no longer used keep
// running: their objects are simply not handled, and a later reload may need them.
func (o *Operator) Refresh() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ctx == nil {
		return
	}
	for key := range o.objects {
		o.queue.Add(key)
	}
	for _, spec := range o.handlers.Specs() {
		if _, ok := o.watchers[spec.Resource]; ok {
			continue
		}
		w := newWatcher(o, spec.Resource)
		o.watchers[spec.Resource] = w
		go w.run(o.ctx)
	}
}

// Synced tells whether every watched resource finished its initial listing and the
// objects found there went through one cycle at least.
func (o *Operator) Synced() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, w := range o.watchers {
		if !w.synced() {
			return false
		}
	}
	return o.pendingInitial == 0
}

// initialDone marks an object of the initial listing as processed once.
func (o *Operator) initialDone(mem *objectMemory) {
	o.mu.Lock()
	if mem.initialPending {
		mem.initialPending = false
		o.pendingInitial--
	}
	o.mu.Unlock()
}

// record is called by watchers for every notification; it only remembers and queues.
func (o *Operator) record(key objectKey, eventType string, obj *unstructured.Unstructured, initial, keepEvents bool) {
	o.mu.Lock()
	mem, ok := o.objects[key]
	if !ok {
		mem = &objectMemory{uid: string(obj.GetUID())}
		o.objects[key] = mem
	}
	if uid := string(obj.GetUID()); mem.uid != uid && eventType != "DELETED" {
		// Deleted and re-created under the same name between two notifications:
		// the old incarnation is gone, its memo too.
		o.handlers.Forget(mem.uid)
		*mem = objectMemory{uid: uid}
	}
	if initial {
		if !mem.noticedByListing {
			mem.initialPending = true
			o.pendingInitial++
		}
		mem.noticedByListing = true
		if !mem.countedForIndexing && o.hasKind(key.resource, causes.KindIndex) {
			mem.countedForIndexing = true
			o.pendingIndexing++
		}
	}
	if mem.lastChangeAt.IsZero() {
		mem.lastChangeAt = o.opts.Now()
	}
	if keepEvents {
		mem.pending = append(mem.pending, rawEvent{eventType: eventType, object: obj})
	}
	if eventType == "DELETED" {
		mem.latest, mem.gone = nil, true
	} else {
		mem.latest, mem.gone = obj, false
	}
	rv := obj.GetResourceVersion()
	mem.lastSeenVersion = rv
	if mem.expectedVersion != "" && !versionOlder(rv, mem.expectedVersion) {
		mem.expectedVersion = "" // consistency is achieved
	}
	o.mu.Unlock()
	o.queue.Add(key)
}

// versionOlder compares resourceVersions. They are opaque by API convention but are
// etcd revisions in practice; when either does not parse, only equality is known.
func versionOlder(rv, than string) bool {
	a, errA := strconv.ParseUint(rv, 10, 64)
	b, errB := strconv.ParseUint(than, 10, 64)
	if errA != nil || errB != nil {
		return rv != than
	}
	return a < b
}

func (o *Operator) processNext(ctx context.Context) bool {
	key, shutdown := o.queue.Get()
	if shutdown {
		return false
	}
	defer o.queue.Done(key)
	requeueAfter, err := o.process(ctx, key)
	switch {
	case err != nil:
		// Framework errors (API failures) are throttled per object; handler
		// failures never come here, they are outcomes.
		o.log.Error("processing failed; will retry", "object", key.String(), "error", err)
		o.queue.AddRateLimited(key)
	case requeueAfter > 0:
		o.queue.Forget(key)
		o.queue.AddAfter(key, requeueAfter)
	default:
		o.queue.Forget(key)
	}
	return true
}

// warningLogger passes API server warnings to the operator's log at debug level.
type warningLogger struct{ log *slog.Logger }

func (w warningLogger) HandleWarningHeaderWithContext(ctx context.Context, code int, agent string, text string) {
	w.log.Debug("API server warning", "warning", text)
}
