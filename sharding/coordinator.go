package sharding

import (
	"cmp"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// The coordinator runs on the replica elected for it. It follows the metadata of
// every object of the sharded resources with a client-go Reflector per resource
// and namespace (a list, then a watch; names, labels, annotations: no bodies)
// into a store of its own (objects.go) that keeps, per object, only what it
// decides on: its version, shard label, handover annotation, deletion and
// finalizer count, and the member the last pass planned for it, in a record of
// 40 bytes (member names interned) instead of a copy of the object's metadata
// and a plan beside it. After each change that can matter (debounced) it makes a
// pass: the plan (Plan) of the objects over the live members, kept in the
// records, then for each object away from its planned member one write, queued
// on a client-go work queue:
//   - no member yet, or its member is gone (Lease deleted or expired): the shard
//     label is set to the planned member (and a stale handover annotation
//     removed): nobody else handles it, so no handshake is needed;
//   - its member is live: the handover annotation is set to the planned member;
//     the member releases the object and moves the label itself (member.go). A
//     handover once marked is never called off: it completes, and a later pass
//     moves the object again if the plan changed meanwhile.
//
// Every write carries the resourceVersion the decision was made on (a conflict
// waits for the next pass), so no decision is made on a stale object.

type informerKey struct {
	gvr       schema.GroupVersionResource
	namespace string
	// labels and fields select the objects shared out (the handlers' selection).
	labels, fields string
}

type coordinator struct {
	s     *Sharding
	queue workqueue.TypedRateLimitingInterface[planRef]

	// mu is a leaf lock: it guards stores (the map; each store has its own) and
	// stops (each store's reflector's).
	mu     sync.Mutex
	stores map[informerKey]*objectStore
	stops  map[informerKey]context.CancelFunc

	lastMembers    []string
	rebalanceSince time.Time
	// items is a pass's, reused by the next (one goroutine passes): 40 bytes an
	// object.
	items []planItem
}

// planRef names one object by its store and its key in the store
// (namespace/name): what the coordinator queues for a write.
type planRef struct {
	inf informerKey
	key string
}

func (r planRef) String() string { return r.inf.gvr.Resource + " " + r.key }

func newCoordinator(s *Sharding) *coordinator {
	return &coordinator{s: s, stores: map[informerKey]*objectStore{}, stops: map[informerKey]context.CancelFunc{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[planRef](50*time.Millisecond, 5*time.Second),
			workqueue.TypedRateLimitingQueueConfig[planRef]{Clock: s.clock})}
}

func (c *coordinator) run(ctx context.Context) {
	var workers sync.WaitGroup
	defer workers.Wait() // after the shutdown below (deferred calls run last first)
	defer c.queue.ShutDown()
	for range c.s.opts.AssignWorkers {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for c.writeNext(ctx) {
			}
		}()
	}
	wake := c.s.coordinatorWake
	poke(wake)
	var next <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-wake:
		case <-next:
		}
		// Gather the changes of a burst into one pass.
		select {
		case <-ctx.Done():
			return
		case <-c.s.clock.After(c.s.opts.Debounce):
		}
		c.startWatches(ctx)
		again := c.pass()
		next = nil
		if again > 0 {
			next = c.s.clock.After(again)
		}
	}
}

// startWatches starts a Reflector and its store per resource and namespace that
// the Reactor watches by label (filtered resources are not labelled).
func (c *coordinator) startWatches(ctx context.Context) {
	s := c.s
	s.mu.Lock()
	var want []informerKey
	for _, r := range s.resources {
		if r.filtered {
			continue
		}
		for _, ns := range r.namespaces {
			want = append(want, informerKey{gvr: r.gvr, namespace: ns, labels: r.labels, fields: r.fields})
		}
	}
	s.mu.Unlock()
	c.stopUnwanted(want)
	for _, k := range want {
		c.mu.Lock()
		_, running := c.stores[k]
		c.mu.Unlock()
		if running {
			continue
		}
		// The store wakes a pass only on what can change the plan: an object
		// coming or going, its label or handover mark changing, its deletion
		// starting, its finalizers (status writes of the handlers change none).
		store := newObjectStore(s.label, s.handover, func() { poke(s.coordinatorWake) })
		rctx, stop := context.WithCancel(ctx)
		go c.reflector(k, store).RunWithContext(rctx)
		c.mu.Lock()
		c.stores[k] = store
		c.stops[k] = stop
		c.mu.Unlock()
		s.log.Info("assigning objects to the shard members", "resource", k.gvr.String(), "namespace", k.namespace)
	}
}

