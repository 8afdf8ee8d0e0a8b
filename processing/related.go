package processing

// Related objects: a handler of a parent resource that names related resources
// (causes.Spec.Related: owned, labelled or mapped objects) runs, with the parent's
// cause machinery, when one of them is created, changed or deleted.
//
// The parts, each with one owner:
//   - relatedWatch: one informer per related resource and label selector (a
//     labelled relation watches only the objects carrying its label), however
//     many handlers and relations name it. Its notifications are mapped to parent
//     keys at once (owned and labelled by handling's rules, mapped by the scripts'
//     function through RelatedMapper) and recorded as triggers.
//   - relatedInbox: the triggers waiting for their parent's worker, per parent and
//     handler, coalesced per related object (a burst of 100 changes of one
//     parent's children is one run with 100 entries in ctx.related). A leaf lock.
//   - the parent's cycle (process.go, handleRelated): when the parent has no
//     cause of its own, its pending triggers become a Related cause, run by the
//     same machinery as every change cause (selection, filters, lifecycle,
//     retries and backoff, progress persisted on the parent). A handler's triggers
//     are consumed only once an attempt of it finished (succeeded or failed for
//     good) and the write that recorded it succeeded; what arrived meanwhile stays
//     for its next run. At least once per observed change, never per event.
//
// This is the minimal informer layer related objects need; it is kept apart
// (related watches are not the parents' watchers) so that it folds onto a shared
// informer cache when there is one.

import (
	"context"
	"github.com/luaop/luaop/caching"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"github.com/luaop/luaop/handling"
	"github.com/luaop/luaop/processing/causes"
)

// RelatedMapper is what a Handlers implementation offers for mapped relations
// (causes.RelationMapped): the scripts' function of a relation, run on one related
// object (call.Cause is handling.ForObject of it, call.Handler the parent's
// handler). Without it, mapped relations trigger nothing (the load says so).
type RelatedMapper interface {
	MapRelated(ctx context.Context, call causes.Call, relation int) ([]causes.ObjectRef, error)
}

// relations is the Reactor's part for related objects.
type relations struct {
	inbox relatedInbox
	// mu guards the maps below: a leaf lock.
	mu sync.Mutex
	// aliases resolves related resources as the scripts spell them; pending are
	// those being resolved (in the background until they exist).
	aliases map[causes.Resource]*resourceInfo
	pending map[causes.Resource]bool
	watches map[relatedWatchKey]*relatedWatch
	version int // bumped at every new alias
	index   atomic.Pointer[relatedIndex]
}

// relatedWatchKey names one related watch: a canonical resource and the label
// selector of the watch ("" for every object).
type relatedWatchKey struct {
	resource causes.Resource
	selector string
}

// relationRef is one relation of one handler, resolved: the watch that serves it,
// and the parent resource.
type relationRef struct {
	spec     causes.Spec
	relation int // index in spec.Related
	parent   causes.Resource
	rules    handling.ParentResource
}

// relatedIndex is the relations of the current handler set by watch, rebuilt
// after a reload or a newly resolved resource (as specIndex).
type relatedIndex struct {
	source          []causes.Spec
	version, parent int // relations.version and resources.version it was built with
	byWatch         map[relatedWatchKey][]relationRef
}

func newRelations() *relations {
	return &relations{aliases: map[causes.Resource]*resourceInfo{}, pending: map[causes.Resource]bool{},
		watches: map[relatedWatchKey]*relatedWatch{}, inbox: relatedInbox{parents: map[objectKey]map[string]*relatedPending{}}}
}

// selectorOf is the label selector of the watch that serves a relation: a
// labelled relation needs only the objects carrying its label.
func selectorOf(rel causes.Relation) string {
	if rel.Kind == causes.RelationLabelled {
		return rel.Label
	}
	return ""
}

