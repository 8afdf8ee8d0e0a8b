package processing

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// Issue 12.1: a change written while a cause is half done (one handler per cycle)
// must reach every handler: the field handler that already handled 1 -> 2 must see
// 2 -> 3, never 1 -> 3 nor nothing. Writes are interleaved on purpose: the test
// patches the object while the first handler of the cause runs.
func TestSpecChangeDuringAHalfDoneCauseReachesEveryHandler(t *testing.T) {
	h := newFakeHandlers()
	var interleaved atomic.Bool
	var e *env
	field := changeSpec("size_fn", causes.Update)
	field.Field = []string{"spec", "size"}
	h.add(field, func(ctx context.Context, call causes.Call) (causes.Result, error) {
		if interleaved.CompareAndSwap(false, true) {
			e.patch("w1", `{"spec":{"size":3}}`) // a user's write while the cause is half done
		}
		return causes.Result{}, nil
	})
	h.add(changeSpec("update_fn", causes.Update), nil)
	e = startEnv(t, h, Options{Lifecycle: LifecycleAsap})
	e.create("w1", map[string]any{"size": int64(1)})
	e.eventually("the creation handled", func() bool {
		_, ok := e.annotations("w1")["luaop.dev/last-handled-configuration"]
		return ok
	})
	e.patch("w1", `{"spec":{"size":2}}`)
	e.eventually("both changes handled by both handlers", func() bool {
		return len(h.callsOf("size_fn", "w1")) == 2 && len(h.callsOf("update_fn", "w1")) == 2
	})
	e.stays("w1", "a third run", func() bool { return len(h.callsOf("size_fn", "w1")) > 2 || len(h.callsOf("update_fn", "w1")) > 2 })
	var seen []string
	for _, c := range h.callsOf("size_fn", "w1") {
		seen = append(seen, fmt.Sprintf("%v->%v", c.old, c.new))
	}
	if fmt.Sprint(seen) != "[1->2 2->3]" {
		t.Errorf("the field handler saw %v, want [1->2 2->3]: every change, old = what it last handled", seen)
	}
	base, _, _ := state.NewAnnotationsDiffBase("luaop.dev").Fetch(e.get("w1").Object)
	if got, _ := state.Resolve(base, []string{"spec", "size"}); fmt.Sprint(got) != "3" {
		t.Errorf("the diff-base holds size %v, want the final 3", got)
	}
}

// Issue 12.4: objects that no change handler's filters match get no diff-base; when
// one matches later (a label added), that is their creation.
func TestObjectsNoHandlerMatchesGetNoDiffBaseAndTheirFirstMatchIsACreation(t *testing.T) {
	h := newFakeHandlers()
	h.add(changeSpec("create_fn", causes.Create), nil)
	h.match["create_fn"] = func(c causes.Cause) bool {
		labels, _, _ := unstructured.NestedStringMap(c.Body, "metadata", "labels")
		return labels["managed"] == "yes"
	}
	e := startEnv(t, h, Options{})
	e.create("w1", map[string]any{"size": int64(1)})
	e.stays("w1", "a diff-base for an object nobody is interested in", func() bool {
		_, ok := e.annotations("w1")["luaop.dev/last-handled-configuration"]
		return ok
	})
	e.patch("w1", `{"metadata":{"labels":{"managed":"yes"}}}`)
	e.eventually("the first match handled as a creation", func() bool {
		calls := h.callsOf("create_fn", "w1")
		return len(calls) == 1 && calls[0].reason == causes.Create
	})
}

// Issue 12.6: when a cause completes, the records of all the resource's handlers
// are purged, not only those that ran: a stale record must not make a later cause
// declare a handler timed out (or done) without running it.
func TestCompletedCausePurgesTheRecordsOfEveryHandler(t *testing.T) {
	h := newFakeHandlers()
	h.add(changeSpec("update_fn", causes.Update), nil)
	stale := changeSpec("size_fn", causes.Update)
	stale.Field = []string{"spec", "size"}
	stale.Timeout = time.Minute
	h.add(stale, nil)
	old := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	obj := widgetObject("w1", "uid-1", map[string]any{"size": int64(1), "color": "red"})
	patch := state.NewPatch()
	state.NewAnnotationsProgress("luaop.dev").Store(nil, patch, "size_fn", state.HandlerRecord{Started: &old, Purpose: "update", Retries: 1})
	if err := state.NewAnnotationsDiffBase("luaop.dev").Store(nil, patch, map[string]any{"spec": map[string]any{"size": int64(1), "color": "red"}}); err != nil {
		t.Fatal(err)
	}
	annotations, _, _ := unstructured.NestedMap(patch.Map(), "metadata", "annotations")
	stored := map[string]string{}
	for k, v := range annotations {
		stored[k] = fmt.Sprint(v)
	}
	obj.SetAnnotations(stored)
	e := startEnv(t, h, Options{}, obj)
	e.patch("w1", `{"spec":{"color":"blue"}}`) // a cause size_fn does not take part in
	e.eventually("the update handled and every record purged", func() bool {
		_, left := state.NewAnnotationsProgress("luaop.dev").Fetch(e.get("w1").Object, "size_fn")
		return len(h.callsOf("update_fn", "w1")) == 1 && !left
	})
	e.patch("w1", `{"spec":{"size":2}}`)
	e.eventually("the field handler ran (not declared timed out by a stale record)", func() bool {
		return len(h.callsOf("size_fn", "w1")) == 1
	})
}

