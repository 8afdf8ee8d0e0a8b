package processing

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"github.com/luaop/luaop/processing/causes"
)

// resourceInfo is what discovery tells about a watched resource.
type resourceInfo struct {
	gvr               schema.GroupVersionResource
	kind              string
	namespaced        bool
	statusSubresource bool
	// store is where the resource's bookkeeping lives (storage.go).
	store atomic.Pointer[storage]
	// floor is what a consistent read showed when the watcher started (freshness.go);
	// nil: none (not loaded, or not loadable).
	floor atomic.Pointer[freshnessFloor]
}

// watcher runs the informers of one canonical resource. Informers (reflectors) list,
// then watch from the list's resourceVersion with bookmarks, re-list on 410 Gone, and
// end every watch request after a few minutes so a silently dead stream is replaced.
type watcher struct {
	op       *Reactor
	resource causes.Resource // canonical
	info     *resourceInfo   // set before the watcher is published, read-only after
	mu       sync.Mutex      // leaf lock: guards syncedFn and informers
	syncedFn []cache.InformerSynced
	// informers are the running informers (Revisit reads their stores).
	informers []cache.SharedIndexInformer
	ready     atomic.Bool
	done      chan struct{}
}

func newWatcher(op *Reactor, r causes.Resource, info *resourceInfo) *watcher {
	return &watcher{op: op, resource: r, info: info, done: make(chan struct{})}
}

func (w *watcher) syncedFns() []cache.InformerSynced {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]cache.InformerSynced(nil), w.syncedFn...)
}

func (w *watcher) informersSnapshot() []cache.SharedIndexInformer {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]cache.SharedIndexInformer(nil), w.informers...)
}

func (w *watcher) synced() bool {
	if !w.ready.Load() {
		return false
	}
	for _, f := range w.syncedFns() {
		if !f() {
			return false
		}
	}
	return true
}

func (w *watcher) run(ctx context.Context) {
	defer close(w.done)
	info := w.info
	log := w.op.log.With("resource", w.resource.String())

	namespaces := []string{metav1.NamespaceAll}
	if info.namespaced {
		if exact := w.op.filter.exactNamespaces(); exact != nil {
			namespaces = exact
		}
	}
	// Before the informers list: their first list may be older than this read.
	w.info.floor.Store(w.loadFreshnessFloor(ctx, log, namespaces))
	// A Shard (sharding across replicas) may narrow the watch to this replica's
	// objects with a label selector: memory and watch load split, not only work.
	var tweak dynamicinformer.TweakListOptionsFunc
	if w.op.opts.Shard != nil {
		if selector := w.op.opts.Shard.Watching(ctx, info.gvr, namespaces); selector != "" {
			tweak = func(lo *metav1.ListOptions) { lo.LabelSelector = selector }
			log.Info("watching this replica's share", "labelSelector", selector)
		}
	}
	var informers []cache.SharedIndexInformer
	for _, ns := range namespaces {
		inf := dynamicinformer.NewFilteredDynamicInformer(w.op.dynamic, info.gvr, ns, w.op.opts.ResyncPeriod, cache.Indexers{}, tweak).Informer()
		if err := inf.SetTransform(stripManagedFieldsTransform); err != nil {
			log.Error("cannot watch", "error", err)
			return
		}
		// Readiness follows the registration, not the informer: the informer's
		// HasSynced does not mean this handler received the initial listing.
		reg, err := inf.AddEventHandler(w)
		if err != nil {
			log.Error("cannot watch", "error", err)
			return
		}
		_ = inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
			log.Warn("watch interrupted; re-listing", "namespace", ns, "error", err)
		})
		informers = append(informers, inf)
		w.mu.Lock()
		w.syncedFn = append(w.syncedFn, reg.HasSynced)
		w.informers = append(w.informers, inf)
		w.mu.Unlock()
	}
	w.ready.Store(true)
	if rec, ok := w.op.opts.Observer.(ReconcileObserver); ok {
		rec.MaxConcurrentReconciles(ControllerName(w.resource), w.op.opts.Workers)
	}
	go func() {
		// The end of the initial listing may complete the indexes: wake whoever
		// waits for them (client-go polls HasSynced; nothing here polls the clock).
		if cache.WaitForCacheSync(ctx.Done(), w.syncedFns()...) {
			w.op.wakeIndexWaiters()
			w.op.sweepRelated(w.resource)
		}
	}()
	log.Info("watching", "namespaces", strings.Join(namespacesForLog(namespaces), ","), "statusSubresource", info.statusSubresource)
	var running sync.WaitGroup
	for _, inf := range informers {
		running.Add(1)
		go func() { defer running.Done(); inf.RunWithContext(ctx) }()
	}
	running.Wait()
}