// refreshRelated resolves the related resources of specs not seen before and
// starts the watches they need; a resource the server does not serve yet (a CRD
// installed later) is retried in the background, as the parents' are.
func (o *Reactor) refreshRelated(ctx context.Context, specs []causes.Spec) {
	r := o.relations
	var fresh []causes.Resource
	r.mu.Lock()
	for _, s := range specs {
		for _, rel := range s.Related {
			if _, ok := r.aliases[rel.Resource]; ok || r.pending[rel.Resource] {
				continue
			}
			r.pending[rel.Resource] = true
			fresh = append(fresh, rel.Resource)
		}
	}
	r.mu.Unlock()
	for _, spelling := range fresh {
		o.res.goRun(func() {
			info, err := o.discover(ctx, spelling)
			if err != nil {
				return // ctx cancelled
			}
			r.mu.Lock()
			delete(r.pending, spelling)
			r.aliases[spelling] = info
			r.version++
			r.mu.Unlock()
			o.startRelatedWatches(ctx)
		})
	}
	o.startRelatedWatches(ctx)
}

// startRelatedWatches starts the watches the current handlers' resolved relations
// need and that do not run yet. Watches no handler needs any more keep running (a
// later reload may need them); their notifications trigger nothing.
func (o *Reactor) startRelatedWatches(ctx context.Context) {
	r := o.relations
	var start []*relatedWatch
	r.mu.Lock()
	for _, s := range o.handlers.Specs() {
		for _, rel := range s.Related {
			info := r.aliases[rel.Resource]
			if info == nil {
				continue
			}
			key := relatedWatchKey{resource: causes.Resource{GroupVersionResource: info.gvr}, selector: selectorOf(rel)}
			if r.watches[key] == nil {
				w := &relatedWatch{op: o, key: key, info: info}
				r.watches[key] = w
				start = append(start, w)
			}
		}
	}
	r.mu.Unlock()
	for _, w := range start {
		o.res.goRun(func() { w.run(ctx) })
	}
}

// goRun runs fn in a goroutine that Start waits for, unless the Reactor is
// stopping (then fn does not run).
func (r *resources) goRun(fn func()) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.running.Add(1)
	r.mu.Unlock()
	go func() {
		defer r.running.Done()
		fn()
	}()
}

// relatedSynced tells whether every related watch finished its initial listing.
func (o *Reactor) relatedSynced() bool {
	r := o.relations
	r.mu.Lock()
	pending := len(r.pending) > 0
	watches := make([]*relatedWatch, 0, len(r.watches))
	for _, w := range r.watches {
		watches = append(watches, w)
	}
	r.mu.Unlock()
	if pending {
		return false
	}
	for _, w := range watches {
		if !w.synced() {
			return false
		}
	}
	return true
}

// relatedIndex returns the relations of the current handler set by watch.
func (o *Reactor) relatedIndex() *relatedIndex {
	source := o.handlers.Specs()
	r := o.relations
	r.mu.Lock()
	version := r.version
	r.mu.Unlock()
	o.res.mu.Lock()
	parentVersion := o.res.version
	o.res.mu.Unlock()
	if idx := r.index.Load(); idx != nil && idx.version == version && idx.parent == parentVersion && sameSlice(idx.source, source) {
		return idx
	}
	r.mu.Lock()
	aliases := make(map[causes.Resource]*resourceInfo, len(r.aliases))
	for k, v := range r.aliases {
		aliases[k] = v
	}
	r.mu.Unlock()
	o.res.mu.Lock()
	parents := make(map[causes.Resource]causes.Resource, len(o.res.aliases))
	for k, v := range o.res.aliases {
		parents[k] = v
	}
	o.res.mu.Unlock()
	idx := &relatedIndex{source: source, version: version, parent: parentVersion, byWatch: map[relatedWatchKey][]relationRef{}}
	for _, s := range source {
		parent, ok := parents[s.Resource]
		if !ok || len(s.Related) == 0 {
			continue
		}
		pinfo := o.resourceInfo(parent)
		if pinfo == nil {
			continue
		}
		rules := handling.ParentResource{Group: pinfo.gvr.Group, Kind: pinfo.kind, Namespaced: pinfo.namespaced}
		for i, rel := range s.Related {
			info := aliases[rel.Resource]
			if info == nil {
				continue
			}
			key := relatedWatchKey{resource: causes.Resource{GroupVersionResource: info.gvr}, selector: selectorOf(rel)}
			idx.byWatch[key] = append(idx.byWatch[key], relationRef{spec: s, relation: i, parent: parent, rules: rules})
		}
	}
	r.index.Store(idx)
	return idx
}

