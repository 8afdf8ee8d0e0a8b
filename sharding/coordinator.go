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
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// The coordinator runs on the replica elected for it. It watches the metadata of
// every object of the sharded resources (names, labels, annotations: no bodies),
// and after each change (debounced) makes a pass: the plan (Plan) of the objects
// over the live members, then for each object away from its planned member one
// write, queued on a client-go work queue:
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
}

type coordinator struct {
	s     *Sharding
	queue workqueue.TypedRateLimitingInterface[planRef]

	// mu is a leaf lock: it guards plan and informers.
	mu sync.Mutex
	// plan: per informer, the key of each object in its store -> its member (a
	// string of the ring's). Kept in place from pass to pass.
	plan      map[informerKey]map[string]string
	informers map[informerKey]cache.SharedIndexInformer

	lastMembers    []string
	rebalanceSince time.Time
	// items and seen are a pass's, reused by the next (one goroutine passes).
	items []planItem
	seen  []seenObject
}

// planRef names one object by its informer and its key in the informer's store
// (namespace/name): what the coordinator queues for a write.
type planRef struct {
	inf informerKey
	key string
}

func (r planRef) String() string { return r.inf.gvr.Resource + " " + r.key }

// seenObject is what a pass decides on, of one object: the strings are the
// informer store's own.
type seenObject struct {
	inf             int // index in the pass's sorted informer keys
	key             string
	label, handover string
}

func newCoordinator(s *Sharding) *coordinator {
	return &coordinator{s: s, plan: map[informerKey]map[string]string{}, informers: map[informerKey]cache.SharedIndexInformer{},
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
		c.startInformers(ctx)
		again := c.pass()
		next = nil
		if again > 0 {
			next = c.s.clock.After(again)
		}
	}
}

// startInformers starts a metadata informer per resource and namespace that the
// Reactor watches by label (filtered resources are not labelled).
func (c *coordinator) startInformers(ctx context.Context) {
	s := c.s
	s.mu.Lock()
	var want []informerKey
	for _, r := range s.resources {
		if r.filtered {
			continue
		}
		for _, ns := range r.namespaces {
			want = append(want, informerKey{r.gvr, ns})
		}
	}
	s.mu.Unlock()
	for _, k := range want {
		c.mu.Lock()
		_, running := c.informers[k]
		c.mu.Unlock()
		if running {
			continue
		}
		inf := metadatainformer.NewFilteredMetadataInformer(s.meta, k.gvr, k.namespace, 0, cache.Indexers{}, nil).Informer()
		// The coordinator keeps, of each object, only what it decides on: its
		// name, version, shard label, handover annotation and deletion. The
		// other annotations (with annotation storage, luaop's diff-base: a copy
		// of the object) would cost the coordinator's replica the memory the
		// label selectors save.
		_ = inf.SetTransform(func(obj any) (any, error) {
			if m, ok := obj.(*metav1.PartialObjectMetadata); ok {
				return decisionMetadata(m, s.label, s.handover), nil
			}
			return obj, nil
		})
		// Only what changes the plan wakes it: an object coming or going, its
		// label or handover mark changing, its deletion starting (status writes
		// of the handlers change none of them).
		onChange := func(any) { poke(s.coordinatorWake) }
		_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: onChange, DeleteFunc: onChange,
			UpdateFunc: func(old, cur any) {
				o, ok1 := old.(*metav1.PartialObjectMetadata)
				c, ok2 := cur.(*metav1.PartialObjectMetadata)
				if !ok1 || !ok2 || o.Labels[s.label] != c.Labels[s.label] || o.Annotations[s.handover] != c.Annotations[s.handover] ||
					(o.DeletionTimestamp == nil) != (c.DeletionTimestamp == nil) || len(o.Finalizers) != len(c.Finalizers) {
					onChange(cur)
				}
			}})
		go inf.RunWithContext(ctx)
		c.mu.Lock()
		c.informers[k] = inf
		c.mu.Unlock()
		s.log.Info("assigning objects to the shard members", "resource", k.gvr.String(), "namespace", k.namespace)
	}
}

// pass plans and queues the writes; it returns when to pass again without a
// change (a member's lease expiring, informers still listing), 0 for never. It
// copies no object: it reads the informers' stores into the reused items and
// seen, and updates the plan in place.
func (c *coordinator) pass() time.Duration {
	s := c.s
	keys, informers := c.sortedInformers()
	for _, inf := range informers {
		if !inf.HasSynced() {
			return 100 * time.Millisecond // a plan of part of the objects would move objects for nothing
		}
	}
	now := s.clock.Now()
	members, nextExpiry := s.ms.live(now)
	ring := NewRing(members, s.opts.VirtualNodes)
	c.gather(keys, informers)
	assign(ring, c.items, s.opts.Tolerance)
	c.mu.Lock()
	for _, k := range keys {
		if c.plan[k] == nil {
			c.plan[k] = map[string]string{}
		}
		clear(c.plan[k]) // keeps its buckets: the next plan is mostly the same objects
	}
	for _, it := range c.items {
		o := c.seen[it.at]
		c.plan[keys[o.inf]][o.key] = it.member
	}
	c.mu.Unlock()
	pending := 0
	for _, it := range c.items {
		o := c.seen[it.at]
		switch {
		case it.member == "":
		case o.handover != "":
			pending++
			if !ring.Has(o.label) {
				c.queue.Add(planRef{keys[o.inf], o.key}) // its member left before releasing it
			}
		case o.label != it.member:
			pending++
			c.queue.Add(planRef{keys[o.inf], o.key})
		}
	}
	c.noteRebalance(now, members, len(c.items), pending)
	if !nextExpiry.IsZero() {
		return nextExpiry.Sub(now) + time.Millisecond
	}
	return 0
}

