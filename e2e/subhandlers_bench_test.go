package e2e

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/luaop/luaop/operator"
)

// BenchmarkSubhandlersOnCluster: one widget whose create handler (Lua) registers
// 3,000 subhandlers (LUAOP_BENCH_SUBHANDLERS), run by a real operator on the real
// API server under kopf's asap lifecycle: one subhandler per cycle, each outcome
// written (one /status patch, the records in status) before the next cycle, which
// that write's watch event starts. Reports cycles per second over the first
// LUAOP_BENCH_CYCLES subhandler runs (default: all), the object's size then, and
// what one small write of that object costs on its own (ms/write, the API server's
// round trip, operator stopped).
//
//	localcluster/with-cluster.sh go test -run XXX -bench SubhandlersOnCluster -benchtime 1x ./e2e/
func BenchmarkSubhandlersOnCluster(b *testing.B) {
	n := 3000
	if v, err := strconv.Atoi(os.Getenv("LUAOP_BENCH_SUBHANDLERS")); err == nil && v > 0 {
		n = v
	}
	cycles := n
	if v, err := strconv.Atoi(os.Getenv("LUAOP_BENCH_CYCLES")); err == nil && v > 0 && v < n {
		cycles = v
	}
	for range b.N {
		ns := env.Namespace(b)
		op := env.StartOperator(b, ns, operator.Options{Scripts: script(fmt.Sprintf(`
			local luaop = require("luaop")
			luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx)
				for i = 1, %d do ctx.subhandler(function() end, {id = "c" .. i}) end
			end, { id = "parent" })
		`, n))})
		start := time.Now()
		if _, err := env.Dynamic.Resource(widgets).Namespace(ns).Create(b.Context(), mustYAML(b,
			"{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1}}"), metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		var obj *unstructured.Unstructured
		for {
			var err error
			obj, err = env.Dynamic.Resource(widgets).Namespace(ns).Get(b.Context(), "w", metav1.GetOptions{})
			if err != nil {
				b.Fatal(err)
			}
			done := 0
			if progress, ok, _ := unstructured.NestedMap(obj.Object, "status", "luaop_dev", "progress"); ok {
				for id, rec := range progress {
					if m, _ := rec.(map[string]any); strings.HasPrefix(id, "parent/") && m["success"] == true {
						done++
					}
				}
			}
			if _, handled := diffBaseOf(obj); handled || done >= cycles {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		took := time.Since(start)
		_ = op.Stop()
		raw, _ := obj.MarshalJSON()
		b.ReportMetric(float64(cycles)/took.Seconds(), "cycles/s")
		b.ReportMetric(float64(len(raw)), "object-bytes")
		// What one write of the object costs by itself, operator stopped: a small
		// patch of its /status, as a cycle sends, answered with the whole object.
		const writes = 20
		t0 := time.Now()
		for i := range writes {
			if _, err := env.Dynamic.Resource(widgets).Namespace(ns).Patch(b.Context(), "w", types.MergePatchType,
				fmt.Appendf(nil, `{"status":{"benchWrite":%d}}`, i), metav1.PatchOptions{}, "status"); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(time.Since(t0).Milliseconds())/writes, "ms/write")
	}
}