// Issue 12.7: a resume handler never joins a creation, not even of an object found at
// startup: a function registered for both runs once.
func TestResumeHandlerDoesNotRunForObjectsCreatedWhileTheOperatorWasDown(t *testing.T) {
	h := newFakeHandlers()
	h.add(changeSpec("create_or_resume", causes.Create, causes.Resume), nil)
	h.add(changeSpec("resume_only", causes.Resume), nil)
	e := startEnv(t, h, Options{}, widgetObject("w1", "uid-1", map[string]any{"size": int64(1)}))
	e.eventually("created", func() bool { return len(h.callsOf("create_or_resume", "w1")) == 1 })
	e.stays("w1", "a second run or a resume", func() bool {
		return len(h.callsOf("create_or_resume", "w1")) > 1 || len(h.callsOf("resume_only", "w1")) > 0
	})
	if got := h.callsOf("create_or_resume", "w1")[0].reason; got != causes.Create {
		t.Errorf("ran for %s, want create", got)
	}
}

// Issue 12.8: `field` on a delete handler is a presence filter (it used to make the
// operator add the finalizer, then remove it without calling the handler).
func TestFieldOnADeleteHandlerIsAPresenceFilter(t *testing.T) {
	h := newFakeHandlers()
	spec := changeSpec("release_volume", causes.Delete)
	spec.Field = []string{"spec", "volume"}
	h.add(spec, nil)
	e := startEnv(t, h, Options{})
	e.create("with", map[string]any{"volume": "v1"})
	e.create("without", map[string]any{"size": int64(1)})
	e.eventually("the finalizer on the object with the field", func() bool {
		return slices.Contains(e.get("with").GetFinalizers(), "luaop.dev/finalizer")
	})
	e.stays("without", "a finalizer on the object without the field: nothing would run for it", func() bool {
		return len(e.get("without").GetFinalizers()) != 0
	})
	e.markDeleting("with")
	e.markDeleting("without")
	e.eventually("released", func() bool { return len(e.get("with").GetFinalizers()) == 0 })
	if n := len(h.callsOf("release_volume", "with")); n != 1 {
		t.Errorf("the delete handler ran %d times for the object with the field, want 1", n)
	}
	if n := len(h.callsOf("release_volume", "without")); n != 0 {
		t.Errorf("the delete handler ran for the object without the field")
	}
}

// Issue 12.8: a field handler on a field outside the essence (status.phase) fires:
// handlers' fields are added to the essence (kopf).
func TestFieldHandlerOnAStatusFieldFires(t *testing.T) {
	h := newFakeHandlers()
	spec := changeSpec("phase_fn", causes.Create, causes.Update) // as luaop.on.field registers
	spec.Field = []string{"status", "phase"}
	h.add(spec, nil)
	e := startEnv(t, h, Options{})
	e.create("w1", map[string]any{"size": int64(1)})
	e.stays("w1", "a run while the field is absent", func() bool { return len(h.callsOf("phase_fn", "w1")) > 0 })
	e.patch("w1", `{"status":{"phase":"Pending"}}`)
	e.eventually("the status field handler ran", func() bool { return len(h.callsOf("phase_fn", "w1")) == 1 })
	e.patch("w1", `{"status":{"phase":"Running"}}`)
	e.eventually("and ran again for its change", func() bool { return len(h.callsOf("phase_fn", "w1")) == 2 })
	if c := h.callsOf("phase_fn", "w1")[1]; fmt.Sprint(c.old) != "Pending" || fmt.Sprint(c.new) != "Running" {
		t.Errorf("got old=%v new=%v, want Pending -> Running", c.old, c.new)
	}
}

// Issue 12.12: what an event handler writes into ctx.patch and returns is applied.
func TestEventHandlerPatchAndResultAreApplied(t *testing.T) {
	h := newFakeHandlers()
	h.add(causes.Spec{ID: "spy", Kind: causes.KindEvent, Resource: widgets}, func(ctx context.Context, call causes.Call) (causes.Result, error) {
		if call.Cause.EventType != "ADDED" {
			return causes.Result{}, nil
		}
		call.Patch.Set([]string{"metadata", "labels", "seen"}, "yes")
		return causes.Result{Value: "spied"}, nil
	})
	e := startEnv(t, h, Options{})
	e.create("w1", nil)
	e.eventually("the event handler's patch and result on the object", func() bool {
		u := e.get("w1")
		v, _, _ := unstructured.NestedString(u.Object, "status", "spy")
		return u.GetLabels()["seen"] == "yes" && v == "spied"
	})
}

