package luabind

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"weak"

	"github.com/luaop/luaop/processing/causes"
)

// notFoundKube answers every read with an error, as a cluster without the object.
type notFoundKube struct{ Kube }

func (notFoundKube) Get(context.Context, string, string, string, string) (map[string]any, error) {
	return nil, errors.New(`configmaps "x" not found`)
}

// A daemon runs on a call thread: Go functions that return several values (here
// nil, message, reason) must push them on the thread's stack, sleeps release the
// shard, and ctx.patch is flushed at every sleep.
func TestDaemonCoroutineCallsAndFlushes(t *testing.T) {
	rt := New(Options{Shards: 1, Kube: notFoundKube{}, HandlerTimeout: time.Second})
	defer rt.Close()
	_, err := rt.Load(t.Context(), []Script{{Name: "d.lua", Source: []byte(`
		local luaop = require("luaop")
		luaop.daemon("example.com/v1/things", function(ctx)
			for i = 1, 3 do
				local obj, err, reason = luaop.kube.get("v1", "ConfigMap", "ns", "x")
				ctx.patch.status.round = i
				ctx.patch.status.missing = obj == nil and err ~= nil
				if not luaop.sleep(0.01) then return end
			end
			ctx.logger.info("daemon done")
		end, { id = "d" })
	`)}})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var flushed []map[string]any
	body := map[string]any{"metadata": map[string]any{"uid": "u1", "name": "a", "namespace": "ns"}}
	err = rt.RunDaemon(t.Context(), &causes.Call{
		Handler: rt.Specs()[0], Cause: causes.Cause{Body: body}, Logger: slog.Default(),
		Daemon: &causes.DaemonLink{Stopped: context.Background(), Latest: func() map[string]any { return body },
			Flush: func(p map[string]any) { mu.Lock(); flushed = append(flushed, p); mu.Unlock() }},
	})
	if err != nil {
		t.Fatalf("the daemon failed: %v", err)
	}
	if len(flushed) != 3 {
		t.Fatalf("flushed %d patches, want one per sleep (3): %v", len(flushed), flushed)
	}
	last := flushed[2]["status"].(map[string]any)
	if last["round"] != int64(3) || last["missing"] != true {
		t.Errorf("last flush %v: want round 3 and missing = true", last)
	}
}

// Stopping wakes a sleeping daemon with false (its hour-long sleep ends early).
func TestDaemonStopWakesSleep(t *testing.T) {
	rt := New(Options{Shards: 1})
	defer rt.Close()
	if _, err := rt.Load(t.Context(), []Script{{Name: "d.lua", Source: []byte(`
		local luaop = require("luaop")
		luaop.daemon("example.com/v1/things", function(ctx)
			ctx.patch.status.phase = "sleeping"
			while luaop.sleep(3600) do end
			return
		end, { id = "sleeper" })
	`)}}); err != nil {
		t.Fatal(err)
	}
	stop, closeStop := context.WithCancel(context.Background())
	body := map[string]any{"metadata": map[string]any{"uid": "u1"}}
	done := make(chan error, 1)
	// A sleep flushes the daemon's patch first: the flush says the daemon is in luaop.sleep.
	sleeping := make(chan struct{}, 1)
	go func() {
		done <- rt.RunDaemon(t.Context(), &causes.Call{Handler: rt.Specs()[0], Cause: causes.Cause{Body: body},
			Logger: slog.Default(), Daemon: &causes.DaemonLink{Stopped: stop, Latest: func() map[string]any { return body },
				Flush: func(map[string]any) {
					select {
					case sleeping <- struct{}{}:
					default:
					}
				}}})
	}()
	select {
	case <-sleeping:
	case err := <-done:
		t.Fatalf("the daemon returned before sleeping: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the daemon never reached luaop.sleep")
	}
	closeStop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("daemon: %v", err)
		}
	case <-time.After(time.Minute): // the sleep was for an hour: only the stop ends it sooner
		t.Fatal("the sleeping daemon did not wake on stop")
	}
}

