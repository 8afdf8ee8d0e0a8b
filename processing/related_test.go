package processing

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/luaop/luaop/processing/causes"
)

var configmaps = causes.Resource{GroupVersionResource: configmapsGVR}

// relatedSpec is a handler of widgets triggered by related ConfigMaps.
func relatedSpec(id string, rels ...causes.Relation) causes.Spec {
	s := changeSpec(id, causes.Related)
	s.Related = rels
	return s
}

// relatedRuns records what a related handler was given, run by run.
type relatedRuns struct {
	mu   sync.Mutex
	runs [][]causes.RelatedChange
}

func (r *relatedRuns) handler(fn func(run int) error) handlerFunc {
	return func(ctx context.Context, call causes.Call) (causes.Result, error) {
		r.mu.Lock()
		r.runs = append(r.runs, call.Cause.Related)
		n := len(r.runs)
		r.mu.Unlock()
		if fn != nil {
			return causes.Result{}, fn(n)
		}
		return causes.Result{}, nil
	}
}

func (r *relatedRuns) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.runs)
}

func (r *relatedRuns) run(i int) []causes.RelatedChange {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runs[i]
}

// names are the names of the related objects of a run, with their event types.
func names(changes []causes.RelatedChange) map[string]string {
	out := map[string]string{}
	for _, c := range changes {
		out[c.Name] = c.Type
	}
	return out
}

// changedAll tells whether every object of the burst shows its change (data v=1).
func changedAll(changes []causes.RelatedChange) bool {
	for _, c := range changes {
		if v, _, _ := unstructured.NestedString(c.Object, "data", "v"); c.Name != "first" && v != "1" {
			return false
		}
	}
	return true
}

func ownedConfigMap(name, owner, ownerUID string, controller bool, data string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": name, "namespace": "default", "uid": "cm-" + name,
			"ownerReferences": []any{map[string]any{"apiVersion": "example.luaop.dev/v1", "kind": "Widget", "name": owner,
				"uid": ownerUID, "controller": controller}}},
		"data": map[string]any{"v": data},
	}}
}

func (e *env) createConfigMap(cm *unstructured.Unstructured) {
	e.t.Helper()
	if _, err := e.dyn.Resource(configmapsGVR).Namespace(cm.GetNamespace()).Create(e.t.Context(), cm, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("creating %s: %v", cm.GetName(), err)
	}
}

