package operator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/processing/causes"
)

func hookOperator(t *testing.T, src string, opts Options) *Operator {
	t.Helper()
	opts.Scripts = []luabind.Script{{Name: "hooks.lua", Source: []byte("local luaop = require('luaop')\n" + src)}}
	opts.Runtime.HandlerTimeout = 2 * time.Second
	op, err := New(&rest.Config{Host: "http://127.0.0.1:1"}, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { op.runtime.Close(); op.stopEvents() })
	if _, err := op.Load(t.Context()); err != nil {
		t.Fatal(err)
	}
	return op
}

// fakeHookClock makes op's hooks wait on a fake clock, which each wait moves on;
// waits tells the waits so far, rounded to seconds (more than 20 fail the hook).
func fakeHookClock(op *Operator) (waits func() []time.Duration) {
	var mu sync.Mutex
	var sleeps []time.Duration
	clock := time.Now()
	op.hookNow = func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	op.hookSleep = func(ctx context.Context, d time.Duration) error {
		mu.Lock()
		defer mu.Unlock()
		if len(sleeps) > 20 {
			return fmt.Errorf("too many waits: %v", sleeps)
		}
		sleeps = append(sleeps, d.Round(time.Second))
		clock = clock.Add(d)
		return nil
	}
	return func() []time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(sleeps)
	}
}

// Issue 12, item 10: startup handlers are kopf activities: retried (after a
// temporary error's delay, or the backoff) until they succeed; a permanent error,
// or running out of retries or timeout, stops the start.
func TestStartupHooksAreRetriedUntilTheySucceed(t *testing.T) {
	tests := []struct {
		name   string
		src    string
		fails  string // "" when runHooks must succeed
		sleeps []time.Duration
		calls  int
	}{
		{"temporary then success", `luaop.on.startup(function(ctx)
			ctx.memo.calls = (ctx.memo.calls or 0) + 1
			if ctx.retry < 2 then error(luaop.temporary_error("db not ready", 3)) end
		end, {id = "s"})`, "", []time.Duration{3 * time.Second, 3 * time.Second}, 3},
		{"arbitrary error after the backoff", `luaop.on.startup(function(ctx)
			ctx.memo.calls = (ctx.memo.calls or 0) + 1
			if ctx.retry < 1 then error("boom") end
		end, {id = "s", backoff = 7})`, "", []time.Duration{7 * time.Second}, 2},
		{"default backoff is 60s", `luaop.on.startup(function(ctx)
			ctx.memo.calls = (ctx.memo.calls or 0) + 1
			if ctx.retry < 1 then error("boom") end
		end, {id = "s"})`, "", []time.Duration{60 * time.Second}, 2},
		{"permanent error stops at once", `luaop.on.startup(function(ctx)
			ctx.memo.calls = (ctx.memo.calls or 0) + 1
			error(luaop.permanent_error("misconfigured"))
		end, {id = "s"})`, "startup handler s failed: misconfigured", nil, 1},
		{"retries run out", `luaop.on.startup(function(ctx)
			ctx.memo.calls = (ctx.memo.calls or 0) + 1
			error("boom")
		end, {id = "s", retries = 3, backoff = 1})`, "startup handler s exceeded its 3 retries (last error: hooks.lua:4: boom)", []time.Duration{time.Second, time.Second}, 3},
		{"timeout runs out", `luaop.on.startup(function(ctx)
			ctx.memo.calls = (ctx.memo.calls or 0) + 1
			error(luaop.temporary_error("slow", 10))
		end, {id = "s", timeout = 5})`, "startup handler s timed out after 5s (last error: slow)", nil, 1},
		{"errors = ignored", `luaop.on.startup(function(ctx)
			ctx.memo.calls = (ctx.memo.calls or 0) + 1
			error("boom")
		end, {id = "s", errors = "ignored"})`, "", nil, 1},
		{"one failing handler does not block another", `luaop.on.startup(function(ctx)
			ctx.memo.calls = (ctx.memo.calls or 0) + 1
			if ctx.retry < 1 then error(luaop.temporary_error("later", 2)) end
		end, {id = "s"})
		luaop.on.startup(function(ctx) ctx.memo.other = true end, {id = "t"})`, "", []time.Duration{2 * time.Second}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			op := hookOperator(t, tt.src+`
				luaop.on.probe(function(ctx) return ctx.memo.calls end, {id = "calls"})`, Options{ProbeCache: -1})
			waits := fakeHookClock(op)
			err := op.runHooks(t.Context(), causes.KindStartup)
			sleeps := waits()
			if tt.fails == "" && err != nil {
				t.Fatalf("runHooks: %v", err)
			}
			// One message form (handling's), naming the handler once.
			if tt.fails != "" && (err == nil || err.Error() != tt.fails) {
				t.Fatalf("runHooks = %v; want %q", err, tt.fails)
			}
			if fmt.Sprint(sleeps) != fmt.Sprint(tt.sleeps) {
				t.Errorf("waited %v; want %v", sleeps, tt.sleeps)
			}
			res, _ := op.Probe(t.Context())
			if fmt.Sprint(res["calls"]) != fmt.Sprint(tt.calls) {
				t.Errorf("the startup handler ran %v times; want %d", res["calls"], tt.calls)
			}
		})
	}
	t.Run("stops with the operator", func(t *testing.T) {
		// The handler asks to be retried in 10 minutes and the test waits at most
		// one: runHooks returning at all means the context stopped it. No time bound.
		op := hookOperator(t, `luaop.on.startup(function(ctx) error(luaop.temporary_error("never", 600)) end, {id = "s"})`, Options{})
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- op.runHooks(ctx, causes.KindStartup) }()
		select {
		case err := <-done:
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("runHooks: %v, want the stop (the context's deadline)", err)
			}
		case <-time.After(time.Minute):
			t.Fatal("runHooks did not stop with its context (still waiting for the 10-minute retry)")
		}
	})
}