// Issue 12.13: retries and timeout look ahead: the handler fails at its last allowed
// attempt, not one backoff later.
func TestRetriesAndTimeoutDeclareFailureAtTheLastAllowedAttempt(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	started := now.Add(-50 * time.Second)
	tests := []struct {
		name string
		spec causes.Spec
		rec  state.HandlerRecord
		want Outcome
	}{
		{"third of 3 attempts fails: failed now", causes.Spec{ID: "h", Retries: 3, Backoff: time.Minute}, state.HandlerRecord{Started: &started, Retries: 2}, OutcomeFailure},
		{"second of 3 attempts fails: retried", causes.Spec{ID: "h", Retries: 3, Backoff: time.Minute}, state.HandlerRecord{Started: &started, Retries: 1}, OutcomeRetry},
		{"the next attempt would start after the timeout: failed now", causes.Spec{ID: "h", Timeout: time.Minute, Backoff: 30 * time.Second}, state.HandlerRecord{Started: &started}, OutcomeFailure},
		{"the next attempt is within the timeout: retried", causes.Spec{ID: "h", Timeout: time.Minute, Backoff: 5 * time.Second}, state.HandlerRecord{Started: &started}, OutcomeRetry},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec, got := foldOutcome(tt.spec, tt.rec, now, errBoom)
			if got != tt.want {
				t.Errorf("outcome %s, want %s (record %+v)", got, tt.want, rec)
			}
			if got == OutcomeFailure && (!rec.Failure || rec.Delayed != nil) {
				t.Errorf("a failed handler must be marked failed with no retry scheduled: %+v", rec)
			}
		})
	}
}

// Issue 12.14: delete handlers run while the daemons stop (kopf), and the finalizer
// waits for both.
func TestDeleteHandlersRunWhileDaemonsStop(t *testing.T) {
	h := newFakeHandlers()
	letGo := make(chan struct{})
	h.addDaemon(causes.Spec{ID: "slow_to_stop", Resource: widgets}, func(ctx context.Context, call causes.Call) error {
		<-call.Daemon.Stopped.Done()
		<-letGo // takes its time to clean up
		return nil
	})
	h.add(changeSpec("cleanup", causes.Delete), nil)
	e := startEnv(t, h, Options{})
	e.create("w1", nil)
	e.eventually("the finalizer", func() bool { return slices.Contains(e.get("w1").GetFinalizers(), "luaop.dev/finalizer") })
	e.eventually("the daemon running", func() bool { return e.op.daemons.count() == 1 })
	e.markDeleting("w1")
	e.eventually("the delete handler ran while the daemon is still stopping", func() bool {
		return len(h.callsOf("cleanup", "w1")) == 1
	})
	e.stays("w1", "the finalizer released before the daemon exited", func() bool { return len(e.get("w1").GetFinalizers()) == 0 })
	close(letGo)
	e.eventually("the finalizer released once the daemon exited", func() bool { return len(e.get("w1").GetFinalizers()) == 0 })
	if n := len(h.callsOf("cleanup", "w1")); n != 1 {
		t.Errorf("the delete handler ran %d times", n)
	}
}

// Issue 12.14: a daemon that returned by itself holds no finalizer (kopf releases it).
func TestFinalizerIsReleasedForADaemonThatReturned(t *testing.T) {
	h := newFakeHandlers()
	h.addDaemon(causes.Spec{ID: "one_shot", Resource: widgets}, func(ctx context.Context, call causes.Call) error {
		return nil // done: not restarted
	})
	e := startEnv(t, h, Options{})
	e.create("w1", nil)
	e.eventually("the daemon ran and returned", func() bool { return e.op.daemons.count() == 0 && e.get("w1") != nil })
	e.eventually("no finalizer held for it", func() bool { return len(e.get("w1").GetFinalizers()) == 0 })
}

