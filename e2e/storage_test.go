package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/processing"
	"github.com/luaop/luaop/testcluster"
)

// Issue 13: with no storage setting, a custom resource whose status is a subresource
// and keeps unknown fields gets its bookkeeping in status: a handled creation is one
// write (the object changes once), and the choice is logged with its reason. A CRD
// whose status schema would prune it stays on annotations, with the reason.
func TestDefaultStorageIsOneStatusPatchWhereTheSchemaKeepsIt(t *testing.T) {
	ns := env.Namespace(t)
	op := startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx) return "done" end, { id = "once" })
		luaop.on.create("e2e.luaop.dev/v1/strictthings", function(ctx) ctx.patch.status.phase = "Made" end, { id = "strict" })
	`)})
	obj := create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1}}")
	modified := modificationsWithin(t, widgets, ns, obj, 2*time.Second)
	got := get(t, widgets, ns, "w")
	if modified != 1 {
		t.Errorf("the object changed %d times after its creation, want once (one /status patch)", modified)
	}
	if base, ok := diffBaseOf(got); !ok || len(got.GetAnnotations()) != 0 {
		t.Errorf("want the diff-base in status and no annotation: diff-base %q, annotations %v", base, got.GetAnnotations())
	}
	logs := op.Log.String()
	if !strings.Contains(logs, `msg="storage chosen" resource=examples.luaop.dev/v1/widgets storage=status`) {
		t.Errorf("the choice for widgets is not logged as status:\n%s", logs)
	}
	if !strings.Contains(logs, `msg="storage chosen" resource=e2e.luaop.dev/v1/strictthings storage=annotations reason="the status schema would prune`) {
		t.Errorf("the choice for strict things is not logged as annotations with its reason:\n%s", logs)
	}
	create(t, strictThings, ns, "{apiVersion: e2e.luaop.dev/v1, kind: StrictThing, metadata: {name: s}, spec: {size: 1}}")
	waitHandled(t, strictThings, ns, "s", `{"spec":{"size":1}}`)
	if _, ok := get(t, strictThings, ns, "s").GetAnnotations()["luaop.dev/last-handled-configuration"]; !ok {
		t.Errorf("strict things keep their diff-base in annotations")
	}
}

// Issue 13: switching storage (an upgrade to the new default, or a setting changed)
// never runs a handler again: objects handled in one storage are read from it by an
// operator using the other, and their bookkeeping moves on the next change.
func TestSwitchingStorageNeverRunsAHandlerAgain(t *testing.T) {
	env.Require(t)
	for _, from := range []processing.StorageMode{processing.StorageAnnotations, processing.StorageStatus} {
		to := processing.StorageStatus
		if from == processing.StorageStatus {
			to = processing.StorageAnnotations
		}
		t.Run(fmt.Sprintf("%s to %s", from, to), func(t *testing.T) {
			ns := env.Namespace(t)
			src := `
				local luaop = require("luaop")
				luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx)
					ctx.logger.info("RUN create " .. ctx.name)
					return "made"
				end, { id = "made" })
				luaop.on.update("examples.luaop.dev/v1/widgets", function(ctx)
					ctx.logger.info("RUN update " .. ctx.name)
					return ctx.spec.size
				end, { id = "updated" })
			`
			mode := func(m processing.StorageMode) operator.Options {
				return operator.Options{Scripts: script(src), Processing: processing.Options{ProgressStorage: m, DiffBaseStorage: m}}
			}
			first := startWith(t, ns, mode(from))
			for i := 0; i < 5; i++ {
				create(t, widgets, ns, fmt.Sprintf("{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w%d}, spec: {size: 1}}", i))
			}
			for i := 0; i < 5; i++ {
				waitHandled(t, widgets, ns, fmt.Sprintf("w%d", i), `{"spec":{"size":1}}`)
			}
			if err := first.Stop(); err != nil {
				t.Fatal(err)
			}
			second := startWith(t, ns, mode(to))
			// One object's events are handled in order: once a later change of each
			// object is handled, anything the switch itself would have run has run.
			for i := 0; i < 5; i++ {
				mergePatch(t, widgets, ns, fmt.Sprintf("w%d", i), `{"spec":{"size":2}}`)
			}
			for i := 0; i < 5; i++ {
				name := fmt.Sprintf("w%d", i)
				waitField(t, widgets, ns, name, "status.updated", int64(2))
				// With annotations storage the handler's result (status, a subresource)
				// and the diff-base (annotations) are two writes: wait for both.
				testcluster.Eventually(t, 20*time.Second, func() (bool, string) {
					obj, err := env.Dynamic.Resource(widgets).Namespace(ns).Get(t.Context(), name, metav1.GetOptions{})
					if err != nil {
						return false, err.Error()
					}
					_, inAnnotations := obj.GetAnnotations()["luaop.dev/last-handled-configuration"]
					return inAnnotations == (to == processing.StorageAnnotations),
						fmt.Sprintf("after the change %s's diff-base is in annotations: %v, want %v", name, inAnnotations, to == processing.StorageAnnotations)
				})
			}
			logs := second.Log.String()
			if n := strings.Count(logs, "RUN create"); n != 0 {
				t.Errorf("%d creation handler runs after switching storage, want none:\n%s", n, logs)
			}
			for i := 0; i < 5; i++ {
				if n := strings.Count(logs, fmt.Sprintf(`RUN update w%d"`, i)); n != 1 {
					t.Errorf("the update handler ran %d times for w%d after switching storage and one change, want 1:\n%s", n, i, logs)
				}
			}
		})
	}
}
