package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/processing"
	"github.com/luaop/luaop/testcluster"
)

// patchGadget merge-patches the gadget ns/name.
func patchGadget(t *testing.T, ns, name, patch string) {
	t.Helper()
	if _, err := env.Dynamic.Resource(gadgets).Namespace(ns).Patch(t.Context(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("patching %s: %v", name, err)
	}
}

// annotationsBytes is the size of the gadget's annotations, keys and values.
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
