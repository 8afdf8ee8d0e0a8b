package reloading

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/luaop/luaop/luabind"
)

// BenchmarkReloadLatency measures the time from a script file write to the new
// handler being active in the runtime (watch, debounce, read, compile, run in every
// shard, through the Reloader), with 1, 50, 500 and 2,000 script files of one handler each, one of them
// saved per iteration. It reports p50 and p99 as custom metrics.
func BenchmarkReloadLatency(b *testing.B) {
	for _, files := range []int{1, 50, 500, 2000} {
		b.Run(fmt.Sprintf("files=%d", files), func(b *testing.B) {
			dir := b.TempDir()
			script := func(i, version int) []byte {
				return []byte(fmt.Sprintf(`local luaop = require("luaop")
luaop.on.create("example.com/v1/things%d", function(ctx) return %d end, { id = "h%d_v%d" })
`, i, version, i, version))
			}
			for i := 0; i < files; i++ {
				if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("s%04d.lua", i)), script(i, 0), 0o644); err != nil {
					b.Fatal(err)
				}
			}
			rt := luabind.New(luabind.Options{})
			defer rt.Close()
			ctx, cancel := context.WithCancel(b.Context())
			defer cancel()
			loaded := make(chan Event, 1)
			r := New(Options{Dir: dir, Operator: runtimeOperator{rt}, View: eventsView(loaded)})
			if err := r.Watch(ctx); err != nil {
				b.Fatal(err)
			}
			if _, err := rt.Load(ctx, r.initial.Scripts); err != nil {
				b.Fatal(err)
			}
			go r.Run(ctx)
			var latencies, loads []time.Duration
			b.ResetTimer()
			for n := 1; n <= b.N; n++ {
				start := time.Now()
				if err := os.WriteFile(filepath.Join(dir, "s0000.lua"), script(0, n), 0o644); err != nil {
					b.Fatal(err)
				}
				ev := <-loaded
				if ev.Err != nil {
					b.Fatal(ev.Err)
				}
				want := fmt.Sprintf("h0_v%d", n)
				if !hasHandler(rt, want) {
					b.Fatalf("handler %s not active after the reload", want)
				}
				latencies = append(latencies, time.Since(start))
				loads = append(loads, ev.Report.Took)
			}
			b.StopTimer()
			sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
			b.ReportMetric(float64(latencies[len(latencies)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(latencies[len(latencies)*99/100].Microseconds())/1000, "p99-ms")
			// load-p50-ms: Runtime.Load alone (compile, run in every shard, swap).
			sort.Slice(loads, func(i, j int) bool { return loads[i] < loads[j] })
			b.ReportMetric(float64(loads[len(loads)/2].Microseconds())/1000, "load-p50-ms")
		})
	}
}

func hasHandler(rt *luabind.Runtime, id string) bool {
	for _, s := range rt.Specs() {
		if s.ID == id {
			return true
		}
	}
	return false
}

// runtimeOperator is a bare runtime as the Reloader's operator: no reactor.
type runtimeOperator struct{ rt *luabind.Runtime }

func (o runtimeOperator) LoadScripts(ctx context.Context, scripts []luabind.Script) (luabind.LoadReport, error) {
	return o.rt.Load(ctx, scripts)
}
func (runtimeOperator) NoteReload([]string, error) {}
func (runtimeOperator) NoteLastGood(bool)          {}

// eventsView sends each reload to its channel.
type eventsView chan Event

func (eventsView) Loaded(string, luabind.LoadReport) {}
func (v eventsView) Reloaded(ev Event)               { v <- ev }