// relatedWatch runs the informers of one related resource and selector.
type relatedWatch struct {
	op   *Reactor
	key  relatedWatchKey
	info *resourceInfo
	mu   sync.Mutex // leaf lock: guards syncedFn
	// syncedFn tell whether the registrations received their initial listings.
	syncedFn []cache.InformerSynced
	ready    atomic.Bool
}

func (w *relatedWatch) synced() bool {
	if !w.ready.Load() {
		return false
	}
	w.mu.Lock()
	fns := slices.Clone(w.syncedFn)
	w.mu.Unlock()
	for _, f := range fns {
		if !f() {
			return false
		}
	}
	return true
}

func (w *relatedWatch) run(ctx context.Context) {
	o := w.op
	log := o.log.With("related", w.key.resource.String())
	namespaces := []string{metav1.NamespaceAll}
	if w.info.namespaced {
		if exact := o.filter.exactNamespaces(); exact != nil {
			namespaces = exact
		}
	}
	var tweak dynamicinformer.TweakListOptionsFunc
	if w.key.selector != "" {
		tweak = func(lo *metav1.ListOptions) { lo.LabelSelector = w.key.selector }
	}
	var informers []cache.SharedIndexInformer
	for _, ns := range namespaces {
		inf := dynamicinformer.NewFilteredDynamicInformer(o.dynamic, w.info.gvr, ns, 0, cache.Indexers{}, tweak).Informer()
		if err := inf.SetTransform(caching.StripManagedFieldsTransform); err != nil {
			log.Error("cannot watch the related resource", "error", err)
			return
		}
		reg, err := inf.AddEventHandler(w)
		if err != nil {
			log.Error("cannot watch the related resource", "error", err)
			return
		}
		_ = inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
			log.Warn("watch of related objects interrupted; re-listing", "namespace", ns, "error", err)
		})
		informers = append(informers, inf)
		w.mu.Lock()
		w.syncedFn = append(w.syncedFn, reg.HasSynced)
		w.mu.Unlock()
	}
	w.ready.Store(true)
	log.Info("watching related objects", "namespaces", strings.Join(namespacesForLog(namespaces), ","), "labelSelector", w.key.selector)
	var running sync.WaitGroup
	for _, inf := range informers {
		running.Add(1)
		go func() { defer running.Done(); inf.RunWithContext(ctx) }()
	}
	running.Wait()
}

// The related watch is its informers' event handler. Its notifications are mapped
// to parents in the informer's own goroutine (a mapped relation's function runs
// there, under its handler deadline): the informer buffers what arrives
// meanwhile, and only related notifications wait for it.

func (w *relatedWatch) OnAdd(obj any, _ bool) { w.op.relate(w, "ADDED", nil, asObject(obj)) }
func (w *relatedWatch) OnUpdate(old, obj any) {
	w.op.relate(w, "MODIFIED", asObject(old), asObject(obj))
}
func (w *relatedWatch) OnDelete(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	w.op.relate(w, "DELETED", asObject(obj), nil)
}

func asObject(obj any) *unstructured.Unstructured {
	u, _ := obj.(*unstructured.Unstructured)
	return u
}