// A retrying handler sees the user's fix: a cause is only pinned once one of its
// handlers has finished (review of issue 12.1: a pin from the first attempt kept
// giving the bad value to every retry, and the object was stuck for good).
func TestRetryingHandlerSeesTheUsersFix(t *testing.T) {
	h := newFakeHandlers()
	spec := changeSpec("validate_size", causes.Update)
	spec.Field = []string{"spec", "size"}
	h.add(spec, func(ctx context.Context, call causes.Call) (causes.Result, error) {
		if fmt.Sprint(call.Cause.New) == "-1" {
			return causes.Result{}, &causes.TemporaryError{Message: "size must be positive", Delay: 10 * time.Second}
		}
		return causes.Result{}, nil
	})
	h.add(changeSpec("record", causes.Update), nil) // finishes on the bad value
	e := startEnv(t, h, Options{Lifecycle: LifecycleAllAtOnce})
	e.create("w1", map[string]any{"size": int64(1)})
	e.eventually("the creation handled", func() bool {
		_, ok := e.annotations("w1")["luaop.dev/last-handled-configuration"]
		return ok
	})
	e.patch("w1", `{"spec":{"size":-1}}`)
	e.eventually("the bad value refused once", func() bool { return len(h.callsOf("validate_size", "w1")) == 1 })
	e.patch("w1", `{"spec":{"size":5}}`)
	e.eventually("the retry saw the fix", func() bool {
		e.clock.Step(11 * time.Second) // each retry's delay passes, whenever the fix arrived
		for _, c := range h.callsOf("validate_size", "w1") {
			if fmt.Sprint(c.new) == "5" {
				return true
			}
		}
		return false
	})
	e.eventually("the final value handled", func() bool {
		base, _, _ := state.NewAnnotationsDiffBase("luaop.dev").Fetch(e.get("w1").Object)
		v, _ := state.Resolve(base, []string{"spec", "size"})
		return fmt.Sprint(v) == "5"
	})
}

// Prematch evaluates a field handler's filters on its field, and leaves out the old
// and new filters (kopf): a script whose only handler is on.field with a value filter
// still handles its objects (review of issue 12.4).
func TestPrematchUsesTheHandlersFieldAndSkipsOldNewFilters(t *testing.T) {
	h := newFakeHandlers()
	spec := changeSpec("ready_fn", causes.Create, causes.Update)
	spec.Field = []string{"status", "phase"}
	h.add(spec, nil)
	// What luabind does for {value = "Ready"} on a change handler: old or new equals it;
	// and {new = "Ready"}: new equals it, unless prematching.
	h.match["ready_fn"] = func(c causes.Cause) bool {
		if !c.Prematch && fmt.Sprint(c.New) != "Ready" {
			return false
		}
		return fmt.Sprint(c.New) == "Ready" || fmt.Sprint(c.Old) == "Ready" || c.Prematch
	}
	e := startEnv(t, h, Options{})
	e.create("w1", map[string]any{"size": int64(1)})
	e.patch("w1", `{"status":{"phase":"Pending"}}`)
	e.eventually("the object prematched and got a diff-base", func() bool {
		_, ok := e.annotations("w1")["luaop.dev/last-handled-configuration"]
		return ok
	})
	e.patch("w1", `{"status":{"phase":"Ready"}}`)
	e.eventually("the handler ran for Pending -> Ready", func() bool { return len(h.callsOf("ready_fn", "w1")) == 1 })
}

// widgetsCRD is the CustomResourceDefinition of the test widgets: status is a
// subresource and keeps unknown fields, so "auto" storage keeps progress in status.
func widgetsCRD() *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": "widgets.example.luaop.dev"},
		"spec": map[string]any{"group": "example.luaop.dev", "versions": []any{map[string]any{
			"name": "v1", "subresources": map[string]any{"status": map[string]any{}},
			"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "properties": map[string]any{
				"status": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}},
		}}},
	}}
}

// Issue 13: with auto storage and a CRD that keeps it, the bookkeeping goes to status
// (one /status patch per handled change, no annotation).
func TestAutoStorageKeepsProgressInStatusWhenTheSchemaKeepsIt(t *testing.T) {
	h := newFakeHandlers()
	h.add(changeSpec("create_fn", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		return causes.Result{Value: "made"}, nil
	})
	e := startEnv(t, h, Options{}, widgetsCRD())
	e.create("w1", map[string]any{"size": int64(1)})
	e.eventually("the diff-base in status", func() bool {
		_, ok, _ := unstructured.NestedString(e.get("w1").Object, "status", "luaop_dev", "last-handled-configuration")
		return ok
	})
	if a := e.get("w1").GetAnnotations(); len(a) != 0 {
		t.Errorf("annotations written with status storage: %v", a)
	}
	if writes := e.patchesOf(widgetsGVR); writes != 1 {
		t.Errorf("%d patches for one handled creation, want 1", writes)
	}
}

// Issue 13: when the server turns out to prune the status storage (the CRD's schema
// changed), the resource falls back to annotations and what was pruned is written
// there at once: no handler runs again.
func TestPrunedStatusStorageFallsBackToAnnotationsWithoutRunningAgain(t *testing.T) {
	h := newFakeHandlers()
	h.add(changeSpec("create_fn", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		return causes.Result{Value: "made"}, nil
	})
	h.add(changeSpec("update_fn", causes.Update), nil)
	e := startEnvPruning(t, h, Options{}, "luaop_dev", nil, widgetsCRD())
	e.create("w1", map[string]any{"size": int64(1)})
	e.eventually("the diff-base moved to annotations", func() bool {
		_, ok := e.annotations("w1")["luaop.dev/last-handled-configuration"]
		return ok
	})
	e.stays("w1", "the create handler running again", func() bool { return len(h.callsOf("create_fn", "w1")) > 1 })
	e.patch("w1", `{"spec":{"size":2}}`)
	e.eventually("an update handled from the annotations", func() bool { return len(h.callsOf("update_fn", "w1")) == 1 })
	if v, _, _ := unstructured.NestedString(e.get("w1").Object, "status", "create_fn"); v != "made" {
		t.Errorf("the handler's result was lost: %q", v)
	}
}

