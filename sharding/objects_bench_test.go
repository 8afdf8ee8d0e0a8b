package sharding

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

const benchObjects = 10000

var benchMembers = []string{"luaop-6d5f8c7b9-x2k4p-1a2b3c4d", "luaop-6d5f8c7b9-q8w7e-5e6f7a8b", "luaop-6d5f8c7b9-m3n4b-9c0d1e2f"}

// benchList is what a list of the objects' metadata decodes to: every string
// its own allocation (as the decoder's), a diff-base annotation, managed fields,
// a finalizer; labelled with plan's member, so the coordinator's pass is idle.
func benchList(plan map[string]string) *metav1.PartialObjectMetadataList {
	list := &metav1.PartialObjectMetadataList{ListMeta: metav1.ListMeta{ResourceVersion: "3000000"}}
	list.Items = make([]metav1.PartialObjectMetadata, benchObjects)
	const fields = `{"f:metadata":{"f:annotations":{".":{},"f:luaop.dev/last-handled-configuration":{}},"f:finalizers":{".":{},"v:\"luaop.dev/finalizer\"":{}}}}`
	for i := range list.Items {
		ns, n := benchNamespace, fmt.Sprintf("obj-%05d", i)
		list.Items[i] = metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "example.com/v1", Kind: "Widget"},
			ObjectMeta: metav1.ObjectMeta{Namespace: strings.Clone(ns), Name: n, UID: types.UID(fmt.Sprintf("6f1c9e2a-0b7d-4c55-9e3a-%012d", i)),
				ResourceVersion: strconv.Itoa(2000000 + i), Generation: 1, CreationTimestamp: metav1.Now(),
				Labels: map[string]string{"app.kubernetes.io/name": "bench", "luaop.dev/shard": strings.Clone(plan[ObjectKey("example.com", "widgets", ns, n)])},
				Annotations: map[string]string{"luaop.dev/last-handled-configuration": fmt.Sprintf(
					`{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":%q,"namespace":%q},"spec":{"size":%d,"image":"registry.example/app:1.2.3","replicas":3}}`, n, ns, i)},
				Finalizers:    []string{"luaop.dev/finalizer"},
				ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "luaop", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "example.com/v1", FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(strings.Clone(fields))}},
			}}
	}
	return list
}

const benchNamespace = "luaop-bench-7f3a"

// noWatchList makes the Reflectors list (the fake watch sends no initial events).
type noWatchList struct{}

func (noWatchList) IsWatchListSemanticsUnSupported() bool { return true }

// benchListWatch lists a fresh benchList each time (so only the store keeps
// what it holds) and watches with a watch that stays open and quiet.
func benchListWatch(plan map[string]string) cache.ListerWatcher {
	return cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (k8sruntime.Object, error) { return benchList(plan), nil },
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) {
			return watch.NewRaceFreeFake(), nil
		},
	}, noWatchList{})
}

func heapAlloc() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// oldPlanItem and oldSeenObject are the pass's items before the compact store
// (member strings; a copy of each object's strings in seen).
type oldPlanItem struct {
	hash                        uint64
	tie, current, first, member string
	at                          int
}

type oldSeenObject struct {
	inf             int
	key             string
	label, handover string
}

