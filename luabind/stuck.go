package luabind

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	lua "github.com/luaop/luaop/third_party/gopher-lua"
	"github.com/prometheus/client_golang/prometheus"
)

// A Lua state held past its deadline.
//
// Every Lua call runs under its handler deadline, which the VM checks between
// instructions, the pattern matcher and the compiler every few thousand steps, and
// every built-in whose cost grows with its input is bounded (third_party/gopher-lua,
// internal/sandbox). A call that still holds its shard stuckGrace after its deadline
// is a defect of that defence (a Go function that neither ends nor looks at its
// context); since nothing can stop a goroutine from outside, the runtime
//   - reports it: Runtime.Stuck (the operator's /healthz answers 500 while a call is
//     stuck, so that the kubelet restarts the pod) and the metrics
//     luaop_lua_states_stuck and luaop_lua_states_replaced_total (BudgetMetrics);
//   - replaces the shard's state so that the other objects of the shard flow: a new
//     state, loaded with the current scripts, takes the stuck one's place; calls
//     waiting for the stuck state move to the new one. What lived in the stuck
//     state stays with it: the memos of its objects (the new state starts them
//     empty) and its parked daemons (they resume, or end, once the stuck call ends).
//
// The watch is the memory budget's watchdog (memory.go), which already sees every
// call while it runs Lua; it runs whatever the budget is.

// stuckGrace is how long past its deadline a call may hold its state before it is
// reported and its state replaced: the deadline is checked at least every few
// thousand VM instructions or matcher steps, far less than this.
const stuckGrace = time.Second

// errStuck is what a call waiting for a stuck state gets; the runtime's entry points
// then wait for its replacement and take the new state (withShard).
var errStuck = errors.New("the Lua state is held by a call past its deadline; it is being replaced")

// StuckCall describes a Lua call held past its deadline.
type StuckCall struct {
	// What is the handler's id ("loading the scripts" for a load).
	What     string
	Shard    int
	Deadline time.Time
}

func (c StuckCall) String() string {
	return fmt.Sprintf("Lua state %d is held by %s %s past its deadline (a built-in that ignores the deadline: please report it); its objects are served by a new state", c.Shard, c.What, time.Since(c.Deadline).Round(time.Second))
}

// stuckState is the runtime's record of stuck calls (mu guards it).
type stuckState struct {
	mu       sync.Mutex
	calls    map[*memCall]StuckCall
	replaced int
}

// Stuck returns the calls held past their deadline now (nil when none).
func (r *Runtime) Stuck() []StuckCall {
	r.stuck.mu.Lock()
	defer r.stuck.mu.Unlock()
	var out []StuckCall
	for _, c := range r.stuck.calls {
		out = append(out, c)
	}
	return out
}

// onStuck is called by the watchdog (no lock held) for a call past its deadline
// and grace: it is recorded and its shard replaced.
func (r *Runtime) onStuck(mc *memCall) {
	sh := mc.sh
	c := StuckCall{What: mc.what, Deadline: mc.deadline}
	if sh != nil {
		c.Shard = sh.idx
	}
	r.stuck.mu.Lock()
	if r.stuck.calls == nil {
		r.stuck.calls = map[*memCall]StuckCall{}
	}
	r.stuck.calls[mc] = c
	r.stuck.mu.Unlock()
	r.opts.Logger.Error("a Lua call holds its state past its deadline: the state is replaced so that its other objects are served",
		"call", c.What, "shard", c.Shard, "past_deadline", time.Since(c.Deadline).String())
	if sh != nil {
		go r.replaceShard(sh)
	}
}

// onUnstuck is called when a stuck call ended at last.
func (r *Runtime) onUnstuck(mc *memCall) {
	r.stuck.mu.Lock()
	delete(r.stuck.calls, mc)
	r.stuck.mu.Unlock()
	r.opts.Logger.Warn("the Lua call held past its deadline ended", "call", mc.what)
}

// replaceShard puts a new state, loaded with the current scripts, in the place of
// the stuck shard old. Calls waiting for old fail at once with errStuck (old.stuck)
// and wait for old.swapped; a load waiting for it fails, releasing the load lock.
func (r *Runtime) replaceShard(old *shard) {
	old.stuckOnce.Do(func() { close(old.stuck) })
	r.loadMu.Lock()
	defer r.loadMu.Unlock()
	if r.shards[old.idx].Load() != old || r.closed {
		return
	}
	sh := newShard(r, old.idx)
	if gen := r.gen.Load(); len(gen.files) > 0 {
		protos := make(map[string]*lua.FunctionProto, len(gen.files))
		for k := range gen.protoKeys {
			if p := r.protos[k]; p != nil {
				protos[k.name] = p
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), r.opts.HandlerTimeout)
		staged, _, err := sh.stage(ctx, gen.files, protos, nil)
		cancel()
		if err != nil {
			r.opts.Logger.Error("replacing a stuck Lua state: the scripts do not load in the new one; its objects wait for the stuck call", "shard", old.idx, "error", err)
			sh.L.Close()
			return
		}
		sh.commit(staged)
	}
	r.shards[old.idx].Store(sh)
	r.stuck.mu.Lock()
	r.stuck.replaced++
	r.stuck.mu.Unlock()
	close(old.swapped)
	r.opts.Logger.Warn("a new Lua state serves the objects of the stuck one", "shard", old.idx)
}

// withShard runs fn on the shard serving key (shardOf), again on its replacement
// when that shard turns out stuck (fn failed with errStuck), until ctx ends.
func withShard[T any](ctx context.Context, shardOf func() *shard, fn func(*shard) (T, error)) (T, error) {
	for {
		sh := shardOf()
		v, err := fn(sh)
		if !errors.Is(err, errStuck) {
			return v, err
		}
		select {
		case <-sh.swapped:
		case <-ctx.Done():
			return v, err
		}
	}
}

// BudgetMetrics are the metrics of the budgets at scrape time:
// luaop_lua_states_stuck (calls holding their state past their deadline now),
// luaop_lua_states_replaced_total (states replaced since the start) and
// luaop_lua_preemptions_total (calls made to give their state to a waiting call,
// schedule.go).
func (r *Runtime) BudgetMetrics() prometheus.Collector { return budgetCollector{r} }

type budgetCollector struct{ r *Runtime }

var (
	stuckDesc = prometheus.NewDesc("luaop_lua_states_stuck",
		"Lua calls holding their state past their deadline (plus a grace of 1s) now; /healthz answers 500 meanwhile", nil, nil)
	replacedDesc = prometheus.NewDesc("luaop_lua_states_replaced_total",
		"Lua states replaced because a call held them past its deadline", nil, nil)
	preemptionsDesc = prometheus.NewDesc("luaop_lua_preemptions_total",
		"Lua calls preempted: made to give their state to a waiting call after holding it for their slice (10 ms, then 1 ms)", nil, nil)
)

func (c budgetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- stuckDesc
	ch <- replacedDesc
	ch <- preemptionsDesc
}

func (c budgetCollector) Collect(ch chan<- prometheus.Metric) {
	c.r.stuck.mu.Lock()
	stuck, replaced := len(c.r.stuck.calls), c.r.stuck.replaced
	c.r.stuck.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(stuckDesc, prometheus.GaugeValue, float64(stuck))
	ch <- prometheus.MustNewConstMetric(replacedDesc, prometheus.CounterValue, float64(replaced))
	ch <- prometheus.MustNewConstMetric(preemptionsDesc, prometheus.CounterValue, float64(c.r.preemptions.Load()))
}
