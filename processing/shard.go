package processing

import (
	"context"
	"errors"
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/luaop/luaop/caching"
	"github.com/luaop/luaop/processing/causes"
)

// Shard limits a Reactor to its share of the objects when several replicas split
// them (sharding.Member implements it). The Reactor only asks; what the share is,
// and how objects move between replicas, is the implementation's.
type Shard interface {
	// Watching is told, before the watch of resource starts and again when the
	// handlers' selection changes (a reload), which namespaces it watches ("" is
	// every namespace) and the handlers' selection there (the server-side label and
	// field selectors: only those objects are shared out); it returns the label
	// selector of this replica's share ("": every object, then filtered by Admits).
	// Called from the watcher's goroutine: it may call the API.
	Watching(ctx context.Context, resource schema.GroupVersionResource, namespaces []string, selection caching.Selection) (labelSelector string)
	// Admits tells whether a watch notification (eventType ADDED, MODIFIED or
	// DELETED) is for this replica to handle; a notification it refuses is
	// dropped as if it never came. Called from informer goroutines for every
	// notification: it must return quickly.
	Admits(resource schema.GroupVersionResource, eventType string, obj *unstructured.Unstructured) bool
}

// releases are the objects a caller of Release waits for: the key's worker
// releases the object at its next cycle and closes the channel. A leaf lock.
type releases struct {
	mu      sync.Mutex
	waiting map[objectKey]chan struct{}
}

func (r *releases) request(key objectKey) chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.waiting == nil {
		r.waiting = map[objectKey]chan struct{}{}
	}
	done, ok := r.waiting[key]
	if !ok {
		done = make(chan struct{})
		r.waiting[key] = done
	}
	return done
}

// take returns the request for key, if any, and removes it.
func (r *releases) take(key objectKey) (chan struct{}, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	done, ok := r.waiting[key]
	if ok {
		delete(r.waiting, key)
	}
	return done, ok
}

// Release hands one object away from this Reactor (its Shard moves it to another
// replica): the cycle in flight, if any, finishes (its patch written); then the
// object's daemons are asked to stop (each within its cancellation timeout, as on
// deletion, but the finalizer stays: the object lives on), its timers end with
// its memory, its index entries are dropped, and Release returns once its daemons
// have exited and its memo is forgotten. No handler of the object runs after that
// here, unless a later watch notification admitted by the Shard brings it back
// (the Shard refuses them meanwhile). Progress and the diff-base are on the
// object: whoever handles it next resumes where this Reactor stopped. An object
// not known (never seen, or gone) is released at once. It returns ctx's error if
// ctx ends first (the release still completes in the background).
func (o *Reactor) Release(ctx context.Context, resource schema.GroupVersionResource, namespace, name string) error {
	key := objectKey{resource: causes.Resource{GroupVersionResource: resource}, namespace: namespace, name: name}
	done := o.rel.request(key)
	o.startMu.Lock()
	started := o.ctx != nil
	o.startMu.Unlock()
	if o.stopping.Load() {
		// The workers take no new key: the object stays this replica's until it
		// is gone (the other replicas take its objects when it left).
		o.rel.take(key)
		return errors.New("the operator is stopping")
	}
	if !started {
		// No worker runs yet: nothing is in flight, nothing to wait for.
		if d, ok := o.rel.take(key); ok {
			o.releaseNow(key, d)
		}
		return nil
	}
	o.queue.Add(key)
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// releaseIfRequested is the worker's side of Release, first thing in a cycle: true
// when the object was released (the cycle ends there).
func (o *Reactor) releaseIfRequested(key objectKey) bool {
	done, ok := o.rel.take(key)
	if !ok {
		return false
	}
	o.releaseNow(key, done)
	return true
}

// releaseNow forgets the object as a deletion would, but stops its daemons
// gracefully (the object still exists: they get their stop flag and cancellation
// timeout), then closes done once they exited and the memo is forgotten. Called by
// the worker holding the key (or before any worker runs).
func (o *Reactor) releaseNow(key objectKey, done chan struct{}) {
	o.objects.mu.Lock()
	st := o.objects.objects[key]
	delete(o.objects.objects, key)
	o.objects.mu.Unlock()
	o.board.forget(key)
	if o.ready.forget(key) {
		o.wakeIndexWaiters()
	}
	if st == nil || st.mem.uid == "" {
		close(done)
		return
	}
	mem := &st.mem
	o.indexes.Remove(key.String())
	exiting := make([]*daemonRun, 0, len(mem.daemons))
	for _, d := range mem.daemons {
		d.stop(d.spec.CancellationBackoff, cancellationTimeout(*d.spec))
		exiting = append(exiting, d)
	}
	uid := mem.uid
	*mem = objectMemory{}
	o.forgetting.Add(1)
	go func() {
		defer o.forgetting.Done()
		for _, d := range exiting {
			<-d.done
		}
		o.handlers.Forget(uid)
		close(done)
	}()
}

// Revisit offers every object the watch of resource holds to the Shard again
// (without raw events: nothing happened to them), for those it admits now and did
// not before: a Shard that filters after the watch calls it when its share
// changed.
func (o *Reactor) Revisit(resource schema.GroupVersionResource) {
	w := o.watcherOf(causes.Resource{GroupVersionResource: resource})
	o.startMu.Lock()
	started := o.ctx != nil
	o.startMu.Unlock()
	if w == nil || !started || o.opts.Shard == nil {
		return
	}
	for _, inf := range w.informersSnapshot() {
		for _, obj := range inf.GetStore().List() {
			u, ok := obj.(*unstructured.Unstructured)
			if !ok || (u.GetNamespace() != "" && !o.filter.allows(u.GetNamespace())) {
				continue
			}
			key := objectKey{resource: w.resource, namespace: u.GetNamespace(), name: u.GetName()}
			if o.objects.get(key) != nil || !o.opts.Shard.Admits(w.info.gvr, "MODIFIED", u) {
				continue
			}
			o.objects.record(key, "MODIFIED", u, false, false)
			o.queueNewcomer(key)
		}
	}
}

// queueNewcomer queues an object new to this Reactor after its initial listing:
// sharded, in the front lane of the queue (laneFIFO says why; in sharded mode it
// came from another replica, or was just created and assigned here), else as any
// key. The mark is set before the Add and its lock released: the queue's storage
// takes it under the queue's lock.
func (o *Reactor) queueNewcomer(key objectKey) {
	if o.front != nil {
		o.front.mark(key)
	}
	o.queue.Add(key)
}
