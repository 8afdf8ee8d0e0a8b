package luabind

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/luaop/luaop/processing/causes"
)

// BenchmarkParkedDaemonMemory: the memory of daemons parked in luaop.sleep, without a
// cluster: N StartDaemon calls (as processing makes them) sleeping in a loop,
// measured against the same runtime with none. It reports the Go heap and
// the goroutine stacks each parked daemon holds (the e2e BenchmarkIdleDaemons adds
// the framework's own per-daemon state). LUAOP_DAEMON_HEAPPROFILE=FILE writes a heap
// profile with the daemons parked.
func BenchmarkParkedDaemonMemory(b *testing.B) {
	for _, n := range []int{2000, 10000} {
		b.Run(fmt.Sprintf("daemons=%d", n), func(b *testing.B) { parkedDaemons(b, n) })
	}
}

func parkedDaemons(b *testing.B, n int) {
	if os.Getenv("LUAOP_DAEMON_HEAPPROFILE") != "" {
		runtime.MemProfileRate = 1024
	}
	rt := New(Options{Shards: 2, Logger: slog.New(slog.DiscardHandler)})
	defer rt.Close()
	if _, err := rt.Load(b.Context(), []Script{{Name: "d.lua", Source: []byte(`
		local luaop = require("luaop")
		luaop.daemon("example.com/v1/things", function(ctx)
			ctx.patch.status.up = true
			while luaop.sleep(3600) do end
		end, { id = "sleeper" })
	`)}}); err != nil {
		b.Fatal(err)
	}
	spec := rt.Specs()[0]
	bodies := make([]map[string]any, n)
	for i := range bodies {
		bodies[i] = map[string]any{"metadata": map[string]any{"uid": fmt.Sprintf("uid-%06d", i), "name": fmt.Sprintf("o%d", i), "namespace": "ns"}}
	}
	heap0, stacks0 := memInUse()
	stop, closeStop := context.WithCancel(context.Background())
	var parked atomic.Int64
	var wg sync.WaitGroup
	for i := range n {
		body := bodies[i]
		wg.Add(1)
		rt.StartDaemon(b.Context(), &causes.Call{Handler: spec, Cause: causes.Cause{Body: body},
			Logger: slog.New(slog.DiscardHandler), Daemon: &causes.DaemonLink{Stopped: stop, Latest: func() map[string]any { return body },
				Flush: func(map[string]any) { parked.Add(1) }}}, func(error) { wg.Done() })
	}
	deadline := time.Now().Add(2 * time.Minute)
	for parked.Load() < int64(n) {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d daemons parked", parked.Load(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // the last ones reach their wait
	heap1, stacks1 := memInUse()
	if f := os.Getenv("LUAOP_DAEMON_HEAPPROFILE"); f != "" {
		if w, err := os.Create(fmt.Sprintf("%s.%d", f, n)); err == nil {
			_ = pprof.WriteHeapProfile(w)
			w.Close()
		}
	}
	closeStop()
	wg.Wait()
	heapPer := (float64(heap1) - float64(heap0)) / float64(n)
	stackPer := (float64(stacks1) - float64(stacks0)) / float64(n)
	b.ReportMetric(heapPer+stackPer, "B/daemon")
	b.ReportMetric(heapPer, "heap-B/daemon")
	b.ReportMetric(stackPer, "stack-B/daemon")
}

func memInUse() (heap, stacks uint64) {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse, m.StackInuse
}