func (e *env) patchConfigMap(name, patch string) {
	e.t.Helper()
	if _, err := e.dyn.Resource(configmapsGVR).Namespace("default").Patch(e.t.Context(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		e.t.Fatalf("patching %s: %v", name, err)
	}
}

// An owned object's change runs its owner's related handler with the owner's body,
// once, and tells which object changed and how; an object owned without the
// controller flag counts only for controller = false.
func TestRelatedOwnedObjectTriggersItsOwner(t *testing.T) {
	h := newFakeHandlers()
	var runs relatedRuns
	h.add(relatedSpec("heal", causes.Relation{Kind: causes.RelationOwned, Resource: configmaps}), runs.handler(nil))
	e := startEnv(t, h, Options{}, widgetObject("w1", "uid-w1", map[string]any{"a": int64(1)}))
	e.eventually("the operator synced", e.op.Synced)
	e.createConfigMap(ownedConfigMap("child", "w1", "uid-w1", true, "one"))
	e.eventually("a related run", func() bool { return runs.count() == 1 })
	if got := names(runs.run(0)); got["child"] != "ADDED" || len(got) != 1 {
		t.Fatalf("first run given %v: want child ADDED", got)
	}
	e.patchConfigMap("child", `{"data":{"v":"two"}}`)
	e.eventually("a second related run", func() bool { return runs.count() == 2 })
	ch := runs.run(1)[0]
	if ch.Type != "MODIFIED" || ch.Relation != causes.RelationOwned || ch.Kind != "ConfigMap" || ch.Resource != configmaps {
		t.Fatalf("second run given %+v: want a MODIFIED owned ConfigMap", ch)
	}
	if old, _, _ := unstructured.NestedString(ch.Old, "data", "v"); old != "one" {
		t.Errorf("old data %q: want the state before the change (one)", old)
	}
	if now, _, _ := unstructured.NestedString(ch.Object, "data", "v"); now != "two" {
		t.Errorf("object data %q: want the newest state (two)", now)
	}
	calls := h.callsOf("heal", "w1")
	if len(calls) != 2 || calls[1].reason != causes.Related {
		t.Fatalf("calls %+v: want two related runs on w1 with its body", calls)
	}
	// Not the controller's reference: nothing for a controller-only relation.
	e.createConfigMap(ownedConfigMap("weak", "w1", "uid-w1", false, "x"))
	e.stays("w1", "a run for an object owned without the controller flag", func() bool { return runs.count() != 2 })
}

// A burst of changes of one parent's children is coalesced: while the handler
// runs, 100 children change; its next run gets them all, once.
func TestRelatedBurstIsCoalesced(t *testing.T) {
	h := newFakeHandlers()
	var runs relatedRuns
	release := make(chan struct{})
	defer func() {
		select {
		case <-release:
		default:
			close(release) // a failed test must not hold the handler for ever
		}
	}()
	h.add(relatedSpec("heal", causes.Relation{Kind: causes.RelationOwned, Resource: configmaps, AnyOwner: true}), runs.handler(func(run int) error {
		if run == 1 {
			<-release
		}
		return nil
	}))
	e := startEnv(t, h, Options{}, widgetObject("w1", "uid-w1", nil))
	e.eventually("the operator synced", e.op.Synced)
	e.createConfigMap(ownedConfigMap("first", "w1", "uid-w1", false, "0"))
	e.eventually("the first run started", func() bool { return runs.count() == 1 })
	const n = 100
	for i := range n {
		e.createConfigMap(ownedConfigMap(fmt.Sprintf("c%03d", i), "w1", "uid-w1", false, "0"))
	}
	for i := range n {
		e.patchConfigMap(fmt.Sprintf("c%03d", i), `{"data":{"v":"1"}}`)
	}
	// Every notification is recorded before the run ends (the first object's
	// change stays pending until its run ends).
	e.eventually("the burst recorded", func() bool {
		got := e.op.relations.inbox.take(objectKey{resource: widgets, namespace: "default", name: "w1"})
		return len(got["heal"].changes) == n+1 && changedAll(got["heal"].changes)
	})
	close(release)
	e.eventually("the second run", func() bool { return runs.count() == 2 })
	second := names(runs.run(1))
	if len(second) != n {
		t.Fatalf("the second run got %d objects: want the %d of the burst at once", len(second), n)
	}
	for name, typ := range second {
		if typ != "ADDED" {
			t.Fatalf("%s: %s; an object added then modified is ADDED to the handler", name, typ)
		}
	}
	e.stays("w1", "a third run after the burst was handled", func() bool { return runs.count() != 2 })
}

// A failed related run is retried after its delay, with its progress on the
// parent, and the retry sees what changed meanwhile; the record goes once it
// succeeds.
func TestRelatedRunIsRetried(t *testing.T) {
	h := newFakeHandlers()
	var runs relatedRuns
	h.add(relatedSpec("heal", causes.Relation{Kind: causes.RelationOwned, Resource: configmaps}), runs.handler(func(run int) error {
		if run == 1 {
			return &causes.TemporaryError{Message: "not yet", Delay: 30 * time.Second}
		}
		return nil
	}))
	e := startEnv(t, h, Options{}, widgetObject("w1", "uid-w1", nil))
	e.eventually("the operator synced", e.op.Synced)
	e.createConfigMap(ownedConfigMap("a", "w1", "uid-w1", true, "0"))
	e.eventually("the progress record of the failed run", func() bool {
		_, ok := e.annotations("w1")["luaop.dev/heal"]
		return ok
	})
	e.createConfigMap(ownedConfigMap("b", "w1", "uid-w1", true, "0"))
	e.stays("w1", "a retry before its delay", func() bool { return runs.count() != 1 })
	e.clock.Step(31 * time.Second)
	e.eventually("the retry", func() bool { return runs.count() == 2 })
	if got := names(runs.run(1)); got["a"] != "ADDED" || got["b"] != "ADDED" {
		t.Fatalf("the retry was given %v: want a and b", got)
	}
	if calls := h.callsOf("heal", "w1"); calls[1].retry != 1 {
		t.Errorf("retry %d: want 1", calls[1].retry)
	}
	e.eventually("the record purged", func() bool {
		_, ok := e.annotations("w1")["luaop.dev/heal"]
		return !ok
	})
	e.stays("w1", "another run", func() bool { return runs.count() != 2 })
}

// A labelled object triggers the object its label names; an object moved from one
// parent to another (its label changed) triggers both.
func TestRelatedLabelNamesTheParent(t *testing.T) {
	h := newFakeHandlers()
	var runs relatedRuns
	h.add(relatedSpec("copy", causes.Relation{Kind: causes.RelationLabelled, Resource: configmaps, Label: "example.com/of"}), runs.handler(nil))
	e := startEnv(t, h, Options{}, widgetObject("w1", "uid-w1", nil), widgetObject("w2", "uid-w2", nil))
	e.eventually("the operator synced", e.op.Synced)
	e.createConfigMap(&unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "copy", "namespace": "default", "labels": map[string]any{"example.com/of": "default.w1"}}}})
	e.eventually("w1's run", func() bool { return len(h.callsOf("copy", "w1")) == 1 })
	e.patchConfigMap("copy", `{"metadata":{"labels":{"example.com/of":"default.w2"}}}`)
	e.eventually("both runs", func() bool { return len(h.callsOf("copy", "w1")) == 2 && len(h.callsOf("copy", "w2")) == 1 })
	e.stays("w2", "more runs", func() bool { return runs.count() != 3 })
}

// mappingHandlers are fake handlers with a mapped relation's function.
type mappingHandlers struct {
	*fakeHandlers
	mapFn func(obj map[string]any) ([]causes.ObjectRef, error)
}

func (m mappingHandlers) MapRelated(ctx context.Context, call causes.Call, relation int) ([]causes.ObjectRef, error) {
	return m.mapFn(call.Cause.Body)
}

