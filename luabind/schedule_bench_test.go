package luabind

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// The delay an innocent call sees next to a runaway one (issue 51): on one Lua
// state, a handler that makes an API call (answered at once) and returns, called
// one after the other, alone and while an endless loop runs on the same state.
// Each call takes the state twice (to start, and back from its API call); reported
// are the median and the 99th percentile of a call's duration (p50-ms, p99-ms) and
// the preemptions per call. Before issue 51 the second case took the loop's whole
// deadline and failed with it.
//
//	go test -run '^$' -bench BenchmarkInnocentCallNextToRunaway -benchtime 2000x ./luabind
func BenchmarkInnocentCallNextToRunaway(b *testing.B) {
	for _, bc := range []struct {
		name    string
		runaway bool
	}{{"alone", false}, {"next_to_an_endless_loop", true}} {
		b.Run(bc.name, func(b *testing.B) {
			rt := loadedRuntime(b, Options{Shards: 1, HandlerTimeout: time.Hour, Kube: newGatedKube()}, "s.lua", runawayScript)
			if bc.runaway {
				logger, logs := channelLogger()
				ctx, stop := context.WithCancel(context.Background())
				spin := invokeAsync(ctx, rt, specOf(b, rt, "spin"), widgetBody("us", "s"), logger)
				if msg := <-logs; msg != "spinning" {
					b.Fatalf("the loop logged %q", msg)
				}
				defer func() { stop(); <-spin }()
			}
			spec := specOf(b, rt, "get")
			body := widgetBody("ua", "a")
			took := make([]time.Duration, 0, b.N)
			before := rt.preemptions.Load()
			b.ResetTimer()
			for b.Loop() {
				start := time.Now()
				res, err := rt.Invoke(b.Context(), causes.Call{Handler: spec, Cause: causes.Cause{Reason: causes.Update, Body: body}, Patch: state.NewPatch()})
				took = append(took, time.Since(start))
				if err != nil || res.Value != "got a" {
					b.Fatalf("the innocent call: %v, %v", res.Value, err)
				}
			}
			b.StopTimer()
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2])/1e6, "p50-ms")
			b.ReportMetric(float64(took[len(took)*99/100])/1e6, "p99-ms")
			b.ReportMetric(float64(rt.preemptions.Load()-before)/float64(len(took)), "preemptions/call")
		})
	}
}

// What the preemption check costs a running call: a handler looping 100,000 times
// (about 400,000 VM instructions), each of which checks for a preemption request.
func BenchmarkLuaLoop(b *testing.B) {
	rt := loadedRuntime(b, Options{Shards: 1, HandlerTimeout: time.Hour}, "s.lua", `local luaop = require("luaop")
luaop.on.update("example.com/v1/widgets", function(ctx)
  local x = 0
  for i = 1, 100000 do x = x + i % 7 end
  return x
end, {id = "loop"})
`)
	spec := specOf(b, rt, "loop")
	body := widgetBody("ua", "a")
	for b.Loop() {
		if _, err := rt.Invoke(b.Context(), causes.Call{Handler: spec, Cause: causes.Cause{Reason: causes.Update, Body: body}}); err != nil {
			b.Fatal(err)
		}
	}
}
