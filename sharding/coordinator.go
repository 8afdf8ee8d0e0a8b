package sharding

import (
	"context"
	"encoding/json"
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
	queue workqueue.TypedRateLimitingInterface[objRef]

	// mu is a leaf lock: it guards plan and informers.
	mu        sync.Mutex
	plan      map[objRef]string
	informers map[informerKey]cache.SharedIndexInformer

	lastMembers    []string
	rebalanceSince time.Time
}

func newCoordinator(s *Sharding) *coordinator {
	return &coordinator{s: s, plan: map[objRef]string{}, informers: map[informerKey]cache.SharedIndexInformer{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[objRef](50*time.Millisecond, 5*time.Second),
			workqueue.TypedRateLimitingQueueConfig[objRef]{Clock: s.clock})}
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
// change (a member's lease expiring, informers still listing), 0 for never.
func (c *coordinator) pass() time.Duration {
	s := c.s
	c.mu.Lock()
	informers := make(map[informerKey]cache.SharedIndexInformer, len(c.informers))
	for k, v := range c.informers {
		informers[k] = v
	}
	c.mu.Unlock()
	for _, inf := range informers {
		if !inf.HasSynced() {
			return 100 * time.Millisecond // a plan of part of the objects would move objects for nothing
		}
	}
	now := s.clock.Now()
	members, nextExpiry := s.ms.live(now)
	ring := NewRing(members, s.opts.VirtualNodes)
	type seen struct {
		ref             objRef
		label, handover string
	}
	var objects []seen
	var placements []Placement
	for k, inf := range informers {
		for _, obj := range inf.GetStore().List() {
			m, ok := obj.(*metav1.PartialObjectMetadata)
			if !ok || m.DeletionTimestamp != nil && len(m.Finalizers) == 0 {
				continue
			}
			o := seen{ref: objRef{k.gvr, m.Namespace, m.Name}, label: m.Labels[s.label], handover: m.Annotations[s.handover]}
			current := o.label
			if o.handover != "" {
				current = o.handover // committed: it goes there
			}
			objects = append(objects, o)
			placements = append(placements, Placement{Key: o.ref.key(), Current: current})
		}
	}
	plan := Plan(ring, placements, s.opts.Tolerance)
	newPlan := make(map[objRef]string, len(objects))
	pending := 0
	for _, o := range objects {
		want := plan[o.ref.key()]
		newPlan[o.ref] = want
		switch {
		case want == "":
		case o.handover != "":
			pending++
			if !ring.Has(o.label) {
				c.queue.Add(o.ref) // its member left before releasing it
			}
		case o.label != want:
			pending++
			c.queue.Add(o.ref)
		}
	}
	c.mu.Lock()
	c.plan = newPlan
	c.mu.Unlock()

	if !equalStrings(members, c.lastMembers) {
		if c.lastMembers != nil || len(objects) > 0 {
			if c.rebalanceSince.IsZero() {
				c.rebalanceSince = now
			}
			s.log.Info("shard members changed: rebalancing", "members", strings.Join(members, ","), "objects", len(objects), "moves", pending)
		}
		c.lastMembers = members
	}
	if pending == 0 && !c.rebalanceSince.IsZero() {
		took := now.Sub(c.rebalanceSince)
		c.rebalanceSince = time.Time{}
		s.log.Info("rebalanced: every object is with its member", "members", len(members), "objects", len(objects), "took", took.Round(time.Millisecond))
		if s.opts.Observer != nil {
			s.opts.Observer.ShardRebalanced(took)
		}
	}
	if !nextExpiry.IsZero() {
		return nextExpiry.Sub(now) + time.Millisecond
	}
	return 0
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
	want := c.plan[ref]
	inf := c.informers[informerKey{ref.gvr, ref.namespace}]
	if inf == nil {
		inf = c.informers[informerKey{ref.gvr, ""}]
	}
	c.mu.Unlock()
	if want == "" || inf == nil {
		c.queue.Forget(ref)
		return true
	}
	storeKey := ref.name
	if ref.namespace != "" {
		storeKey = ref.namespace + "/" + ref.name
	}
	obj, exists, _ := inf.GetStore().GetByKey(storeKey)
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
	_, err := s.meta.Resource(ref.gvr).Namespace(ref.namespace).Patch(ctx, ref.name, types.MergePatchType, patch, metav1.PatchOptions{})
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
