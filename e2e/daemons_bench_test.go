package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/testcluster"
)

// countingHandler counts log records whose message starts with a prefix.
type countingHandler struct {
	prefix string
	n      *atomic.Int64
}

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countingHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, h.prefix) {
		h.n.Add(1)
	}
	return nil
}
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countingHandler) WithGroup(string) slog.Handler      { return h }

func inUse() (heap, stacks uint64) {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse, m.StackInuse
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkIdleDaemons: 2,000 objects, each with a daemon sleeping in a loop. It
// reports the memory each daemon adds (heap and stacks, against the same operator
// holding the same objects without daemons) and the CPU the operator uses while the
// daemons sleep. One measurement per run, whatever b.N (the setup is the work).
// Run: make bench-daemons.
func BenchmarkIdleDaemons(b *testing.B) {
	const objects = 2000
	ns := env.Namespace(b)
	var wg sync.WaitGroup
	names := make(chan int)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range names {
				obj := mustYAML(nil, fmt.Sprintf("{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w%d}, spec: {size: 1}}", i))
				if _, err := env.Dynamic.Resource(widgets).Namespace(ns).Create(context.Background(), obj, metav1.CreateOptions{}); err != nil {
					b.Error(err)
				}
			}
		}()
	}
	for i := 0; i < objects; i++ {
		names <- i
	}
	close(names)
	wg.Wait()

	run := func(src string, wantStarted int64) (heap, stacks uint64, idleCPU float64, op *testcluster.RunningOperator) {
		var started atomic.Int64
		log := slog.New(countingHandler{prefix: "daemon started", n: &started})
		op = env.StartOperator(b, ns, operator.Options{Logger: log, Scripts: script(src)})
		testcluster.Eventually(b, 3*time.Minute, func() (bool, string) {
			return started.Load() >= wantStarted, fmt.Sprintf("%d of %d daemons started", started.Load(), wantStarted)
		})
		time.Sleep(2 * time.Second) // let the finalizer patches settle
		heap, stacks = inUse()
		c0, t0 := cpuTime(), time.Now()
		time.Sleep(10 * time.Second)
		idleCPU = float64(cpuTime()-c0) / float64(time.Since(t0)) * 100
		return heap, stacks, idleCPU, op
	}
	baseHeap, baseStacks, baseCPU, op := run(`
		local luaop = require("luaop")
		luaop.on.event("examples.luaop.dev/v1/widgets", function(ctx) end, { id = "spy" })
	`, 0)
	_ = op.Stop()
	heap, stacks, daemonCPU, op := run(`
		local luaop = require("luaop")
		luaop.daemon("examples.luaop.dev/v1/widgets", function(ctx)
			while luaop.sleep(30) do end
		end, { id = "sleeper" })
	`, objects)
	_ = op.Stop()
	for i := 0; i < objects; i++ { // release the finalizers so the namespace can go
		_, _ = env.Dynamic.Resource(widgets).Namespace(ns).Patch(context.Background(), fmt.Sprintf("w%d", i),
			types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	}
	heapPer := (float64(heap) - float64(baseHeap)) / objects
	stackPer := (float64(stacks) - float64(baseStacks)) / objects
	b.ReportMetric(heapPer+stackPer, "B/daemon")
	b.ReportMetric(heapPer, "heap-B/daemon")
	b.ReportMetric(stackPer, "stack-B/daemon")
	b.ReportMetric(daemonCPU, "%cpu-idle-daemons")
	b.ReportMetric(baseCPU, "%cpu-idle-baseline")
	b.Logf("without daemons: heap %d B, stacks %d B; with %d sleeping daemons: heap %d B, stacks %d B; idle CPU %.3f%% (baseline %.3f%%)",
		baseHeap, baseStacks, objects, heap, stacks, daemonCPU, baseCPU)
}