// coordinatorBefore is what the coordinator kept for the objects of one resource
// before the compact store: a metadata informer (its DeltaFIFO, indexer and
// handler, the transform trimming each object to decisionMetadata), the plan
// map, and the pass's items and seen. It returns the heap it holds after the
// sync and after the plan, and a function to let it go.
func coordinatorBefore(b *testing.B, plan map[string]string) (store, all int64, stop func()) {
	base := heapAlloc()
	ctx, cancel := context.WithCancel(context.Background())
	inf := cache.NewSharedIndexInformer(benchListWatch(plan), &metav1.PartialObjectMetadata{}, 0, cache.Indexers{})
	_ = inf.SetTransform(func(obj any) (any, error) {
		if m, ok := obj.(*metav1.PartialObjectMetadata); ok {
			return decisionMetadata(m, "luaop.dev/shard", "luaop.dev/shard-handover"), nil
		}
		return obj, nil
	})
	wake := make(chan struct{}, 1)
	onChange := func(any) { poke(wake) }
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: onChange, DeleteFunc: onChange,
		UpdateFunc: func(old, cur any) { onChange(cur) }})
	go inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		b.Fatal("never synced")
	}
	for len(inf.GetStore().ListKeys()) < benchObjects {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // the handler's notifications delivered
	store = heapAlloc() - base
	planned := map[string]string{}
	keys := inf.GetStore().ListKeys()
	items, seen := make([]oldPlanItem, len(keys)), make([]oldSeenObject, len(keys))
	for i, k := range keys {
		obj, _, _ := inf.GetStore().GetByKey(k)
		m := obj.(*metav1.PartialObjectMetadata)
		member := benchMembers[i%len(benchMembers)]
		planned[k] = member
		items[i] = oldPlanItem{hash: hashKey(k), tie: k, current: m.Labels["luaop.dev/shard"], first: member, member: member, at: i}
		seen[i] = oldSeenObject{inf: 0, key: k, label: m.Labels["luaop.dev/shard"], handover: m.Annotations["luaop.dev/shard-handover"]}
	}
	all = heapAlloc() - base
	return store, all, func() { runtime.KeepAlive(planned); runtime.KeepAlive(items); runtime.KeepAlive(seen); cancel() }
}

// coordinatorAfter is the coordinator of now on the same objects: a Reflector
// into its store, then one (idle) pass.
func coordinatorAfter(b *testing.B, plan map[string]string) (store, all int64, stop func()) {
	s, err := NewWithClients(Clients{Kube: kubefake.NewClientset()}, Options{Namespace: "luaop", Identity: benchMembers[0],
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	for _, m := range benchMembers {
		s.ms.seen["bench-member-"+m] = observedLease{member: m, observedAt: s.clock.Now(), duration: time.Hour}
	}
	c := newCoordinator(s)
	base := heapAlloc() // the fake clients are no part of it
	ctx, cancel := context.WithCancel(context.Background())
	st := newObjectStore(s.label, s.handover, func() { poke(s.coordinatorWake) })
	c.stores[informerKey{gvr: schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}, namespace: benchNamespace}] = st
	go cache.NewReflectorWithOptions(benchListWatch(plan), &metav1.PartialObjectMetadata{}, st, cache.ReflectorOptions{}).RunWithContext(ctx)
	for !st.hasSynced() {
		time.Sleep(time.Millisecond)
	}
	store = heapAlloc() - base
	c.pass()
	if n := c.queue.Len(); n > 0 {
		b.Fatalf("the pass queued %d writes: not idle", n)
	}
	all = heapAlloc() - base
	return store, all, func() { runtime.KeepAlive(c); c.queue.ShutDown(); cancel() }
}

// BenchmarkCoordinatorStore measures what the coordinator holds, per object, for
// 10,000 objects of one resource: "store" B/object once listed, "all" B/object
// once planned (the plan and the pass's reused items included); before (a
// metadata informer with the transform, a plan map) and after (the compact
// store). go test -run '^$' -bench CoordinatorStore -benchtime 3x ./sharding
func BenchmarkCoordinatorStore(b *testing.B) {
	var placements []Placement
	for i := range benchObjects {
		placements = append(placements, Placement{Key: ObjectKey("example.com", "widgets", benchNamespace, fmt.Sprintf("obj-%05d", i))})
	}
	plan := Plan(NewRing(benchMembers, 0), placements, 0)
	for _, arm := range []struct {
		name string
		run  func(*testing.B, map[string]string) (int64, int64, func())
	}{{"before=informer", coordinatorBefore}, {"after=compact", coordinatorAfter}} {
		b.Run(arm.name, func(b *testing.B) {
			var store, all float64
			n := 0
			for b.Loop() {
				s, a, stop := arm.run(b, plan)
				store, all = store+float64(s), all+float64(a)
				n++
				stop()
			}
			b.ReportMetric(store/float64(n)/benchObjects, "store-B/object")
			b.ReportMetric(all/float64(n)/benchObjects, "all-B/object")
		})
	}
}
