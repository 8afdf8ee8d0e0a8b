package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/processing"
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

// memStats: the Go heap in use and the goroutine stacks after four GCs (a GC halves a
// parked goroutine's stack at most once: four bring a 64 KB stack back to its working
// size), and the process's VmRSS after the heap's free pages went back to the OS.
type memStats struct {
	heap, stacks, rss uint64
	goroutines        int
}

func readMem() memStats {
	for range 4 {
		runtime.GC()
	}
	debug.FreeOSMemory()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return memStats{heap: m.HeapInuse, stacks: m.StackInuse, rss: vmRSS(), goroutines: runtime.NumGoroutine()}
}

// vmRSS is this process's resident set size in bytes (0 if unknown).
func vmRSS() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseUint(f[1], 10, 64)
			return kb * 1024
		}
	}
	return 0
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// daemonCounts: LUAOP_BENCH_DAEMONS, comma-separated (make bench-daemons
// BENCH_DAEMONS=2000); default 2000 and 10000.
func daemonCounts(b *testing.B) []int {
	v := os.Getenv("LUAOP_BENCH_DAEMONS")
	if v == "" {
		return []int{2000, 10000}
	}
	var ns []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			b.Fatalf("LUAOP_BENCH_DAEMONS=%q: want positive counts, comma-separated", v)
		}
		ns = append(ns, n)
	}
	return ns
}

// BenchmarkIdleDaemons: N objects (2,000 and 10,000 by default, LUAOP_BENCH_DAEMONS),
// each with a daemon sleeping in a loop. It reports the memory each daemon adds
// against the same operator holding the same objects without daemons: Go heap,
// goroutine stacks, their sum, and VmRSS (after returning free heap pages to the OS),
// the goroutines per daemon, and the CPU the operator uses while the daemons sleep.
// Each daemon converts a nested table before it first sleeps, so its goroutine's
// stack has grown as a working daemon's does: the stacks measured are those the
// runtime shrinks them back to. One measurement per run, whatever b.N (the setup is
// the work). Run: make bench-daemons.
func BenchmarkIdleDaemons(b *testing.B) {
	env.Require(b)
	for _, n := range daemonCounts(b) {
		b.Run(fmt.Sprintf("daemons=%d", n), func(b *testing.B) { idleDaemons(b, n) })
	}
}