// sortedInformers are the informers, in one order (so a pass's order of the
// objects, and the plan's tie-breaks, do not depend on a map's).
func (c *coordinator) sortedInformers() ([]informerKey, []cache.SharedIndexInformer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	keys := make([]informerKey, 0, len(c.informers))
	for k := range c.informers {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b informerKey) int {
		return cmp.Or(strings.Compare(a.gvr.String(), b.gvr.String()), strings.Compare(a.namespace, b.namespace))
	})
	informers := make([]cache.SharedIndexInformer, len(keys))
	for i, k := range keys {
		informers[i] = c.informers[k]
	}
	return keys, informers
}

// gather fills items and seen with the objects of the informers' stores (those
// being deleted without a finalizer left out): the key, label and handover
// strings are the store's, the hash is computed without building a key. Ties of
// two objects' hashes are broken by their store keys (of two resources with the
// same namespace and name, by the order of the informers: hashes of 64 bits
// make it moot).
func (c *coordinator) gather(keys []informerKey, informers []cache.SharedIndexInformer) {
	s := c.s
	c.items, c.seen = c.items[:0], c.seen[:0]
	for i, inf := range informers {
		store := inf.GetStore()
		for _, key := range store.ListKeys() {
			obj, _, _ := store.GetByKey(key)
			m, ok := obj.(*metav1.PartialObjectMetadata)
			if !ok || m.DeletionTimestamp != nil && len(m.Finalizers) == 0 {
				continue
			}
			label, handover := m.Labels[s.label], m.Annotations[s.handover]
			current := label
			if handover != "" {
				current = handover // committed: it goes there
			}
			c.seen = append(c.seen, seenObject{inf: i, key: key, label: label, handover: handover})
			c.items = append(c.items, planItem{hash: hashParts(keys[i].gvr.Group, keys[i].gvr.Resource, m.Namespace, m.Name),
				tie: key, current: current, at: len(c.seen) - 1})
		}
	}
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

// writeNext makes the write one object needs now, decided on the informer's
// newest copy of it and the newest plan.
func (c *coordinator) writeNext(ctx context.Context) bool {
	ref, shutdown := c.queue.Get()
	if shutdown {
		return false
	}
	defer c.queue.Done(ref)
	s := c.s
	c.mu.Lock()
	want := c.plan[ref.inf][ref.key]
	inf := c.informers[ref.inf]
	c.mu.Unlock()
	if want == "" || inf == nil {
		c.queue.Forget(ref)
		return true
	}
	obj, exists, _ := inf.GetStore().GetByKey(ref.key)
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !exists || !ok {
		c.queue.Forget(ref)
		return true
	}
	members, _ := s.ms.live(s.clock.Now())
	live := func(member string) bool {
		for _, x := range members {
			if x == member {
				return true
			}
		}
		return false
	}
	label, handover := m.Labels[s.label], m.Annotations[s.handover]
	var meta map[string]any
	var kind string
	switch {
	case handover != "" && live(label):
		return true // its member is handing it over
	case handover != "" || label == "" || !live(label):
		// Unassigned, or its member is gone: nobody handles it now.
		if label == want && handover == "" {
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
		return true
	}
	meta["resourceVersion"] = m.ResourceVersion
	patch, _ := json.Marshal(map[string]any{"metadata": meta})
	_, err := s.meta.Resource(ref.inf.gvr).Namespace(m.Namespace).Patch(ctx, m.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	switch {
	case err == nil:
		c.queue.Forget(ref)
		if s.opts.Observer != nil && kind != "assigned" {
			s.opts.Observer.ShardHandover(kind)
		}
	case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
		c.queue.Forget(ref) // changed meanwhile: its event brings another pass
	default:
		if ctx.Err() == nil {
			s.log.Warn("could not assign an object to its shard member; retrying", "object", ref.String(), "member", want, "error", err)
			c.queue.AddRateLimited(ref)
		}
	}
	return true
}

// decisionMetadata is what the coordinator keeps of an object: a new
// PartialObjectMetadata with its name, namespace, version, shard label,
// handover annotation, finalizers and deletion only (the UID, the times, the
// type and the rest of the decoded object are left to the collector).
func decisionMetadata(m *metav1.PartialObjectMetadata, label, handover string) *metav1.PartialObjectMetadata {
	return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, ResourceVersion: m.ResourceVersion,
		Labels: onlyKey(m.Labels, label), Annotations: onlyKey(m.Annotations, handover),
		Finalizers: m.Finalizers, DeletionTimestamp: m.DeletionTimestamp,
	}}
}

// onlyKey is m with key alone (nil without it).
func onlyKey(m map[string]string, key string) map[string]string {
	v, ok := m[key]
	if !ok {
		return nil
	}
	return map[string]string{key: v}
}
