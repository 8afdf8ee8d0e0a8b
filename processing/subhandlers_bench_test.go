package processing

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// BenchmarkSubhandlers3000: one object whose create handler registers 3,000
// subhandlers, run to completion by the real core on the fake dynamic client under
// kopf's asap lifecycle: one subhandler per cycle, each outcome patched before the
// next cycle, which the watch event of that patch starts. Reports cycles per
// second and the allocations of one cycle (the parent registers its 3,000 children
// again in every cycle, as kopf's does; its registration is a Go closure here, the
// Lua side is luabind's BenchmarkRegisterSubhandlers5000). Both storages.
//
//	go test -run XXX -bench Subhandlers3000 -benchtime 1x ./processing/
//
// LUAOP_BENCH_SUBHANDLERS=300 runs 300 instead; LUAOP_BENCH_CYCLES=300 stops after
// the first 300 cycles.
func BenchmarkSubhandlers3000(b *testing.B) {
	n := 3000
	if v, err := strconv.Atoi(os.Getenv("LUAOP_BENCH_SUBHANDLERS")); err == nil && v > 0 {
		n = v // a smaller run, to see how the cost grows
	}
	for _, mode := range []StorageMode{StorageAnnotations, StorageStatus} {
		b.Run(string(mode), func(b *testing.B) {
			for range b.N {
				benchSubhandlers(b, n, mode)
			}
		})
	}
}

func benchSubhandlers(b *testing.B, n int, mode StorageMode) {
	h := newFakeHandlers()
	subs := make([]causes.Spec, n)
	var childRuns atomic.Int64
	child := func(ctx context.Context, call causes.Call) (causes.Result, error) {
		childRuns.Add(1)
		return causes.Result{}, nil
	}
	for i := range subs {
		subs[i] = causes.Spec{ID: fmt.Sprintf("parent/child-%04d", i), Kind: causes.KindChange, Resource: widgets,
			Reasons: []causes.Reason{causes.Create}, Backoff: time.Minute}
		h.fns[subs[i].ID] = child
	}
	var parentRuns atomic.Int64
	h.add(changeSpec("parent", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		parentRuns.Add(1)
		return causes.Result{Subhandlers: subs}, nil
	})
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(newScheme(), map[schema.GroupVersionResource]string{
		widgetsGVR: "WidgetList", configmapsGVR: "ConfigMapList", crdsGVR: "CustomResourceDefinitionList",
	})
	stampResourceVersions(dyn, "")
	f := false
	op, err := NewWithClients(Clients{Dynamic: dyn, Discovery: fakeDiscovery()}, h, Options{
		Clock: testingclock.NewFakeClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)), PostEvents: &f,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Workers: 1, ProgressStorage: mode, DiffBaseStorage: mode,
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.Context())
	done := make(chan error, 1)
	go func() { done <- op.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	}()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	b.ResetTimer()
	client := dyn.Resource(widgetsGVR).Namespace("default")
	if _, err := client.Create(ctx, widgetObject("w", "uid-w", map[string]any{"size": int64(1)}), metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	// LUAOP_BENCH_CYCLES=k stops after k subhandler runs: the rate of the first k
	// cycles, for a code whose full run takes too long.
	stopAfter, _ := strconv.Atoi(os.Getenv("LUAOP_BENCH_CYCLES"))
	for {
		if stopAfter > 0 && childRuns.Load() >= int64(stopAfter) {
			break
		}
		obj, err := client.Get(ctx, "w", metav1.GetOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if _, found, _ := state.NewSmartDiffBase(state.NewAnnotationsDiffBase("luaop.dev"), state.NewStatusDiffBase("luaop_dev")).Fetch(obj.Object); found {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.StopTimer()
	took := time.Since(start)
	runtime.ReadMemStats(&after)
	if got := childRuns.Load(); got != int64(n) && stopAfter == 0 {
		b.Fatalf("%d subhandler runs, want %d", got, n)
	}
	cycles := float64(parentRuns.Load())
	b.ReportMetric(cycles/took.Seconds(), "cycles/s")
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/cycles, "allocs/cycle")
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/cycles, "B/cycle")
}