func idleDaemons(b *testing.B, objects int) {
	ns := env.Namespace(b)
	var wg sync.WaitGroup
	names := make(chan int)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range names {
				obj := mustYAML(nil, fmt.Sprintf("{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w%d}, spec: {size: 1}}", i))
				if _, err := env.Dynamic.Resource(widgets).Namespace(ns).Create(b.Context(), obj, metav1.CreateOptions{}); err != nil {
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

	// LUAOP_BENCH_HEAPPROFILE=PREFIX writes the heap profiles of both runs (PREFIX.base,
	// PREFIX.daemons; compare with go tool pprof -diff_base PREFIX.base PREFIX.daemons).
	profile := os.Getenv("LUAOP_BENCH_HEAPPROFILE")
	if profile != "" {
		defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
		runtime.MemProfileRate = 4096
	}
	writeProfile := func(label string) {
		if profile == "" {
			return
		}
		f, err := os.Create(profile + "." + label)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
			b.Fatal(err)
		}
	}
	run := func(src string, wantStarted int64) (m memStats, idleCPU float64, op *testcluster.RunningOperator) {
		var started atomic.Int64
		log := slog.New(countingHandler{prefix: "daemon started", n: &started})
		op = env.StartOperatorAsync(b, ns, operator.Options{Logger: log, Scripts: script(src)})
		testcluster.Eventually(b, 10*time.Minute, func() (bool, string) { // 10,000 objects take longer than StartOperator's 20 s
			return op.Ready(), "the operator is not ready (scripts loaded, initial listing processed)"
		})
		testcluster.Eventually(b, 10*time.Minute, func() (bool, string) {
			return started.Load() >= wantStarted, fmt.Sprintf("%d of %d daemons started", started.Load(), wantStarted)
		})
		if wantStarted > 0 { // daemons put the finalizer on their objects: measure once every one is on
			testcluster.Eventually(b, 10*time.Minute, func() (bool, string) {
				list, err := env.Dynamic.Resource(widgets).Namespace(ns).List(b.Context(), metav1.ListOptions{})
				if err != nil {
					return false, err.Error()
				}
				without := 0
				for _, o := range list.Items {
					if !slices.Contains(o.GetFinalizers(), processing.Finalizer("luaop.dev")) {
						without++
					}
				}
				return without == 0, fmt.Sprintf("%d of %d objects without the finalizer", without, len(list.Items))
			})
		}
		m = readMem()
		if wantStarted > 0 {
			writeProfile("daemons")
		} else {
			writeProfile("base")
		}
		c0, t0 := cpuTime(), time.Now()
		time.Sleep(10 * time.Second) // the measured interval: CPU used while the daemons sleep
		idleCPU = float64(cpuTime()-c0) / float64(time.Since(t0)) * 100
		return m, idleCPU, op
	}
	base, baseCPU, op := run(`
		local luaop = require("luaop")
		luaop.on.event("examples.luaop.dev/v1/widgets", function(ctx) end, { id = "spy" })
	`, 0)
	_ = op.Stop()
	// The test's cleanup keeps the RunningOperator (to stop it when the test ends);
	// without this, the stopped operator's informer cache, object table and Lua
	// states stayed reachable through it and were counted as the daemons' memory.
	op.Operator = nil
	with, daemonCPU, op := run(`
		local luaop = require("luaop")
		luaop.daemon("examples.luaop.dev/v1/widgets", function(ctx)
			-- Some work first, as a daemon does between its sleeps: converting a nested
			-- table grows the daemon goroutine's stack (to 32 KB here), which must
			-- shrink back once the daemon sleeps.
			local function work()
				local t = {}
				for i = 1, 60 do t = { t } end
				return #luaop.json.encode(t)
			end
			work()
			while luaop.sleep(30) do end
		end, { id = "sleeper" })
	`, int64(objects))
	_ = op.Stop()
	var rel sync.WaitGroup
	idx := make(chan int)
	for w := 0; w < 8; w++ { // release the finalizers so the namespace can go
		rel.Add(1)
		go func() {
			defer rel.Done()
			for i := range idx {
				_, _ = env.Dynamic.Resource(widgets).Namespace(ns).Patch(b.Context(), fmt.Sprintf("w%d", i),
					types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
			}
		}()
	}
	for i := 0; i < objects; i++ {
		idx <- i
	}
	close(idx)
	rel.Wait()
	per := func(a, b uint64) float64 { return (float64(a) - float64(b)) / float64(objects) }
	heapPer, stackPer, rssPer := per(with.heap, base.heap), per(with.stacks, base.stacks), per(with.rss, base.rss)
	b.ReportMetric(heapPer+stackPer, "B/daemon")
	b.ReportMetric(heapPer, "heap-B/daemon")
	b.ReportMetric(stackPer, "stack-B/daemon")
	b.ReportMetric(rssPer, "rss-B/daemon")
	b.ReportMetric(float64(with.goroutines-base.goroutines)/float64(objects), "goroutines/daemon")
	b.ReportMetric(daemonCPU, "%cpu-idle-daemons")
	b.ReportMetric(baseCPU, "%cpu-idle-baseline")
	b.Logf("without daemons: heap %d B, stacks %d B, RSS %d B, %d goroutines; with %d sleeping daemons: heap %d B, stacks %d B, RSS %d B, %d goroutines; idle CPU %.3f%% (baseline %.3f%%)",
		base.heap, base.stacks, base.rss, base.goroutines, objects, with.heap, with.stacks, with.rss, with.goroutines, daemonCPU, baseCPU)
}