// relate records the triggers of one notification of a related object: for every
// relation the watch serves, the parents it relates the object to, before the
// change and after it (an object that moves from one parent to another triggers
// both, as controller-runtime's handlers map the old and the new object).
func (o *Reactor) relate(w *relatedWatch, eventType string, old, obj *unstructured.Unstructured) {
	latest := obj
	if latest == nil {
		latest = old
	}
	if latest == nil || o.stopping.Load() || o.pause.pausedNow.Load() {
		// While paused, related changes are the working peer's, as raw events are.
		return
	}
	if ns := latest.GetNamespace(); ns != "" && !o.filter.allows(ns) {
		return
	}
	refs := o.relatedIndex().byWatch[w.key]
	if len(refs) == 0 {
		return
	}
	change := causes.RelatedChange{Resource: w.key.resource, Kind: latest.GetKind(), Namespace: latest.GetNamespace(),
		Name: latest.GetName(), Type: eventType, Object: latest.Object}
	if eventType == "MODIFIED" && old != nil {
		change.Old = old.Object
	} else if eventType == "DELETED" {
		change.Object, change.Old = latest.Object, latest.Object
	}
	for _, ref := range refs {
		parents := map[causes.ObjectRef]bool{}
		for _, state := range []*unstructured.Unstructured{old, obj} {
			if state == nil {
				continue
			}
			for _, p := range o.parentsOf(ref, state) {
				parents[p] = true
			}
		}
		change.Relation = ref.spec.Related[ref.relation].Kind
		for p := range parents {
			o.trigger(objectKey{resource: ref.parent, namespace: p.Namespace, name: p.Name}, ref.spec.ID, change)
		}
	}
}

// parentsOf are the parents one state of a related object names through ref.
func (o *Reactor) parentsOf(ref relationRef, obj *unstructured.Unstructured) []causes.ObjectRef {
	rel := ref.spec.Related[ref.relation]
	if rel.Kind != causes.RelationMapped {
		return handling.RelatedParents(rel, ref.rules, obj.Object)
	}
	mapper, ok := o.handlers.(RelatedMapper)
	if !ok {
		return nil
	}
	o.startMu.Lock()
	ctx := o.ctx
	o.startMu.Unlock()
	log := o.log.With("handler", ref.spec.ID, "related", w2s(ref, obj))
	call := causes.Call{Handler: ref.spec, Cause: handling.ForObject(ref.spec.Related[ref.relation].Resource, obj.Object),
		Logger: log, Indexes: o.indexes}
	parents, err := mapper.MapRelated(ctx, call, ref.relation)
	if err != nil {
		// controller-runtime's map functions cannot fail; a script's can: the
		// notification triggers nothing through this relation, and says so.
		log.Error("the mapping function of a related resource failed; this change triggers nothing through it", "error", err)
		return nil
	}
	return handling.MappedParents(parents, ref.rules.Namespaced, obj.Object)
}

// w2s names a related object in the log.
func w2s(ref relationRef, obj *unstructured.Unstructured) string {
	name := obj.GetName()
	if ns := obj.GetNamespace(); ns != "" {
		name = ns + "/" + name
	}
	return ref.spec.Related[ref.relation].Resource.String() + " " + name
}

// trigger records a related change for a parent's handler and queues the parent.
// A parent this Reactor does not hold once its resource's initial listing is
// done (gone, another replica's, out of the namespaces served) gets nothing;
// before that, the trigger waits for the listing (sweepRelated).
func (o *Reactor) trigger(parent objectKey, handlerID string, change causes.RelatedChange) {
	if w := o.watcherOf(parent.resource); w != nil && w.synced() && o.objects.get(parent) == nil {
		return
	}
	if ns := parent.namespace; ns != "" && !o.filter.allows(ns) {
		return
	}
	o.relations.inbox.add(parent, handlerID, change)
	o.queue.Add(parent)
}