// A mapped object triggers every parent its function names, before and after the
// change (an object that stops mapping to a parent still tells it); a parent
// named but absent gets nothing, and no trigger is kept for it.
func TestRelatedMappedToSeveralParents(t *testing.T) {
	h := newFakeHandlers()
	h.add(relatedSpec("fanout", causes.Relation{Kind: causes.RelationMapped, Resource: configmaps}), nil)
	mh := mappingHandlers{fakeHandlers: h, mapFn: func(obj map[string]any) ([]causes.ObjectRef, error) {
		if v, _, _ := unstructured.NestedString(obj, "data", "to"); v == "all" {
			return []causes.ObjectRef{{Name: "w1"}, {Name: "w2"}, {Name: "missing"}}, nil
		}
		return nil, nil
	}}
	e := startEnvOn(t, mh, Options{}, "", nil, widgetObject("w1", "uid-w1", nil), widgetObject("w2", "uid-w2", nil))
	e.h = h
	e.eventually("the operator synced", e.op.Synced)
	e.createConfigMap(&unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "ns", "namespace": "default"}, "data": map[string]any{"to": "all"}}})
	e.eventually("both parents ran", func() bool { return len(h.callsOf("fanout", "w1")) == 1 && len(h.callsOf("fanout", "w2")) == 1 })
	e.patchConfigMap("ns", `{"data":{"to":"none"}}`)
	e.eventually("both told of the change", func() bool { return len(h.callsOf("fanout", "w1")) == 2 && len(h.callsOf("fanout", "w2")) == 2 })
	if e.op.relations.inbox.has(objectKey{resource: widgets, namespace: "default", name: "missing"}) {
		t.Error("a trigger is kept for a parent that does not exist")
	}
}

// The parent's own cause comes first; its related changes run after it, in a
// cause of their own; a parent being deleted runs no related handler.
func TestRelatedWaitsForTheParentsOwnCause(t *testing.T) {
	h := newFakeHandlers()
	var order []string
	var mu sync.Mutex
	note := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }
	release := make(chan struct{})
	h.add(changeSpec("create", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		note("create")
		<-release
		return causes.Result{}, nil
	})
	h.add(relatedSpec("heal", causes.Relation{Kind: causes.RelationOwned, Resource: configmaps}), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		note(fmt.Sprintf("related %d", len(call.Cause.Related)))
		return causes.Result{}, nil
	})
	e := startEnv(t, h, Options{})
	e.eventually("the operator synced", e.op.Synced)
	uid := e.create("w1", nil)
	e.eventually("the create handler runs", func() bool { mu.Lock(); defer mu.Unlock(); return len(order) == 1 })
	e.createConfigMap(ownedConfigMap("c1", "w1", uid, true, "0"))
	e.createConfigMap(ownedConfigMap("c2", "w1", uid, true, "0"))
	e.eventually("recorded", func() bool {
		return e.op.relations.inbox.has(objectKey{resource: widgets, namespace: "default", name: "w1"})
	})
	close(release)
	e.eventually("the related run after the creation", func() bool { mu.Lock(); defer mu.Unlock(); return len(order) == 2 })
	mu.Lock()
	if order[0] != "create" || order[1] != "related 2" {
		t.Errorf("order %v: want the create handler, then one related run with both children", order)
	}
	mu.Unlock()
	e.markDeleting("w1")
	e.settleIn(widgetsGVR, "w1") // the deletion seen: a child's change seen before it would still run
	e.patchConfigMap("c1", `{"data":{"v":"gone"}}`)
	e.stays("w1", "a related run while the parent is being deleted", func() bool { mu.Lock(); defer mu.Unlock(); return len(order) != 2 })
}

// At start, the related objects the listing finds trigger their parent (what
// changed while the operator was down): every one reaches the handler, coalesced
// with the others pending at its run, and nothing runs again after.
func TestRelatedObjectsFoundAtStartTriggerTheirParent(t *testing.T) {
	h := newFakeHandlers()
	var runs relatedRuns
	h.add(relatedSpec("heal", causes.Relation{Kind: causes.RelationOwned, Resource: configmaps}), runs.handler(nil))
	e := startEnv(t, h, Options{}, widgetObject("w1", "uid-w1", nil),
		ownedConfigMap("a", "w1", "uid-w1", true, "0"), ownedConfigMap("b", "w1", "uid-w1", true, "0"),
		ownedConfigMap("orphan", "gone", "uid-gone", true, "0"))
	e.eventually("the operator synced", e.op.Synced)
	e.eventually("both children seen", func() bool {
		seen := map[string]bool{}
		for i := range runs.count() {
			for name := range names(runs.run(i)) {
				seen[name] = true
			}
		}
		return seen["a"] && seen["b"] && len(seen) == 2
	})
	n := runs.count()
	e.stays("w1", "another run", func() bool { return runs.count() != n })
	// Dropped once the parents' listing is done (its end is polled: soon after).
	e.eventually("no trigger kept for a parent the listing did not find", func() bool {
		return !e.op.relations.inbox.has(objectKey{resource: widgets, namespace: "default", name: "gone"})
	})
}