// A status field declared in the schema but closed (no preserve-unknown-fields) would
// keep an empty map and drop what luaop writes inside: auto storage does not take it.
func TestAutoStorageRefusesADeclaredButClosedStatusField(t *testing.T) {
	crd := widgetsCRD()
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	v := versions[0].(map[string]any)
	_ = unstructured.SetNestedField(v, map[string]any{"type": "object", "properties": map[string]any{
		"luaop_dev": map[string]any{"type": "object"}}}, "schema", "openAPIV3Schema", "properties", "status")
	_ = unstructured.SetNestedSlice(crd.Object, versions, "spec", "versions")
	h := newFakeHandlers()
	h.add(changeSpec("create_fn", causes.Create), nil)
	e := startEnv(t, h, Options{}, crd)
	e.create("w1", map[string]any{"size": int64(1)})
	e.eventually("the diff-base in annotations", func() bool {
		_, ok := e.annotations("w1")["luaop.dev/last-handled-configuration"]
		return ok
	})
}

// An object handled in annotations mode, then updated once the resource keeps its
// bookkeeping in status: the annotation's diff-base is cleared only after the new one
// is written to /status. If that write fails, the object must keep a diff-base (in
// annotations); with none it would be handled as new, its create handlers run again.
func TestSwitchingToStatusStorageClearsTheOldDiffBaseOnlyAfterWritingTheNew(t *testing.T) {
	h := newFakeHandlers()
	h.add(changeSpec("create_fn", causes.Create), nil)
	h.add(changeSpec("update_fn", causes.Update), nil)
	var failStatus atomic.Bool
	var statusTries atomic.Int32
	failStatus.Store(true)
	e := startEnvWith(t, h, Options{}, refuseStatusWhile(&failStatus, &statusTries), widgetsCRD(), annotationsHandled(t, "w1", nil))
	e.eventually("a /status write tried and refused", func() bool { return statusTries.Load() > 0 })
	if _, ok := e.annotations("w1")[state.LastHandledKey("luaop.dev")]; !ok {
		t.Fatalf("the annotation's diff-base was cleared although the new one was never written: %v", e.annotations("w1"))
	}
	failStatus.Store(false)
	e.eventually("the diff-base in status and the annotation's copy cleared", func() bool {
		e.clock.Step(time.Second) // the retry's backoff
		_, inStatus, _ := unstructured.NestedString(e.get("w1").Object, "status", "luaop_dev", "last-handled-configuration")
		_, inAnnotations := e.annotations("w1")[state.LastHandledKey("luaop.dev")]
		return inStatus && !inAnnotations
	})
	handledAsAnUpdate(t, h, "w1")
}