// reflector lists and watches the metadata of k's objects into store, as a
// metadata informer would (the same requests, a watch-list stream where the
// server serves one), without the informer's queue and indexer.
func (c *coordinator) reflector(k informerKey, store *objectStore) *cache.Reflector {
	objects := c.s.meta.Resource(k.gvr).Namespace(k.namespace)
	lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector, o.FieldSelector = k.labels, k.fields
			return objects.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector, o.FieldSelector = k.labels, k.fields
			return objects.Watch(ctx, o)
		},
	}, c.s.meta)
	return cache.NewReflectorWithOptions(lw, &metav1.PartialObjectMetadata{}, store, cache.ReflectorOptions{
		Name: "shard coordinator " + k.gvr.String() + " " + k.namespace})
}

// pass plans and queues the writes; it returns when to pass again without a
// change (a member's lease expiring, stores still listing), 0 for never. It
// copies no object: it reads the stores into the reused items (their keys are
// the stores' strings) and writes the plan into the records.
func (c *coordinator) pass() time.Duration {
	s := c.s
	keys, stores := c.sortedStores()
	for _, st := range stores {
		if !st.hasSynced() {
			return 100 * time.Millisecond // a plan of part of the objects would move objects for nothing
		}
	}
	now := s.clock.Now()
	members, nextExpiry := s.ms.live(now)
	ring := NewRing(members, s.opts.VirtualNodes)
	names := make([]name, ring.Len()) // the ring's members, by index
	index := make(map[name]int32, ring.Len())
	for i, m := range ring.members {
		names[i] = nameOf(m)
		index[names[i]] = int32(i)
	}
	c.gather(keys, stores, index)
	assign(ring, c.items, s.opts.Tolerance)
	pending := 0
	for _, it := range c.items {
		planned := name{}
		if it.member >= 0 {
			planned = names[it.member]
		}
		st := stores[it.at]
		st.mu.Lock()
		r, ok := st.objects[it.tie]
		if ok {
			r.planned = planned
			st.objects[it.tie] = r
		}
		st.mu.Unlock()
		// Decided on the record as it is now (a change since gather woke the
		// next pass; writeNext decides on the newest anyway).
		_, labelLive := index[r.label]
		switch {
		case !ok || planned == (name{}): // deleted since gather, or no member live
		case r.handover != (name{}):
			pending++
			if !labelLive {
				c.queue.Add(planRef{keys[it.at], it.tie}) // its member left before releasing it
			}
		case r.label != planned:
			pending++
			c.queue.Add(planRef{keys[it.at], it.tie})
		}
	}
	c.noteRebalance(now, members, len(c.items), pending)
	if !nextExpiry.IsZero() {
		return nextExpiry.Sub(now) + time.Millisecond
	}
	return 0
}

// stopUnwanted stops the stores no longer wanted (a reload changed a resource's
// selection): their objects are no longer shared out.
func (c *coordinator) stopUnwanted(want []informerKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, stop := range c.stops {
		if !slices.Contains(want, k) {
			stop()
			delete(c.stops, k)
			delete(c.stores, k)
		}
	}
}

// sortedStores are the stores, in one order (so a pass's order of the objects,
// and the plan's tie-breaks, do not depend on a map's).
func (c *coordinator) sortedStores() ([]informerKey, []*objectStore) {
	c.mu.Lock()
	defer c.mu.Unlock()
	keys := make([]informerKey, 0, len(c.stores))
	for k := range c.stores {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b informerKey) int {
		return cmp.Or(strings.Compare(a.gvr.String(), b.gvr.String()), strings.Compare(a.namespace, b.namespace))
	})
	stores := make([]*objectStore, len(keys))
	for i, k := range keys {
		stores[i] = c.stores[k]
	}
	return keys, stores
}

// gather fills items with the objects of the stores (those being deleted
// without a finalizer left out, and their plan cleared): the key is the
// store's, the hash is computed without building a key, the current member is
// an index in the ring (index). Ties of two objects' hashes are broken by their
// store keys (of two resources with the same namespace and name, by the order
// of the stores: hashes of 64 bits make it moot).
func (c *coordinator) gather(keys []informerKey, stores []*objectStore, index map[name]int32) {
	c.items = c.items[:0]
	for i, st := range stores {
		gvr := keys[i].gvr
		st.mu.Lock()
		for key, r := range st.objects {
			if r.gone() {
				if r.planned != (name{}) {
					r.planned = name{}
					st.objects[key] = r
				}
				continue
			}
			current := r.label
			if r.handover != (name{}) {
				current = r.handover // committed: it goes there
			}
			if current == (name{}) {
				// Labelled by an earlier pass (or about to be) but not seen so yet:
				// the store lags the coordinator's own writes in a storm of
				// creates. It counts at the member it was given; planned anew,
				// with the new objects and a larger bound, it could land elsewhere,
				// and the written label would then put its member over the bound:
				// objects would move with no member coming or going.
				current = r.planned
			}
			at, on := index[current]
			if !on {
				at = -1
			}
			namespace, objName := splitKey(key)
			c.items = append(c.items, planItem{hash: hashParts(gvr.Group, gvr.Resource, namespace, objName),
				tie: key, current: at, at: int32(i)})
		}
		st.mu.Unlock()
	}
}

