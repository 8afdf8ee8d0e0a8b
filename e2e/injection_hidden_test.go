package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/luaop/luaop/testcluster"
	"github.com/luaop/luaop/testcluster/ledger"
)

// hiddenScript: create, update, field and delete handlers (FILTER: their label
// filter, or nothing), each recording its runs.
const hiddenScript = `
local R = "RESOURCE"
luaop.on.create(R, function(ctx)
  return ledger.ran(ctx, "made", "create g" .. ctx.spec.gen)
end, { id = "made" FILTER })
luaop.on.update(R, function(ctx)
  return ledger.ran(ctx, "changed", "update g" .. ctx.old.spec.gen .. "-g" .. ctx.new.spec.gen, ctx.new.spec.gen)
end, { id = "changed" FILTER })
luaop.on.field(R, "spec.size", function(ctx)
  return ledger.ran(ctx, "sized", "size " .. tostring(ctx.old) .. "-" .. tostring(ctx.new))
end, { id = "sized" FILTER })
`

const hiddenDeleteHandler = `
luaop.on.delete(R, function(ctx)
  return ledger.ran(ctx, "gone", "delete g" .. ctx.spec.gen)
end, { id = "gone" })
`

func hiddenRig(t *testing.T, gvr schema.GroupVersionResource, filter string, withDelete bool) *rig {
	src := hiddenScript
	handlers := []string{"made", "changed", "sized"}
	var deletes []string
	if withDelete {
		src += hiddenDeleteHandler
		handlers, deletes = append(handlers, "gone"), []string{"gone"}
	}
	src = strings.ReplaceAll(strings.ReplaceAll(src, "RESOURCE", gvr.Group+"/"+gvr.Version+"/"+gvr.Resource), "FILTER", filter)
	return newRig(t, rigOptions{resource: gvr, script: src, handlers: handlers, deletes: deletes})
}

// finalStateOwed: every handler serving an incarnation's final state saw it: the
// creation was handled, the field handler saw the final spec.size, the update handler
// the final spec.gen (unless the creation did: changes before the first cycle are part
// of it), the delete handler ran on a deleted incarnation held by the finalizer.
func finalStateOwed(withDelete bool) func(ledger.Incarnation) []ledger.Want {
	return func(inc ledger.Incarnation) []ledger.Want {
		if inc.Last == nil {
			return nil
		}
		gen, _, _ := unstructured.NestedInt64(inc.Last.Object, "spec", "gen")
		size, _, _ := unstructured.NestedInt64(inc.Last.Object, "spec", "size")
		createdAt := int64(-1)
		for _, r := range inc.Runs {
			if r.Handler == "made" {
				createdAt = r.Gen
			}
		}
		wants := []ledger.Want{
			{Handler: "made", Why: "its creation", Match: func(r ledger.Run) bool { return strings.HasPrefix(r.Change, "create") }},
			{Handler: "sized", Why: fmt.Sprintf("the final spec.size %d", size), Match: func(r ledger.Run) bool { return strings.HasSuffix(r.Change, fmt.Sprintf("-%d", size)) }},
		}
		if createdAt != gen {
			wants = append(wants, ledger.Want{Handler: "changed", Why: fmt.Sprintf("the final spec.gen %d", gen),
				Match: func(r ledger.Run) bool { return r.Gen == gen }})
		}
		if withDelete && inc.Deleted && inc.HeldAtDeletion {
			wants = append(wants, ledger.Want{Handler: "gone", Why: "its deletion", Match: func(r ledger.Run) bool { return true }})
		}
		return wants
	}
}

func ofResource(gvr schema.GroupVersionResource) func(*http.Request) bool {
	return func(r *http.Request) bool { return strings.Contains(r.URL.Path, "/"+gvr.Resource) }
}

// hiddenObject is the manifest of object name, incarnation inc (spec.gen 1).
func hiddenObject(gvr schema.GroupVersionResource, name string, inc, size int, labels string) string {
	return fmt.Sprintf("{apiVersion: %s/%s, kind: %s, metadata: {name: %s, labels: {%s}, annotations: {ledger.luaop.dev/luaop-managed: 'yes'}}, spec: {incarnation: %d, gen: 1, size: %d}}",
		gvr.Group, gvr.Version, kindOf(gvr), name, labels, inc, size)
}

