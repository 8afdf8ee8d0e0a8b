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
	"k8s.io/client-go/tools/cache"

	"github.com/luaop/luaop/caching"
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

// watcher runs the watch of one canonical resource: it holds views of the informer
// cache (one per namespace watched), selected by what its handlers' filters let the
// API server select (Reactor.selectionOf), and is their event handler. Informers
// (reflectors) list, then watch from the list's resourceVersion with bookmarks,
// re-list on 410 Gone, and end every watch request after a few minutes so a silently
// dead stream is replaced. A reload that changes the selection moves the watch to
// the new views (follow); an object the new views do not hold leaves as a departure
// (departure.go).
type watcher struct {
	op       *Reactor
	resource causes.Resource // canonical
	info     *resourceInfo   // set before the watcher is published, read-only after
	// shardSelector is the label selector of this replica's share (Shard.Watching),
	// set by run before any view is held.
	shardSelector string
	mu            sync.Mutex // leaf lock: guards held and listing
	held          []heldView
	// listing are the registrations of the first views: the operator's initial
	// listing is done when they synced (listed, sticky: a later move of the watch
	// does not make the operator unready).
	listing []cache.InformerSynced
	listed  atomic.Bool
	// selection is what the held views ask the API server for.
	selection atomic.Pointer[caching.Selection]
	// reselect asks run to compare the selection with the handlers' again (Refresh).
	reselect chan struct{}
	ready    atomic.Bool
	done     chan struct{}
}

// heldView is one view the watcher holds and its registration on the view's informer.
type heldView struct {
	handle *caching.Handle
	reg    cache.ResourceEventHandlerRegistration
}

func newWatcher(op *Reactor, r causes.Resource, info *resourceInfo) *watcher {
	return &watcher{op: op, resource: r, info: info, done: make(chan struct{}), reselect: make(chan struct{}, 1)}
}

// informersSnapshot are the informers of the views held now (Revisit reads their stores).
func (w *watcher) informersSnapshot() []cache.SharedIndexInformer {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]cache.SharedIndexInformer, 0, len(w.held))
	for _, hv := range w.held {
		out = append(out, hv.handle.Informer())
	}
	return out
}

// synced tells whether the watcher's initial listing reached the operator.
func (w *watcher) synced() bool {
	if !w.ready.Load() {
		return false
	}
	if w.listed.Load() {
		return true
	}
	w.mu.Lock()
	listing := w.listing
	w.mu.Unlock()
	for _, f := range listing {
		if !f() {
			return false
		}
	}
	w.listed.Store(true)
	return true
}

// narrowed tells whether the watch holds less than every object of the operator's
// namespaces: a DELETED event may then be an object leaving it (departure.go).
func (w *watcher) narrowed() bool {
	sel := w.selection.Load()
	return sel != nil && (sel.Selected() || sel.Namespace != "")
}

// askReselect makes run compare the selection with the handlers' (after a reload).
func (w *watcher) askReselect() {
	select {
	case w.reselect <- struct{}{}:
	default:
	}
}

func (w *watcher) run(ctx context.Context) {
	defer close(w.done)
	log := w.op.log.With("resource", w.resource.String())
	sel := w.op.selectionOf(w.resource)
	namespaces := w.namespaces(sel)
	// Before the informers list: their first list may be older than this read.
	w.info.floor.Store(w.loadFreshnessFloor(ctx, log, namespaces, sel))
	// A Shard (sharding across replicas) may narrow the watch to this replica's
	// objects with a label selector: memory and watch load split, not only work.
	if w.op.opts.Shard != nil {
		if w.shardSelector = w.op.opts.Shard.Watching(ctx, w.info.gvr, namespaces, sel); w.shardSelector != "" {
			log.Info("watching this replica's share", "labelSelector", w.shardSelector)
		}
	}
	held, err := w.hold(ctx, namespaces, sel)
	if err == nil {
		err = w.register(held, true)
	}
	if err != nil {
		log.Error("cannot watch", "error", err)
		releaseViews(held)
		return
	}
	w.ready.Store(true)
	if rec, ok := w.op.opts.Observer.(ReconcileObserver); ok {
		rec.MaxConcurrentReconciles(ControllerName(w.resource), w.op.opts.Workers)
	}
	go func() {
		// The end of the initial listing may complete the indexes: wake whoever
		// waits for them (client-go polls HasSynced; nothing here polls the clock).
		if cache.WaitForCacheSync(ctx.Done(), w.listingSynced()...) {
			w.op.wakeIndexWaiters()
			w.op.sweepRelated(w.resource)
		}
	}()
	log.Info("watching", watchAttrs(namespaces, sel, w.info.statusSubresource)...)
	for {
		select {
		case <-ctx.Done():
			w.mu.Lock()
			held := w.held
			w.held = nil
			w.mu.Unlock()
			unregister(held)
			releaseViews(held)
			return
		case <-w.reselect:
			w.follow(ctx, log)
		}
	}
}