// stripManagedFieldsTransform drops metadata.managedFields from every object the
// informer stores (as controller-runtime's cache.TransformStripManagedFields does).
// The server-side apply bookkeeping is about a third of a small object decoded, and
// grows with every writer (the operator's own finalizer and status writes add
// entries); nothing in luaop reads it, and handlers rarely would: a handler that needs
// it reads the object with luaop.kube.get. The client New makes cuts it from the JSON
// before decoding (kubeclient/slim); this catches what other clients give
// (NewWithClients, client-go's fakes).
func stripManagedFieldsTransform(obj any) (any, error) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		stripManagedFields(u)
	}
	return obj, nil
}

// stripManagedFields drops metadata.managedFields; it writes nothing when there are
// none (client-go's fake tracker hands the same object to several readers).
func stripManagedFields(u *unstructured.Unstructured) {
	if meta, ok := u.Object["metadata"].(map[string]any); ok {
		//lint:ignore S1033 a delete is a write even of a missing key (the race detector says so), and the map may be shared
		if _, has := meta["managedFields"]; has {
			delete(meta, "managedFields")
		}
	}
}

func namespacesForLog(ns []string) []string {
	if len(ns) == 1 && ns[0] == "" {
		return []string{"(all)"}
	}
	return ns
}

// lookupResource resolves a resource as a script spells it (plural, singular, kind or
// short name) through discovery, which also tells whether status is a subresource.
func lookupResource(disco discovery.DiscoveryInterface, spelling causes.Resource) (*resourceInfo, error) {
	gv := schema.GroupVersion{Group: spelling.Group, Version: spelling.Version}
	list, err := disco.ServerResourcesForGroupVersion(gv.String())
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, notServed{fmt.Sprintf("group/version %s is not served", gv)}
		}
		return nil, fmt.Errorf("discovery of %s: %w", gv, err)
	}
	want := strings.ToLower(spelling.Resource)
	var found *metav1.APIResource
	for i := range list.APIResources {
		r := &list.APIResources[i]
		if strings.Contains(r.Name, "/") {
			continue
		}
		if r.Name == want || strings.ToLower(r.SingularName) == want || strings.ToLower(r.Kind) == want || contains(r.ShortNames, want) {
			found = r
			break
		}
	}
	if found == nil {
		return nil, notServed{fmt.Sprintf("%s serves no resource named %q", gv, spelling.Resource)}
	}
	info := &resourceInfo{gvr: gv.WithResource(found.Name), kind: found.Kind, namespaced: found.Namespaced}
	for _, r := range list.APIResources {
		if r.Name == found.Name+"/status" {
			info.statusSubresource = true
		}
	}
	return info, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if strings.ToLower(x) == s {
			return true
		}
	}
	return false
}

// The watcher is the informers' event handler: it only records and queues, since
// informer notifications must be processed promptly.

func (w *watcher) OnAdd(obj any, isInInitialList bool) { w.notify("ADDED", obj, isInInitialList) }
func (w *watcher) OnUpdate(_, obj any)                 { w.notify("MODIFIED", obj, false) }
func (w *watcher) OnDelete(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	w.notify("DELETED", obj, false)
}

func (w *watcher) notify(eventType string, obj any, initial bool) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	o := w.op
	ns := u.GetNamespace()
	if ns != "" && !o.filter.allows(ns) {
		return
	}
	if o.opts.Shard != nil && !o.opts.Shard.Admits(w.info.gvr, eventType, u) {
		return // another replica's, or being handed over (shard.go)
	}
	if obs := o.opts.Observer; obs != nil {
		obs.EventReceived(ControllerName(w.resource), eventType)
	}
	key := objectKey{resource: w.resource, namespace: ns, name: u.GetName()}
	idx := o.specs()
	if initial {
		o.ready.listed(key, idx.has(w.resource, causes.KindIndex))
	}
	// While paused, the raw events are the working peer's (pause.go).
	keepEvents := idx.has(w.resource, causes.KindEvent) && !o.pause.pausedNow.Load()
	if o.objects.record(key, eventType, u, initial, keepEvents) && !initial && eventType != "DELETED" {
		o.queueNewcomer(key)
		return
	}
	o.queue.Add(key)
}