// sweepRelated drops the triggers of the parents of resource that its initial
// listing did not bring (they were recorded before it ended).
func (o *Reactor) sweepRelated(resource causes.Resource) {
	o.relations.inbox.dropUnless(resource, func(key objectKey) bool { return o.objects.get(key) != nil })
}

// relatedInbox holds the triggers waiting for their parents' workers. Its lock is
// a leaf: held to copy or swap entries only.
type relatedInbox struct {
	mu  sync.Mutex
	seq uint64
	// parents maps a parent to its handlers' pending changes (by handler id).
	parents map[objectKey]map[string]*relatedPending
}

// relatedObject names one related object.
type relatedObject struct {
	resource        causes.Resource
	namespace, name string
}

// relatedPending are one handler's pending changes of one parent, one per related
// object, in the order they were first seen.
type relatedPending struct {
	order   []relatedObject
	changes map[relatedObject]*relatedEntry
}

type relatedEntry struct {
	change causes.RelatedChange
	seq    uint64 // of its newest notification
}

// relatedTaken is what a cycle took of one handler's pending changes: the changes
// given to the handler and the versions (seq) to consume once it finished.
type relatedTaken struct {
	changes []causes.RelatedChange
	seqs    map[relatedObject]uint64
}

// add coalesces a change into what is pending for the parent's handler.
func (in *relatedInbox) add(parent objectKey, handlerID string, change causes.RelatedChange) {
	k := relatedObject{resource: change.Resource, namespace: change.Namespace, name: change.Name}
	in.mu.Lock()
	defer in.mu.Unlock()
	in.seq++
	byHandler := in.parents[parent]
	if byHandler == nil {
		byHandler = map[string]*relatedPending{}
		in.parents[parent] = byHandler
	}
	p := byHandler[handlerID]
	if p == nil {
		p = &relatedPending{changes: map[relatedObject]*relatedEntry{}}
		byHandler[handlerID] = p
	}
	e := p.changes[k]
	if e == nil {
		p.order = append(p.order, k)
		p.changes[k] = &relatedEntry{change: change, seq: in.seq}
		return
	}
	e.change = coalesce(e.change, change)
	e.seq = in.seq
}

// coalesce merges a newer change of one related object into the pending one: the
// newest event's type and state, the state before the first (an object added and
// then modified is still new to the handler).
func coalesce(pending, newer causes.RelatedChange) causes.RelatedChange {
	out := newer
	out.Old = pending.Old
	if pending.Type == "ADDED" && newer.Type == "MODIFIED" {
		out.Type = "ADDED"
	}
	return out
}

// take copies the pending changes of a parent, by handler.
func (in *relatedInbox) take(parent objectKey) map[string]relatedTaken {
	in.mu.Lock()
	defer in.mu.Unlock()
	byHandler := in.parents[parent]
	if len(byHandler) == 0 {
		return nil
	}
	out := make(map[string]relatedTaken, len(byHandler))
	for id, p := range byHandler {
		t := relatedTaken{changes: make([]causes.RelatedChange, 0, len(p.order)), seqs: make(map[relatedObject]uint64, len(p.order))}
		for _, k := range p.order {
			e := p.changes[k]
			t.changes = append(t.changes, e.change)
			t.seqs[k] = e.seq
		}
		out[id] = t
	}
	return out
}

// consume removes the changes a handler was given, unless a newer notification
// of the same object arrived since (it stays for the handler's next run).
func (in *relatedInbox) consume(parent objectKey, handlerID string, taken relatedTaken) {
	in.mu.Lock()
	defer in.mu.Unlock()
	p := in.parents[parent][handlerID]
	if p == nil {
		return
	}
	for k, seq := range taken.seqs {
		if e := p.changes[k]; e != nil && e.seq == seq {
			delete(p.changes, k)
		}
	}
	kept := p.order[:0]
	for _, k := range p.order {
		if p.changes[k] != nil {
			kept = append(kept, k)
		}
	}
	p.order = kept
	if len(kept) == 0 {
		in.dropLocked(parent, handlerID)
	}
}