// Issue 12, item 15: /healthz does not run Lua on every request: successful probe
// results are reused for Options.ProbeCache (10s by default); failures are not.
func TestProbeResultsAreCached(t *testing.T) {
	src := `luaop.on.probe(function(ctx)
		ctx.memo.n = (ctx.memo.n or 0) + 1
		if ctx.memo.fail then error("down " .. ctx.memo.n) end
		return ctx.memo.n
	end, {id = "count"})
	luaop.on.startup(function(ctx) ctx.memo.fail = FAIL end, {id = "s"})`
	for _, tt := range []struct {
		name  string
		cache time.Duration
		fail  bool
		want  []string
	}{
		{"default 10s", 0, false, []string{"1", "1", "1"}},
		{"disabled", -1, false, []string{"1", "2", "3"}},
		{"failures are not cached", 0, true, []string{"map[error:", "map[error:", "map[error:"}},
		{"expires", 50 * time.Millisecond, false, []string{"1", "1", "2"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			op := hookOperator(t, strings.Replace(src, "FAIL", fmt.Sprint(tt.fail), 1), Options{ProbeCache: tt.cache})
			if err := op.runHooks(t.Context(), causes.KindStartup); err != nil {
				t.Fatal(err)
			}
			var got []string
			for i := 0; i < 3; i++ {
				if i == 2 && tt.cache > 0 {
					time.Sleep(2 * tt.cache) // the scenario: the cached answer expires
				}
				res, healthy := op.Probe(t.Context())
				if healthy == tt.fail {
					t.Errorf("probe %d: healthy = %v", i, healthy)
				}
				got = append(got, fmt.Sprint(res["count"]))
			}
			for i := range got {
				if !strings.HasPrefix(got[i], tt.want[i]) {
					t.Errorf("results %v; want %v", got, tt.want)
					break
				}
			}
			if tt.fail && got[0] == got[2] {
				t.Errorf("a failed probe was cached: %v", got)
			}
		})
	}
}

// A reload runs the new probes at the next request: the previous scripts' cached
// results are not served for the rest of the cache's time.
func TestReloadDropsTheCachedProbeResults(t *testing.T) {
	probe := func(v string) string {
		return "local luaop = require('luaop')\nluaop.on.probe(function() return '" + v + "' end, {id = 'version'})\n"
	}
	op := hookOperator(t, "luaop.on.probe(function() return 'v1' end, {id = 'version'})", Options{ProbeCache: time.Hour})
	if res, _ := op.Probe(t.Context()); res["version"] != "v1" {
		t.Fatalf("first probe %v, want v1", res)
	}
	if _, err := op.LoadScripts(t.Context(), []luabind.Script{{Name: "hooks.lua", Source: []byte(probe("v2"))}}); err != nil {
		t.Fatal(err)
	}
	if res, _ := op.Probe(t.Context()); res["version"] != "v2" {
		t.Errorf("probe after the reload %v, want the new scripts' v2 (not the cached v1)", res)
	}
}

// kopf logs "Handler 'x' succeeded." for its activities too (its hooks example
// counts them): startup and cleanup handlers log their outcome with the fields of
// every handler's line (handler, reason, took_ms), at the success level.
func TestHooksLogTheirOutcomeAsEveryHandler(t *testing.T) {
	var mu sync.Mutex
	var buf strings.Builder
	log := slog.New(slog.NewJSONHandler(lockedBuilder{&mu, &buf}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	op := hookOperator(t, `
luaop.on.startup(function(ctx) if ctx.retry < 1 then error(luaop.temporary_error("later", 1)) end end, {id = "warm_up"})
luaop.on.cleanup(function(ctx) end, {id = "tidy"})`, Options{Logger: log})
	op.hookSleep = func(context.Context, time.Duration) error { return nil }
	for _, kind := range []causes.Kind{causes.KindStartup, causes.KindCleanup} {
		if err := op.runHooks(t.Context(), kind); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	got := map[string]map[string]any{}
	for _, line := range strings.Split(buf.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["handler"] != nil {
			got[fmt.Sprint(m["msg"], "/", m["handler"])] = m
		}
	}
	for key, reason := range map[string]string{"handler will be retried/warm_up": "startup", "handler succeeded/warm_up": "startup", "handler succeeded/tidy": "cleanup"} {
		line := got[key]
		if _, isNumber := line["took_ms"].(float64); line == nil || line["reason"] != reason || !isNumber {
			t.Errorf("%s: %v; want a line with reason %s and took_ms (all: %v)", key, line, reason, got)
		}
	}
}

type lockedBuilder struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w lockedBuilder) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}