func (r *rig) mergePatch(name, patch string) {
	r.t.Helper()
	if _, err := env.Dynamic.Resource(r.resource).Namespace(r.ns).Patch(r.t.Context(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		r.t.Fatalf("patching %s: %v", name, err)
	}
}

func (r *rig) create(manifest string) {
	r.t.Helper()
	if _, err := env.Dynamic.Resource(r.resource).Namespace(r.ns).Create(r.t.Context(), mustYAML(r.t, manifest), metav1.CreateOptions{}); err != nil {
		r.t.Fatalf("creating: %v", err)
	}
}

// checkRun applies the ledger's rules and fails the test for every violation.
func (r *rig) checkRun(owed func(ledger.Incarnation) []ledger.Want) []ledger.Violation {
	r.t.Helper()
	vs := r.check(owed)
	for _, v := range vs {
		r.t.Errorf("%s", v)
	}
	if len(vs) > 0 {
		r.t.Logf("runs:\n%s", r.runsSummary())
	}
	return vs
}

// The watch delivers only the last of a burst of changes (the proxy coalesces the
// operator's watch events, Sieve's "intermediate states"), in the middle of the
// operator's own work: every handler serving the final state sees it, none runs twice
// on one change, no write lands on a re-created namesake.
func TestHiddenIntermediateStates(t *testing.T) {
	rep := &injectionReport{}
	t.Cleanup(func() { reportInjections(t, rep.summary("hidden intermediate states")) })
	const step = 60 * time.Second
	hold := func(r *rig) func() testcluster.CoalesceStats {
		return r.proxy.CoalesceWatchEvents(ofResource(r.resource))
	}

	// A burst of updates that begins as the operator writes the first result of an
	// update: its own write is hidden too, and three more changes come meanwhile.
	t.Run("a burst of updates in the middle of a cause", func(t *testing.T) {
		r := hiddenRig(t, widgets, "", true)
		r.start()
		r.setStep("create")
		r.create(hiddenObject(widgets, "w", 1, 1, ""))
		r.waitHandledGen("w", 1, true, step)
		var release func() testcluster.CoalesceStats
		started := make(chan struct{})
		r.arm(injection{kind: callStatusWrite, ordinal: r.countOf(callStatusWrite) + 1, stage: testcluster.BeforeUpstream,
			do: func() { release = hold(r); close(started) }})
		r.setStep("update")
		r.mergePatch("w", `{"spec":{"gen":2,"size":2}}`)
		waitClosed(t, started, step, "the operator's first write of the update")
		for gen := 3; gen <= 5; gen++ {
			r.mergePatch("w", fmt.Sprintf(`{"spec":{"gen":%d,"size":%d}}`, gen, gen))
		}
		time.Sleep(3 * time.Second) // past the operator's consistency timeout (2 s)
		stats := release()
		t.Logf("held %d watch events, delivered %d", stats.Held, stats.Delivered)
		r.waitHandledGen("w", 5, true, step)
		r.finish(step)
		rep.scenario("burst of 4 updates", r.checkRun(finalStateOwed(true)))
	})

	// The object is deleted and re-created under its name (and changed) while the
	// watch is held from the operator's removal of its finalizer on: the operator never
	// sees the deletion, only the new object.
	t.Run("delete and re-create under one name, finalizer held", func(t *testing.T) {
		r := hiddenRig(t, widgets, "", true)
		r.start()
		r.create(hiddenObject(widgets, "w", 1, 1, ""))
		first := r.waitHandledGen("w", 1, true, step)
		var release func() testcluster.CoalesceStats
		started := make(chan struct{})
		r.arm(injection{kind: callFinalizerRemove, ordinal: 1, stage: testcluster.BeforeUpstream,
			do: func() { release = hold(r); close(started) }})
		r.setStep("delete and re-create")
		if err := env.Dynamic.Resource(widgets).Namespace(r.ns).Delete(t.Context(), "w", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitClosed(t, started, step, "the operator's removal of the finalizer")
		r.waitGone(first, step)
		r.create(hiddenObject(widgets, "w", 2, 7, ""))
		r.mergePatch("w", `{"spec":{"gen":2,"size":8}}`)
		time.Sleep(3 * time.Second)
		stats := release()
		t.Logf("held %d watch events, delivered %d", stats.Held, stats.Delivered)
		r.waitHandledGen("w", 2, true, step)
		r.finish(step)
		rep.scenario("delete + re-create (finalizer)", r.checkRun(finalStateOwed(true)))
	})

	// Without a delete handler nothing holds the object: its deletion and re-creation
	// are hidden entirely (one event: the same name, another uid).
	t.Run("delete and re-create under one name, no finalizer", func(t *testing.T) {
		r := hiddenRig(t, gadgets, "", false)
		r.start()
		r.create(hiddenObject(gadgets, "w", 1, 1, ""))
		first := r.waitHandledGen("w", 1, false, step)
		release := hold(r)
		client := env.Dynamic.Resource(gadgets).Namespace(r.ns)
		if err := client.Delete(t.Context(), "w", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		r.waitGone(first, step)
		r.create(hiddenObject(gadgets, "w", 2, 5, ""))
		time.Sleep(500 * time.Millisecond)
		stats := release()
		t.Logf("held %d watch events, delivered %d", stats.Held, stats.Delivered)
		second := r.waitHandledGen("w", 1, false, step)
		if second == first {
			t.Fatalf("the re-created object has the old uid")
		}
		r.finish(step)
		rep.scenario("delete + re-create (no finalizer)", r.checkRun(finalStateOwed(false)))
	})

	// A label change moves the object out of its handlers' filter and back, with a
	// change of spec in between: hidden, and then shown (each change delivered), the
	// handlers see the final spec either way.
	for _, hidden := range []bool{true, false} {
		name := "label out of the filter and back, hidden"
		if !hidden {
			name = "label out of the filter and back, each change seen"
		}
		t.Run(name, func(t *testing.T) {
			r := hiddenRig(t, widgets, `, labels = { tier = "on" }`, true)
			r.flags = append(r.flags, "--log-level", "debug")
			r.start()
			r.create(hiddenObject(widgets, "w", 1, 1, "tier: 'on'"))
			r.waitHandledGen("w", 1, true, step)
			var release func() testcluster.CoalesceStats
			if hidden {
				release = hold(r)
			}
			r.mergePatch("w", `{"metadata":{"labels":{"tier":"off"}}}`)
			if !hidden {
				r.waitSeen("w", func(r *rig, labels map[string]string) bool { return labels["tier"] == "off" }, step)
			}
			r.mergePatch("w", `{"spec":{"gen":2,"size":2}}`)
			if !hidden {
				time.Sleep(500 * time.Millisecond) // a change out of the filter: nothing to wait for
			}
			r.mergePatch("w", `{"metadata":{"labels":{"tier":"on"}}}`)
			if hidden {
				time.Sleep(500 * time.Millisecond)
				stats := release()
				t.Logf("held %d watch events, delivered %d", stats.Held, stats.Delivered)
			}
			r.waitHandledGen("w", 2, true, step)
			r.finish(step)
			rep.scenario(name, r.checkRun(finalStateOwed(true)))
		})
	}
}

// waitSeen waits until the ledger saw the live incarnation of name with labels that
// satisfy ok.
func (r *rig) waitSeen(name string, ok func(*rig, map[string]string) bool, timeout time.Duration) {
	r.t.Helper()
	testcluster.Eventually(r.t, timeout, func() (bool, string) {
		inc := r.current(name)
		return inc != nil && ok(r, inc.Last.GetLabels()), "waiting for " + name + "'s labels to change"
	})
}

// countOf is how many calls of kind the operator made so far.
func (r *rig) countOf(kind string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counts[kind]
}

// finish deletes every live object of the rig, waits until they are gone and stops
// the operator: the delete handler is the last thing that can happen to an object, so
// a re-run would have come by then.
func (r *rig) finish(timeout time.Duration) {
	r.t.Helper()
	r.setStep("finish")
	client := env.Dynamic.Resource(r.resource).Namespace(r.ns)
	for _, inc := range r.ledger.Incarnations() {
		if inc.Deleted {
			continue
		}
		name := inc.Name[strings.IndexByte(inc.Name, '/')+1:]
		if err := client.Delete(r.t.Context(), name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: ptrTo(types.UID(inc.UID))}}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			r.t.Fatalf("deleting %s: %v", inc.Name, err)
		}
	}
	for _, inc := range r.ledger.Incarnations() {
		if !inc.Deleted {
			r.waitGone(inc.UID, timeout)
		}
	}
	r.stopAll()
}

func waitClosed(t *testing.T, ch <-chan struct{}, timeout time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(timeout):
		t.Fatalf("after %s: still waiting for %s", timeout, what)
	}
}

func ptrTo[T any](v T) *T { return &v }