// drop removes what is pending for a parent's handler (nil handler ids: all).
func (in *relatedInbox) drop(parent objectKey, handlerIDs ...string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if len(handlerIDs) == 0 {
		delete(in.parents, parent)
		return
	}
	for _, id := range handlerIDs {
		in.dropLocked(parent, id)
	}
}

func (in *relatedInbox) dropLocked(parent objectKey, handlerID string) {
	delete(in.parents[parent], handlerID)
	if len(in.parents[parent]) == 0 {
		delete(in.parents, parent)
	}
}

// has tells whether anything is pending for a parent.
func (in *relatedInbox) has(parent objectKey) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.parents[parent]) > 0
}

// dropUnless drops the parents of resource that keep says not to keep.
func (in *relatedInbox) dropUnless(resource causes.Resource, keep func(objectKey) bool) {
	in.mu.Lock()
	var keys []objectKey
	for k := range in.parents {
		if k.resource == resource {
			keys = append(keys, k)
		}
	}
	in.mu.Unlock()
	for _, k := range keys {
		if !keep(k) { // outside the lock: keep takes the object table's
			in.drop(k)
		}
	}
}

// onlyRelated tells whether a change handler serves related changes only: it
// takes no part in deciding whether an object gets a diff-base (prematched), as
// nothing of the object itself is its business.
func onlyRelated(spec causes.Spec) bool {
	return len(spec.Reasons) == 1 && spec.Reasons[0] == causes.Related
}

// handleRelated runs the handlers that have related changes pending for the
// object, as a Related cause: the cycle found nothing of the object itself to
// handle (its own causes come first, one cause at a time). Triggers of handlers
// no longer registered (a reload) are dropped.
func (c *cycle) handleRelated(ctx context.Context, base causes.Cause, facts objectFacts) (time.Duration, error) {
	inbox := &c.op.relations.inbox
	taken := inbox.take(c.key)
	for id := range taken {
		if !slices.ContainsFunc(c.specs, func(s causes.Spec) bool { return s.ID == id && s.Serves(causes.Related) }) {
			inbox.drop(c.key, id)
			delete(taken, id)
		}
	}
	if len(taken) == 0 {
		return 0, nil
	}
	c.related = taken
	requeue, err := c.handle(ctx, handling.ForRelated(c.key.resource, c.body.Object, base.New, nil), facts)
	if err == nil {
		c.consumeRelated()
	}
	return requeue, err
}

// relatedOf is what a handler of a Related cause is given: its changes taken by
// this cycle; false when it has none (it takes no part).
func (c *cycle) relatedOf(spec causes.Spec) ([]causes.RelatedChange, bool) {
	t, ok := c.related[spec.ID]
	return t.changes, ok && len(t.changes) > 0
}

// consumeRelated removes the changes given to the handlers whose attempt in this
// cycle finished (succeeded, or failed for good), now that the write recording it
// is done; a handler that will try again keeps them, with what arrives meanwhile.
func (c *cycle) consumeRelated() {
	for _, id := range c.relatedFinished {
		if t, ok := c.related[id]; ok {
			c.op.relations.inbox.consume(c.key, id, t)
		}
	}
}

// followRelated gives the object another cycle when a cause completed in this
// one and related changes are still pending (arrived meanwhile, or for handlers
// that had finished before them): they become the next cause.
func (c *cycle) followRelated() {
	if c.causeCompleted && c.op.relations.inbox.has(c.key) {
		c.op.queue.Add(c.key)
	}
}

// dropRelatedOfUnknown drops the triggers of a key the Reactor does not hold,
// once its resource's initial listing is done (before, the parent may still come).
func (o *Reactor) dropRelatedOfUnknown(key objectKey) {
	if w := o.watcherOf(key.resource); w != nil && w.synced() {
		o.relations.inbox.drop(key)
	}
}
