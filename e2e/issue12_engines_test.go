package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/processing"
	"github.com/luaop/luaop/testcluster"
)

func patchGadget(t *testing.T, ns, name, patch string) {
	t.Helper()
	if _, err := env.Dynamic.Resource(gadgets).Namespace(ns).Patch(t.Context(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("patching %s: %v", name, err)
	}
}

func annotationsBytes(t *testing.T, ns, name string) int {
	n := 0
	for k, v := range get(t, gadgets, ns, name).GetAnnotations() {
		n += len(k) + len(v)
	}
	return n
}

// Issue 12.5: two operators with different prefixes fed on each other's annotations
// (each one's diff-base held the other's storage): the annotations grew at every
// round and the update handlers ran on every event. Each prefix now marks itself
// (<prefix>/luaop-managed) and marked prefixes are not part of the essence.
func TestTwoOperatorsWithDifferentPrefixesDoNotFeedOnEachOther(t *testing.T) {
	ns := env.Namespace(t)
	var ops [2]*testcluster.RunningOperator
	for i, who := range []string{"a", "b"} {
		ops[i] = startWith(t, ns, operator.Options{
			Processing: processing.Options{Prefix: who + ".luaop.dev"},
			Scripts: script(fmt.Sprintf(`
			local luaop = require("luaop")
			local R = "e2e.luaop.dev/v1/gadgets"
			luaop.on.create(R, function(ctx) ctx.logger.info("CREATE-%[1]s") end, {id = "create_%[1]s"})
			luaop.on.update(R, function(ctx) ctx.logger.info("UPDATE-%[1]s " .. tostring(ctx.spec.size) .. " " .. ((ctx.body.metadata.labels or {}).round or "-")) end, {id = "update_%[1]s"})
		`, who))})
	}
	runs := func(i int, what string) int { return strings.Count(ops[i].Log.String(), what) }
	both := func(what string, n int) {
		t.Helper()
		testcluster.Eventually(t, 20*time.Second, func() (bool, string) {
			a, b := runs(0, what+"-a"), runs(1, what+"-b")
			return a >= n && b >= n, fmt.Sprintf("%s ran a=%d b=%d times, want %d", what, a, b, n)
		})
	}
	// handled waits until both operators stored want in their diff-bases. Each
	// operator handles the gadget's events in order: once both handled a later change,
	// each has seen the other's writes of the earlier one, and a run they caused (the
	// bug: operators feeding on each other) would be counted below.
	handled := func(want string) {
		t.Helper()
		testcluster.Eventually(t, 20*time.Second, func() (bool, string) {
			ann := get(t, gadgets, ns, "g").GetAnnotations()
			a, b := ann["a.luaop.dev/last-handled-configuration"], ann["b.luaop.dev/last-handled-configuration"]
			return strings.Contains(a, want) && strings.Contains(b, want), fmt.Sprintf("waiting for both diff-bases to hold %s: a=%s b=%s", want, a, b)
		})
	}
	create(t, gadgets, ns, "{apiVersion: e2e.luaop.dev/v1, kind: Gadget, metadata: {name: g}, spec: {size: 1}}")
	both("CREATE", 1)
	handled(`"size":1`)
	patchGadget(t, ns, "g", `{"spec":{"size":2}}`)
	both("UPDATE", 1)
	handled(`"size":2`)
	base := annotationsBytes(t, ns, "g")
	var sizes []int
	for i := 0; i < 5; i++ {
		patchGadget(t, ns, "g", fmt.Sprintf(`{"metadata":{"labels":{"round":"r%d"}}}`, i))
		handled(fmt.Sprintf(`"round":"r%d"`, i))
		sizes = append(sizes, annotationsBytes(t, ns, "g"))
	}
	// Label changes are essential: each one is an update of both; what must not
	// happen is a run caused by the other operator's writes. A last change is the
	// barrier for the writes of the fifth round.
	patchGadget(t, ns, "g", `{"metadata":{"labels":{"round":"last"}}}`)
	handled(`"round":"last"`)
	ann := get(t, gadgets, ns, "g").GetAnnotations()
	for _, p := range []string{"a.luaop.dev", "b.luaop.dev"} {
		if ann[p+"/luaop-managed"] != "yes" {
			t.Errorf("no marker %s/luaop-managed: %v", p, ann)
		}
		if strings.Contains(ann[p+"/last-handled-configuration"], ".luaop.dev/") {
			t.Errorf("%s's diff-base holds an operator's annotations: %s", p, ann[p+"/last-handled-configuration"])
		}
	}
	for i, who := range []string{"a", "b"} {
		if n := runs(i, "CREATE-"+who); n != 1 {
			t.Errorf("create_%s ran %d times", who, n)
		}
		if n := runs(i, "UPDATE-"+who+" 2 -"); n != 1 {
			t.Errorf("update_%s ran %d times for the spec change", who, n)
		}
		for r := 0; r < 5; r++ {
			if n := runs(i, fmt.Sprintf("UPDATE-%s 2 r%d", who, r)); n != 1 {
				t.Errorf("update_%s ran %d times for the label change r%d, want once", who, n, r)
			}
		}
		if n := runs(i, "UPDATE-"+who); n != 7 {
			t.Errorf("update_%s ran %d times for one spec change and 6 label changes, want 7", who, n)
		}
	}
	for _, s := range sizes {
		if s > base+200 { // the two diff-bases hold the label (about 25 bytes each), nothing grows
			t.Errorf("annotations grow: %d bytes after the update, then %v", base, sizes)
			break
		}
	}
	if sizes[4] != sizes[1] {
		t.Errorf("annotations are not stable: %d bytes after the update, then %v", base, sizes)
	}
}

// Issue 12.16: an object being deleted stays in the indexes until it is gone (kopf
// keeps it until the DELETED event): handlers still find it while another finalizer
// holds it, and no longer once it is gone.
func TestDeletingObjectIsFoundInItsIndexUntilGone(t *testing.T) {
	ns := env.Namespace(t)
	op := startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		local R = "e2e.luaop.dev/v1/gadgets"
		luaop.index(R, function(ctx) return {[ctx.name] = ctx.spec.size} end, {id = "sizes"})
		luaop.on.delete(R, function(ctx)
			local found = ctx.indexes.sizes[ctx.name]
			ctx.logger.info("DELETE-SEES " .. tostring(found and #found or 0))
		end, {id = "cleanup"})
		luaop.on.event("v1/configmaps", function(ctx)
			if ctx.type == "DELETED" then return end
			local found = ctx.indexes.sizes[ctx.body.data.gadget]
			ctx.logger.info("LOOKUP " .. ctx.name .. " " .. tostring(found and #found or 0))
		end, {id = "lookup"})
	`)})
	create(t, gadgets, ns, "{apiVersion: e2e.luaop.dev/v1, kind: Gadget, metadata: {name: g, finalizers: [e2e.luaop.dev/hold]}, spec: {size: 3}}")
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		f := get(t, gadgets, ns, "g").GetFinalizers()
		return len(f) == 2, fmt.Sprintf("waiting for luaop's finalizer: %v", f)
	})
	if err := env.Dynamic.Resource(gadgets).Namespace(ns).Delete(t.Context(), "g", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	logged := func(what string) {
		t.Helper()
		testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
			return strings.Contains(op.Log.String(), what), "no log line " + what
		})
	}
	logged("DELETE-SEES 1")
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		f := get(t, gadgets, ns, "g").GetFinalizers()
		return len(f) == 1, fmt.Sprintf("waiting for luaop to release its finalizer: %v", f)
	})
	lookup := func(name string) {
		t.Helper()
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"gadget": "g"}}
		if _, err := env.Kube.CoreV1().ConfigMaps(ns).Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	lookup("while-deleting")
	logged("LOOKUP while-deleting 1")
	patchGadget(t, ns, "g", `{"metadata":{"finalizers":null}}`)
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		_, err := env.Dynamic.Resource(gadgets).Namespace(ns).Get(t.Context(), "g", metav1.GetOptions{})
		return err != nil, "the gadget is still there"
	})
	// The DELETED event reaches the operator some time after the gadget is gone:
	// look it up again (a new ConfigMap each time) until the index no longer has it.
	i := 0
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		i++
		name := fmt.Sprintf("after-gone-%d", i)
		lookup(name)
		logged("LOOKUP " + name + " ")
		return strings.Contains(op.Log.String(), "LOOKUP "+name+" 0"), "the index still finds the gone gadget"
	})
}

// Issue 12.16: ctx.logger messages at info and above are posted as Events of the
// object (kopf's object logger); debug ones are not (the default level is info).
func TestLoggerInfoIsPostedAsAnEventOfTheObject(t *testing.T) {
	ns := env.Namespace(t)
	post := true
	startWith(t, ns, operator.Options{
		Processing: processing.Options{PostEvents: &post},
		Scripts: script(`
		local luaop = require("luaop")
		luaop.on.create("e2e.luaop.dev/v1/gadgets", function(ctx)
			ctx.logger.debug("quiet detail")
			ctx.logger.info("provisioned", ctx.spec.size)
			ctx.logger.warn("running low")
		end, {id = "provision"})
	`)})
	create(t, gadgets, ns, "{apiVersion: e2e.luaop.dev/v1, kind: Gadget, metadata: {name: g}, spec: {size: 3}}")
	var seen []string
	testcluster.Eventually(t, 20*time.Second, func() (bool, string) {
		list, err := env.Kube.CoreV1().Events(ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		seen = nil
		for _, e := range list.Items {
			if e.InvolvedObject.Name == "g" && e.InvolvedObject.Kind == "Gadget" && e.Reason == "Logging" {
				seen = append(seen, e.Type+" "+e.Message)
			}
		}
		has := func(s string) bool {
			for _, x := range seen {
				if x == s {
					return true
				}
			}
			return false
		}
		return has("Normal provisioned 3") && has("Warning running low"), fmt.Sprintf("Logging Events of the gadget: %q", seen)
	})
	for _, x := range seen {
		if strings.Contains(x, "quiet detail") {
			t.Errorf("a debug message was posted: %q", seen)
		}
	}
}