func (w *watcher) listingSynced() []cache.InformerSynced {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]cache.InformerSynced(nil), w.listing...)
}

func watchAttrs(namespaces []string, sel caching.Selection, statusSubresource bool) []any {
	attrs := []any{"namespaces", strings.Join(namespacesForLog(namespaces), ","), "statusSubresource", statusSubresource}
	if sel.Labels != "" {
		attrs = append(attrs, "labelSelector", sel.Labels)
	}
	if f := sel.FieldSelector(); f != "" {
		attrs = append(attrs, "fieldSelector", f)
	}
	return attrs
}

// namespaces are the namespaces to watch for a selection: every one (""), the
// operator's exact namespaces, or the one every handler is restricted to (none when
// the operator does not serve it).
func (w *watcher) namespaces(sel caching.Selection) []string {
	if !w.info.namespaced {
		return []string{metav1.NamespaceAll}
	}
	if sel.Namespace != "" {
		if w.op.filter.allows(sel.Namespace) {
			return []string{sel.Namespace}
		}
		return nil
	}
	if exact := w.op.filter.exactNamespaces(); exact != nil {
		return exact
	}
	return []string{metav1.NamespaceAll}
}

// views are the views of a selection in namespaces.
func (w *watcher) views(namespaces []string, sel caching.Selection) []caching.View {
	labelSelector := sel.Labels
	if w.shardSelector != "" {
		labelSelector = strings.Trim(w.shardSelector+","+labelSelector, ",")
	}
	out := make([]caching.View, 0, len(namespaces))
	for _, ns := range namespaces {
		out = append(out, caching.View{Resource: w.info.gvr, Namespace: ns, LabelSelector: labelSelector, FieldSelector: sel.FieldSelector()})
	}
	return out
}

// hold acquires the views of a selection, and makes them the watcher's selection
// once all are held. A replica's share of sharded objects serves no reads.
func (w *watcher) hold(ctx context.Context, namespaces []string, sel caching.Selection) ([]heldView, error) {
	var held []heldView
	for _, v := range w.views(namespaces, sel) {
		h, err := w.op.cache.Acquire(ctx, v, w.op.opts.Shard == nil)
		if err != nil {
			releaseViews(held)
			return nil, err
		}
		held = append(held, heldView{handle: h})
	}
	w.selection.Store(&sel)
	return held, nil
}

// register adds the watcher as the event handler of the held views and makes them
// the watcher's. listing: their initial list is the operator's initial listing
// (readiness, resume causes); after a move of the watch it is not.
func (w *watcher) register(held []heldView, listing bool) error {
	var synced []cache.InformerSynced
	for i := range held {
		reg, err := held[i].handle.Informer().AddEventHandler(watchHandler{w: w, listing: listing})
		if err != nil {
			unregister(held[:i])
			return err
		}
		held[i].reg = reg
		// Readiness follows the registration, not the informer: the informer's
		// HasSynced does not mean this handler received the initial listing.
		synced = append(synced, reg.HasSynced)
	}
	w.mu.Lock()
	w.held = held
	if listing {
		w.listing = synced
	}
	w.mu.Unlock()
	return nil
}

func unregister(held []heldView) {
	for _, hv := range held {
		if hv.reg != nil {
			_ = hv.handle.Informer().RemoveEventHandler(hv.reg)
		}
	}
}

func releaseViews(held []heldView) {
	for _, hv := range held {
		hv.handle.Release()
	}
}

// watchHandler is the informers' event handler: it only records and queues, since
// informer notifications must be processed promptly.
type watchHandler struct {
	w *watcher
	// listing: the registration's initial list is the operator's initial listing.
	listing bool
}

func (h watchHandler) OnAdd(obj any, initial bool) { h.w.notify("ADDED", obj, initial && h.listing) }
func (h watchHandler) OnUpdate(_, obj any)         { h.w.notify("MODIFIED", obj, false) }
func (h watchHandler) OnDelete(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	h.w.notify("DELETED", obj, false)
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