// Status storage set for a kind whose status is no subresource and whose server drops
// the field (a built-in kind, here ConfigMaps): the resource falls back to annotations
// at its first write, and nothing is handled twice.
func TestStatusStorageSetForAKindThatDropsItFallsBackToAnnotations(t *testing.T) {
	h := newFakeHandlers()
	cms := causes.Resource{GroupVersionResource: configmapsGVR}
	h.add(causes.Spec{ID: "create_fn", Kind: causes.KindChange, Resource: cms, Reasons: []causes.Reason{causes.Create}}, nil)
	h.add(causes.Spec{ID: "update_fn", Kind: causes.KindChange, Resource: cms, Reasons: []causes.Reason{causes.Update}}, nil)
	e := startEnvPruning(t, h, Options{ProgressStorage: StorageStatus, DiffBaseStorage: StorageStatus}, "luaop_dev", nil)
	cm := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "c1", "namespace": "default", "uid": "uid-c1"}, "data": map[string]any{"a": "b"}}}
	if _, err := e.dyn.Resource(configmapsGVR).Namespace("default").Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	lastHandled := func() bool {
		u, err := e.dyn.Resource(configmapsGVR).Namespace("default").Get(t.Context(), "c1", metav1.GetOptions{})
		if err != nil {
			return false
		}
		_, ok := u.GetAnnotations()[state.LastHandledKey("luaop.dev")]
		return ok
	}
	e.eventually("the diff-base in annotations", lastHandled)
	e.staysIn(configmapsGVR, "c1", "the create handler running again", func() bool { return len(h.callsOf("create_fn", "c1")) > 1 })
	if _, err := e.dyn.Resource(configmapsGVR).Namespace("default").Patch(t.Context(), "c1", types.MergePatchType,
		[]byte(`{"data":{"a":"c"}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("the update handled", func() bool { return len(h.callsOf("update_fn", "c1")) == 1 })
	e.staysIn(configmapsGVR, "c1", "a handler running again", func() bool {
		return len(h.callsOf("create_fn", "c1")) != 1 || len(h.callsOf("update_fn", "c1")) != 1
	})
}

// handledAsAnUpdate: an object handled before got its change as an update, never as
// a creation.
func handledAsAnUpdate(t *testing.T, h *fakeHandlers, name string) {
	t.Helper()
	if n := len(h.callsOf("create_fn", name)); n != 0 {
		t.Errorf("the create handler ran %d times on an object handled before", n)
	}
	if n := len(h.callsOf("update_fn", name)); n == 0 {
		t.Errorf("the update handler never ran")
	}
}

// refuseStatusWhile makes the fake server refuse the widgets' /status writes while
// refuse is set, counting them in tries.
func refuseStatusWhile(refuse *atomic.Bool, tries *atomic.Int32) func(*dynamicfake.FakeDynamicClient) {
	return func(dyn *dynamicfake.FakeDynamicClient) {
		dyn.PrependReactor("patch", "widgets", func(a clienttesting.Action) (bool, runtime.Object, error) {
			if a.GetSubresource() != "status" || !refuse.Load() {
				return false, nil, nil
			}
			tries.Add(1)
			return true, nil, apierrors.NewServiceUnavailable("the API server is restarting")
		})
	}
}

// annotationsHandled is a Widget handled in annotations mode with spec.size 1, now at
// size 2, holding the progress records given (if any) in annotations too.
func annotationsHandled(t *testing.T, name string, records map[string]state.HandlerRecord) *unstructured.Unstructured {
	t.Helper()
	obj := handledInAnnotations(t, widgetObject(name, "uid-"+name, map[string]any{"size": int64(1)}), records)
	obj.Object["spec"] = map[string]any{"size": int64(2)} // changed since it was handled
	return obj
}

// handledInAnnotations gives obj the annotations luaop writes once it has handled obj as
// it is now, in annotations mode: its diff-base and the progress records given.
func handledInAnnotations(t *testing.T, obj *unstructured.Unstructured, records map[string]state.HandlerRecord) *unstructured.Unstructured {
	t.Helper()
	p := state.NewPatch()
	if err := state.NewAnnotationsDiffBase("luaop.dev").Store(nil, p, state.Essence(obj.Object, "luaop.dev")); err != nil {
		t.Fatal(err)
	}
	for id, rec := range records {
		state.NewAnnotationsProgress("luaop.dev").Store(nil, p, id, rec)
	}
	annotations := map[string]string{}
	for k, v := range p.Map()["metadata"].(map[string]any)["annotations"].(map[string]any) {
		annotations[k] = v.(string)
	}
	obj.SetAnnotations(annotations)
	return obj
}

// The same switch with a handler being retried: update_a failed twice (recorded in
// annotations) before the resource kept its bookkeeping in status. Its next record goes
// to status and the annotation's copy is cleared only after: a refused /status write
// must not lose the record, or update_a's retries would count from 0 again.
func TestSwitchingToStatusStorageKeepsARecordUntilItIsWrittenAgain(t *testing.T) {
	h := newFakeHandlers()
	h.add(changeSpec("update_a", causes.Update), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		return causes.Result{}, &causes.TemporaryError{Message: "not yet", Delay: time.Second}
	})
	started := time.Date(2026, 11, 30, 11, 0, 0, 0, time.UTC)
	old := annotationsHandled(t, "w1", map[string]state.HandlerRecord{
		"update_a": {Started: &started, Retries: 2, Purpose: "update", Message: "not yet"}})
	var failStatus atomic.Bool
	var statusTries atomic.Int32
	failStatus.Store(true)
	e := startEnvWith(t, h, Options{}, refuseStatusWhile(&failStatus, &statusTries), widgetsCRD(), old)
	e.eventually("a /status write tried and refused", func() bool { return statusTries.Load() > 0 })
	failStatus.Store(false)
	e.eventually("update_a tried 3 times", func() bool {
		e.clock.Step(time.Second) // the retries' delays
		return len(h.callsOf("update_a", "w1")) >= 3
	})
	for i, c := range h.callsOf("update_a", "w1") {
		if c.retry < 2 {
			t.Errorf("attempt %d of update_a counted as retry %d: its record of 2 failures was lost", i+1, c.retry)
		}
	}
}

// The switch to status storage on a server that prunes it: the resource falls back to
// annotations in the same cycle, and the diff-base moved there stays (the removal of
// the annotation's old copy, meant for after the /status write, is not sent).
func TestSwitchingToPrunedStatusStorageKeepsTheDiffBaseMovedBack(t *testing.T) {
	h := newFakeHandlers()
	h.add(changeSpec("create_fn", causes.Create), nil)
	h.add(changeSpec("update_fn", causes.Update), nil)
	e := startEnvPruning(t, h, Options{}, "luaop_dev", nil, widgetsCRD(), annotationsHandled(t, "w1", nil))
	e.eventually("the update handled", func() bool { return len(h.callsOf("update_fn", "w1")) == 1 })
	e.stays("w1", "a handler running again", func() bool {
		return len(h.callsOf("update_fn", "w1")) != 1 || len(h.callsOf("create_fn", "w1")) != 0
	})
	encoded := e.annotations("w1")[state.LastHandledKey("luaop.dev")]
	if !strings.Contains(encoded, `"size":2`) {
		t.Errorf("the annotation's diff-base is %q, want the handled spec (size 2)", encoded)
	}
}

// Status storage set for a kind that drops it, on an object handled in annotations
// before: the first write (status, dropped) must not also remove the annotation's
// diff-base, or a failure of the follow-up write that moves the bookkeeping back
// would leave none, and the object would be handled as new.
func TestStatusStorageFallbackKeepsTheOldDiffBaseUntilTheMoveIsWritten(t *testing.T) {
	h := newFakeHandlers()
	cms := causes.Resource{GroupVersionResource: configmapsGVR}
	h.add(causes.Spec{ID: "create_fn", Kind: causes.KindChange, Resource: cms, Reasons: []causes.Reason{causes.Create}}, nil)
	h.add(causes.Spec{ID: "update_fn", Kind: causes.KindChange, Resource: cms, Reasons: []causes.Reason{causes.Update}}, nil)
	cm := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "c1", "namespace": "default", "uid": "uid-c1"}, "data": map[string]any{"a": "b"}}}
	handledInAnnotations(t, cm, nil)
	key := state.LastHandledKey("luaop.dev")
	cm.Object["data"] = map[string]any{"a": "c"} // changed since it was handled
	var refusedMove atomic.Bool
	e := startEnvPruning(t, h, Options{ProgressStorage: StorageStatus, DiffBaseStorage: StorageStatus}, "luaop_dev",
		func(dyn *dynamicfake.FakeDynamicClient) {
			dyn.PrependReactor("patch", "configmaps", func(a clienttesting.Action) (bool, runtime.Object, error) {
				pa := a.(clienttesting.PatchAction)
				if strings.Contains(string(pa.GetPatch()), `"status"`) || refusedMove.Load() {
					return false, nil, nil
				}
				refusedMove.Store(true) // the first write without status: the move, refused once
				return true, nil, apierrors.NewServiceUnavailable("the API server is restarting")
			})
		}, cm)
	e.eventually("the move refused once, then the diff-base of the change in annotations", func() bool {
		e.clock.Step(time.Second) // the retry's backoff
		u, err := e.dyn.Resource(configmapsGVR).Namespace("default").Get(t.Context(), "c1", metav1.GetOptions{})
		return err == nil && refusedMove.Load() && strings.Contains(u.GetAnnotations()[key], `"a":"c"`)
	})
	handledAsAnUpdate(t, h, "c1")
}

// Progress in status, diff-base in annotations (set so): the cycle that ends a cause
// sends the records' removal (/status) before the new diff-base (the object). The other
// way round, a refused /status write left the object holding the new diff-base beside
// update_a's record of success: an operator restarted then (its memory of the cause
// gone) would skip update_a at the next change as already done.
func TestMixedStorageEndsACauseWithTheDiffBaseWrittenLast(t *testing.T) {
	h := newFakeHandlers()
	h.add(changeSpec("update_a", causes.Update), nil)
	var bTries atomic.Int32
	h.add(changeSpec("update_b", causes.Update), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		if bTries.Add(1) == 1 {
			return causes.Result{}, &causes.TemporaryError{Message: "not yet", Delay: time.Second}
		}
		return causes.Result{}, nil
	})
	var refused atomic.Int32
	var staleBesideNew atomic.Bool
	e := startEnvWith(t, h, Options{ProgressStorage: StorageStatus, DiffBaseStorage: StorageAnnotations},
		func(dyn *dynamicfake.FakeDynamicClient) {
			dyn.PrependReactor("patch", "widgets", func(a clienttesting.Action) (bool, runtime.Object, error) {
				// The /status write that removes update_a's record (the cause's end), once.
				p := string(a.(clienttesting.PatchAction).GetPatch())
				if a.GetSubresource() != "status" || !strings.Contains(p, `"remove"`) || !strings.Contains(p, "update_a") ||
					!refused.CompareAndSwap(0, 1) {
					return false, nil, nil
				}
				// What the object holds as this write fails: what a restarted operator reads.
				if stored, err := dyn.Tracker().Get(widgetsGVR, "default", "w1"); err == nil {
					u := stored.(*unstructured.Unstructured)
					_, record, _ := unstructured.NestedMap(u.Object, "status", "luaop_dev", "progress", "update_a")
					if record && strings.Contains(u.GetAnnotations()[state.LastHandledKey("luaop.dev")], `"size":2`) {
						staleBesideNew.Store(true)
					}
				}
				return true, nil, apierrors.NewServiceUnavailable("the API server is restarting")
			})
		}, widgetsCRD(), annotationsHandled(t, "w1", nil))
	e.eventually("the cause's last /status write refused, then the cause done", func() bool {
		e.clock.Step(time.Second) // update_b's retry, and the retry of the refused cycle
		return refused.Load() == 1 && bTries.Load() >= 2 &&
			strings.Contains(e.annotations("w1")[state.LastHandledKey("luaop.dev")], `"size":2`)
	})
	if staleBesideNew.Load() {
		t.Errorf("when the cause's last /status write failed, the object held the new diff-base beside update_a's record of success")
	}
	e.settleIn(widgetsGVR, "w1")
	e.patch("w1", `{"spec":{"size":3}}`)
	e.eventually("the next change reaches update_a", func() bool {
		e.clock.Step(time.Second)
		return len(h.callsOf("update_a", "w1")) == 2
	})
}

// A parent that drops a subhandler it registered earlier in the same cause (its items
// changed meanwhile): the cause's end still purges that subhandler's record (kopf keeps
// the union of every child registered). Left behind, a record of success would have
// the subhandler skipped the next time the parent registers it.
func TestSubhandlersDroppedByTheParentArePurgedWithTheCause(t *testing.T) {
	h := newFakeHandlers()
	h.add(changeSpec("parent", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		spec, _ := call.Cause.Body["spec"].(map[string]any)
		items, _ := spec["items"].([]any)
		var subs []causes.Spec
		for _, item := range items {
			subs = append(subs, changeSpec("parent/"+item.(string), causes.Create))
		}
		return causes.Result{Subhandlers: subs}, nil
	})
	var aTries atomic.Int32
	h.mu.Lock()
	h.fns["parent/a"] = func(ctx context.Context, call causes.Call) (causes.Result, error) {
		if aTries.Add(1) <= 2 { // once before the parent drops b, once after
			return causes.Result{}, &causes.TemporaryError{Message: "not yet", Delay: time.Minute}
		}
		return causes.Result{}, nil
	}
	h.mu.Unlock()
	e := startEnv(t, h, Options{})
	e.create("w1", map[string]any{"items": []any{"a", "b"}})
	e.eventually("a failed once, b succeeded", func() bool {
		return aTries.Load() == 1 && len(h.callsOf("parent/b", "w1")) == 1
	})
	e.settleIn(widgetsGVR, "w1")
	e.patch("w1", `{"spec":{"items":["a"]}}`)
	e.eventually("the cause done", func() bool {
		e.clock.Step(time.Minute) // a's retry
		_, done := e.annotations("w1")[state.LastHandledKey("luaop.dev")]
		return done && aTries.Load() == 3
	})
	e.settleIn(widgetsGVR, "w1")
	for key := range e.annotations("w1") {
		if strings.Contains(key, "parent") {
			t.Errorf("a record left after the cause: %s", key)
		}
	}
}

// A handler on metadata.annotations: luaop's own annotations (its progress, its
// diff-base) are not part of what it watches. Read with them, every write of luaop's
// records was a change of the field: the handler ran again and again, and each stored
// diff-base held the previous one.
func TestAHandlerOnAnnotationsDoesNotSeeLuaopsOwn(t *testing.T) {
	h := newFakeHandlers()
	h.add(changeSpec("create_fn", causes.Create), nil)
	annotationsSpec := changeSpec("annotations_fn", causes.Update)
	annotationsSpec.Field = []string{"metadata", "annotations"}
	h.add(annotationsSpec, nil)
	e := startEnv(t, h, Options{})
	e.create("w1", map[string]any{"size": int64(1)})
	e.eventually("the creation handled", func() bool {
		_, ok := e.annotations("w1")[state.LastHandledKey("luaop.dev")]
		return ok
	})
	e.patch("w1", `{"metadata":{"annotations":{"team":"a"}}}`)
	e.eventually("the annotation's change handled", func() bool { return len(h.callsOf("annotations_fn", "w1")) >= 1 })
	e.stays("w1", "the handler running again on luaop's own writes", func() bool { return len(h.callsOf("annotations_fn", "w1")) > 1 })
	if stored := e.annotations("w1")[state.LastHandledKey("luaop.dev")]; strings.Contains(stored, "luaop.dev/") {
		t.Errorf("the stored diff-base holds luaop's own annotations: %s", stored)
	}
	if c := h.callsOf("annotations_fn", "w1"); len(c) == 1 {
		if want := map[string]any{"team": "a"}; !reflect.DeepEqual(c[0].new, want) {
			t.Errorf("the handler saw the annotations %v, want %v", c[0].new, want)
		}
	}
}
