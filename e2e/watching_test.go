package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/state"
	"github.com/luaop/luaop/testcluster"
)

// A resource whose CRD is installed after the operator started is picked up without
// a restart.
func TestCRDInstalledAfterStartIsPickedUp(t *testing.T) {
	ns := env.Namespace(t)
	group := fmt.Sprintf("late%d.e2e.luaop.dev", rand.IntN(1_000_000))
	gvr := schema.GroupVersionResource{Group: group, Version: "v1", Resource: "latecomers"}
	op := startWithoutWaiting(t, ns, operator.Options{Scripts: script(fmt.Sprintf(`
		local luaop = require("luaop")
		luaop.on.create("%s/v1/latecomers", function(ctx) return "seen" end, { id = "late" })
	`, group))})
	testcluster.Eventually(t, 10*time.Second, func() (bool, string) {
		return strings.Contains(op.Log.String(), "is its CRD installed?"), "waiting for the operator to say the resource is missing"
	})
	crd := fmt.Sprintf(`{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition",
		"metadata":{"name":"latecomers.%[1]s"},
		"spec":{"group":"%[1]s","scope":"Namespaced","names":{"plural":"latecomers","singular":"latecomer","kind":"Latecomer"},
		"versions":[{"name":"v1","served":true,"storage":true,"subresources":{"status":{}},
		"schema":{"openAPIV3Schema":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}]}}`, group)
	docs, _ := testcluster.DecodeYAML(strings.NewReader(crd))
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	if _, err := env.Dynamic.Resource(crdGVR).Create(t.Context(), docs[0], metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Dynamic.Resource(crdGVR).Delete(context.Background(), docs[0].GetName(), metav1.DeleteOptions{})
	})
	testcluster.Eventually(t, 20*time.Second, func() (bool, string) {
		_, err := env.Dynamic.Resource(gvr).Namespace(ns).Create(t.Context(), mustYAML(t,
			fmt.Sprintf("{apiVersion: %s/v1, kind: Latecomer, metadata: {name: l1}}", group)), metav1.CreateOptions{})
		return err == nil, fmt.Sprintf("creating the first object: %v", err)
	})
	testcluster.Eventually(t, 20*time.Second, func() (bool, string) {
		obj, err := env.Dynamic.Resource(gvr).Namespace(ns).Get(t.Context(), "l1", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		st, _ := obj.Object["status"].(map[string]any)
		return st["late"] == "seen", "waiting for status.late"
	})
}

// Progress can live in status instead of annotations; a resource can be named by its
// short name.
func TestStatusProgressStorageAndShortNames(t *testing.T) {
	ns := env.Namespace(t)
	startWith(t, ns, operator.Options{
		Processing: processingWith(state.NewStatusProgress("luaop")),
		Scripts: script(`
		local luaop = require("luaop")
		luaop.on.create("examples.luaop.dev/v1/wg", function(ctx)
			if ctx.retry == 0 then error(luaop.temporary_error("again", 0.2)) end
			return ctx.retry
		end, { id = "counted" })
	`)})
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1}}")
	obj := waitField(t, widgets, ns, "w", "status.counted", int64(1))
	for k := range obj.GetAnnotations() {
		if strings.HasPrefix(k, "luaop.dev/counted") {
			t.Errorf("progress written to annotation %s although status storage was chosen", k)
		}
	}
}

// With progress and diff-base both in status, handling a creation costs one /status
// patch: the object changes exactly once after it was created.
func TestStatusStorageMakesOnePatchPerCreation(t *testing.T) {
	ns := env.Namespace(t)
	opts := processingWith(state.NewStatusProgress("luaop"))
	opts.DiffBase = state.NewStatusDiffBase("luaop")
	startWith(t, ns, operator.Options{Processing: opts, Scripts: script(`
		local luaop = require("luaop")
		luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx) return "done" end, { id = "once" })
	`)})
	obj := create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1}}")
	modified := modificationsWithin(t, widgets, ns, obj, 2*time.Second)
	got := get(t, widgets, ns, "w")
	st, _ := got.Object["status"].(map[string]any)
	if st["once"] != "done" {
		t.Fatalf("status = %v, want the handler's result", st)
	}
	if modified != 1 {
		t.Errorf("the object was modified %d times after its creation, want once (one /status patch)", modified)
	}
	// And the diff-base works from status: a spec change is an update, not a creation.
	if _, ok := st["luaop"].(map[string]any)["last-handled-configuration"]; !ok {
		t.Errorf("no diff-base in status: %v", st)
	}
}