// splitKey is cache.SplitMetaNamespaceKey for a key of the store (no error, no
// allocation).
func splitKey(key string) (namespace, name string) {
	if ns, n, found := strings.Cut(key, "/"); found {
		return ns, n
	}
	return "", key
}

// noteRebalance logs a change of the members and, once every object is with
// its member, how long the rebalance took (and tells the Observer).
func (c *coordinator) noteRebalance(now time.Time, members []string, objects, pending int) {
	s := c.s
	if !equalStrings(members, c.lastMembers) {
		if c.lastMembers != nil || objects > 0 {
			if c.rebalanceSince.IsZero() {
				c.rebalanceSince = now
			}
			s.log.Info("shard members changed: rebalancing", "members", strings.Join(members, ","), "objects", objects, "moves", pending)
		}
		c.lastMembers = members
	}
	if pending == 0 && !c.rebalanceSince.IsZero() {
		took := now.Sub(c.rebalanceSince)
		c.rebalanceSince = time.Time{}
		s.log.Info("rebalanced: every object is with its member", "members", len(members), "objects", objects, "took", took.Round(time.Millisecond))
		if s.opts.Observer != nil {
			s.opts.Observer.ShardRebalanced(took)
		}
	}
}

// writeNext makes the write one object needs now, decided on the store's
// newest record of it (the newest plan included).
func (c *coordinator) writeNext(ctx context.Context) bool {
	ref, shutdown := c.queue.Get()
	if shutdown {
		return false
	}
	defer c.queue.Done(ref)
	s := c.s
	c.mu.Lock()
	store := c.stores[ref.inf]
	c.mu.Unlock()
	var r record
	var version string
	exists := false
	if store != nil {
		r, version, exists = store.get(ref.key)
	}
	want := r.planned.String()
	members, _ := s.ms.live(s.clock.Now())
	live := func(member string) bool {
		for _, x := range members {
			if x == member {
				return true
			}
		}
		return false
	}
	if !exists || want == "" || !live(want) {
		// Gone, unplanned, or planned for a member whose Lease expired since the
		// pass (a long queue after a kill): the expiry's pass plans it again.
		c.queue.Forget(ref)
		return true
	}
	label, handover := r.label.String(), r.handover.String()
	var meta map[string]any
	var kind string
	switch {
	case handover != "" && live(label):
		c.queue.Forget(ref)
		return true // its member is handing it over
	case handover != "" || label == "" || !live(label):
		// Unassigned, or its member is gone: nobody handles it now.
		if label == want && handover == "" {
			c.queue.Forget(ref)
			return true
		}
		meta = map[string]any{"labels": map[string]any{s.label: want}, "annotations": map[string]any{s.handover: nil}}
		kind = "assigned"
		if label != "" {
			kind = "reassigned"
		}
	case label != want:
		meta = map[string]any{"annotations": map[string]any{s.handover: want}}
		kind = "marked"
	default:
		c.queue.Forget(ref)
		return true
	}
	meta["resourceVersion"] = version
	patch, _ := json.Marshal(map[string]any{"metadata": meta})
	namespace, objName := splitKey(ref.key)
	_, err := s.meta.Resource(ref.inf.gvr).Namespace(namespace).Patch(ctx, objName, types.MergePatchType, patch, metav1.PatchOptions{})
	switch {
	case err == nil:
		c.queue.Forget(ref)
		if s.opts.Observer != nil && kind != "assigned" {
			s.opts.Observer.ShardHandover(kind)
		}
	case apierrors.IsNotFound(err):
		c.queue.Forget(ref) // deleted meanwhile
	case apierrors.IsConflict(err):
		// Changed since the store's copy: decided again on the newer one, after
		// a short backoff. Not left to the change's event: a change of its
		// version only (a handler's status write) wakes no pass, and the store
		// may not have seen the coordinator's own last write yet.
		c.queue.AddRateLimited(ref)
	default:
		if ctx.Err() == nil {
			s.log.Warn("could not assign an object to its shard member; retrying", "object", ref.String(), "member", want, "error", err)
			c.queue.AddRateLimited(ref)
		}
	}
	return true
}