// A sleeping daemon keeps no handler deadline (the sleep waits under the daemon's
// context; the next stretch gets a new one) and not the Call it was started with
// (its call state has a copy). Both would otherwise live as long as the daemon sleeps.
func TestSleepingDaemonKeepsNoDeadlineNorCall(t *testing.T) {
	rt := New(Options{Shards: 1, HandlerTimeout: time.Hour})
	defer rt.Close()
	if _, err := rt.Load(t.Context(), []Script{{Name: "d.lua", Source: []byte(`
		local luaop = require("luaop")
		luaop.daemon("example.com/v1/things", function(ctx)
			ctx.patch.status.phase = "sleeping"
			while luaop.sleep(3600) do end
		end, { id = "sleeper" })
	`)}}); err != nil {
		t.Fatal(err)
	}
	stop, closeStop := context.WithCancel(context.Background())
	body := map[string]any{"metadata": map[string]any{"uid": "u1"}}
	sleeping := make(chan struct{}, 1)
	done := make(chan error, 1)
	var startedWith weak.Pointer[causes.Call] // non-nil while the Call is alive
	func() {
		call := &causes.Call{Handler: rt.Specs()[0], Cause: causes.Cause{Body: body},
			Logger: slog.Default(), Daemon: &causes.DaemonLink{Stopped: stop, Latest: func() map[string]any { return body },
				Flush: func(map[string]any) { sleeping <- struct{}{} }}}
		startedWith = weak.Make(call)
		go func() { done <- rt.RunDaemon(t.Context(), call) }()
	}()
	// The flush comes from inside the sleep, with the shard released.
	waitDaemonSleeps(t, sleeping, done)
	sh := rt.shards[0].Load()
	if err := sh.lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	parked := 0
	for _, th := range sh.threads {
		if th.cs != nil && th.cs.daemon {
			parked++
			if _, has := th.L.Context().Deadline(); has || th.cancel != nil {
				t.Errorf("the sleeping daemon's thread keeps a handler deadline (deadline %v, cancel kept %v)", has, th.cancel != nil)
			}
		}
	}
	sh.unlock()
	if parked != 1 {
		t.Fatalf("%d daemon threads found, want the sleeping one", parked)
	}
	for range 3 {
		runtime.GC()
	}
	if startedWith.Value() != nil {
		t.Error("the Call the daemon was started with is kept while it sleeps")
	}
	stopAndWaitDaemon(t, closeStop, done)
}

// A daemon that went over the memory budget before parking cannot catch the error
// its sleep raises on waking and go on without a deadline: it fails at once, as any
// call over the budget does, even with the sleep inside pcall and a loop after it.
func TestDaemonOverBudgetCannotEscapeThroughPcall(t *testing.T) {
	rt := New(Options{Shards: 1, HandlerTimeout: time.Hour})
	// Close waits for the daemon: when it escaped, it spins for ever; the failure is
	// reported rather than hung on.
	defer func() {
		if !t.Failed() {
			rt.Close()
		}
	}()
	if _, err := rt.Load(t.Context(), []Script{{Name: "d.lua", Source: []byte(`
		local luaop = require("luaop")
		luaop.daemon("example.com/v1/things", function(ctx)
			ctx.patch.status.phase = "sleeping"
			pcall(luaop.sleep, 0)
			while true do end
		end, { id = "escaper" })
	`)}}); err != nil {
		t.Fatal(err)
	}
	sh := rt.shards[0].Load()
	body := map[string]any{"metadata": map[string]any{"uid": "u1"}}
	done := make(chan error, 1)
	go func() {
		done <- rt.RunDaemon(t.Context(), &causes.Call{Handler: rt.Specs()[0], Cause: causes.Cause{Body: body},
			Logger: slog.Default(), Daemon: &causes.DaemonLink{Stopped: context.Background(), Latest: func() map[string]any { return body },
				Flush: func(map[string]any) {
					// Parked, the shard released: mark the call over the budget, as
					// the memory watch does when the whole runtime is over it.
					if err := sh.lock(context.Background()); err != nil {
						return
					}
					for _, th := range sh.threads {
						if th.cs != nil && th.cs.daemon {
							th.cs.mem.hit.Store(true)
						}
					}
					sh.unlock()
				}}})
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrMemoryBudget) && (err == nil || !strings.Contains(err.Error(), ErrMemoryBudget.Error())) {
			t.Fatalf("daemon ended with %v, want the memory budget error", err)
		}
	case <-time.After(promptWait):
		t.Fatal("the daemon caught the budget error and ran on without a deadline")
	}
}
