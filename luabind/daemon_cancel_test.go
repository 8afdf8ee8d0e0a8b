package luabind

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/luaop/luaop/processing/causes"
)

// cancelHarness runs one daemon of src (id "d") with a stop and a cancellation the
// test ends, and records every patch it flushes.
type cancelHarness struct {
	t            *testing.T
	rt           *Runtime
	stop, cancel context.CancelFunc
	link         *causes.DaemonLink
	done         chan error
	mu           sync.Mutex
	flushed      []map[string]any
	flushes      chan struct{}
	logs         *strings.Builder
	logMu        *sync.Mutex
}

func startCancelHarness(t *testing.T, src string) *cancelHarness {
	t.Helper()
	logs, logMu := &strings.Builder{}, &sync.Mutex{}
	// Its Get of "block" answers only when the call is cancelled: a daemon's kube
	// call is in flight when the test cancels it, whatever the machine's speed (a
	// quick answer let the loop reach its next round between the stop and the
	// cancellation).
	rt := New(Options{Shards: 1, Kube: untilCancelledKube{}, HandlerTimeout: 5 * time.Second,
		Logger: slog.New(slog.NewTextHandler(lockedWriter{logs, logMu}, nil))})
	t.Cleanup(rt.Close)
	if _, err := rt.Load(t.Context(), []Script{{Name: "d.lua", Source: []byte("local luaop = require('luaop')\n" + src)}}); err != nil {
		t.Fatal(err)
	}
	h := &cancelHarness{t: t, rt: rt, done: make(chan error, 1), flushes: make(chan struct{}, 100), logs: logs, logMu: logMu}
	stopped, stop := context.WithCancel(context.Background())
	cancelled, cancel := context.WithCancel(context.Background())
	h.stop, h.cancel = stop, cancel
	t.Cleanup(func() { stop(); cancel() })
	body := map[string]any{"metadata": map[string]any{"uid": "u1", "name": "a", "namespace": "ns"}}
	h.link = &causes.DaemonLink{Stopped: stopped, Cancelled: cancelled, Latest: func() map[string]any { return body },
		Flush: func(p map[string]any) {
			h.mu.Lock()
			h.flushed = append(h.flushed, p)
			h.mu.Unlock()
			h.flushes <- struct{}{}
		}}
	go func() {
		h.done <- rt.RunDaemon(t.Context(), &causes.Call{Handler: rt.Specs()[0], Cause: causes.Cause{Body: body},
			Logger: rt.opts.Logger, Daemon: h.link})
	}()
	return h
}

// untilCancelledKube answers a Get of "block" only when its call is cancelled, and
// any other as not found.
type untilCancelledKube struct{ notFoundKube }

func (k untilCancelledKube) Get(ctx context.Context, apiVersion, kind, namespace, name string) (map[string]any, error) {
	if name == "block" {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return k.notFoundKube.Get(ctx, apiVersion, kind, namespace, name)
}

type lockedWriter struct {
	b  *strings.Builder
	mu *sync.Mutex
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// waitFlush waits for the next flush (a sleep began) and returns status.n of it.
func (h *cancelHarness) waitFlush() any {
	h.t.Helper()
	select {
	case <-h.flushes:
	case err := <-h.done:
		h.t.Fatalf("the daemon ended (%v) instead of sleeping", err)
	case <-time.After(10 * time.Second):
		h.t.Fatal("the daemon never slept")
	}
	return h.lastN()
}

func (h *cancelHarness) lastN() any {
	h.mu.Lock()
	defer h.mu.Unlock()
	st, _ := h.flushed[len(h.flushed)-1]["status"].(map[string]any)
	return st["n"]
}

func (h *cancelHarness) ended() error {
	h.t.Helper()
	select {
	case err := <-h.done:
		return err
	case <-time.After(10 * time.Second):
		h.t.Fatal("the daemon did not end")
		return nil
	}
}

// A daemon written as kopf's async daemons are (a loop that relies on its
// cancellation) is told of its stop by one luaop.sleep returning false, then ended
// by its next blocking call; it does not spin. Inside pcall too: the cancellation
// cannot be caught.
func TestStoppedDaemonRelyingOnCancellationEnds(t *testing.T) {
	for _, tc := range []struct {
		name, loop string
		n          int64 // rounds when it ended: one after the false sleep, when the sleep is what blocks next
	}{
		{"sleep", `luaop.sleep(3600)`, 2},
		{"sleep in pcall", `pcall(luaop.sleep, 3600)`, 2},
		{"a kube call in pcall", `luaop.sleep(3600); pcall(luaop.kube.get, "v1", "ConfigMap", "ns", "block")`, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := startCancelHarness(t, `
luaop.daemon("example.com/v1/things", function(ctx)
  local n = 0
  while true do
    n = n + 1
    ctx.patch.status.n = n
    `+tc.loop+`
  end
end, { id = "d" })`)
			if n := h.waitFlush(); n != int64(1) {
				t.Fatalf("first sleep with n = %v", n)
			}
			h.stop()
			h.cancel() // no cancellation_backoff: cancelled with the stop
			err := h.ended()
			if !errors.Is(err, causes.ErrDaemonCancelled) {
				t.Fatalf("the daemon ended with %v, want its cancellation", err)
			}
			// The sleep returns false, then the daemon's next blocking call ends it.
			if n := h.lastN(); n != tc.n {
				t.Errorf("the daemon ran to n = %v after its stop, want %d", n, tc.n)
			}
		})
	}
}

// During the cancellation backoff, after the sleep that told it of its stop, a
// daemon's sleeps sleep (kopf's asyncio.sleep is not woken by the stop) and its
// API calls work: it can clean up. The cancellation then ends a sleep in progress.
func TestStoppedDaemonSleepsAndCallsDuringItsCancellationBackoff(t *testing.T) {
	h := startCancelHarness(t, `
luaop.daemon("example.com/v1/things", function(ctx)
  local n = 0
  while true do
    n = n + 1
    ctx.patch.status.n = n
    local _, err = luaop.kube.get("v1", "ConfigMap", "ns", "x")
    ctx.patch.status.err = err
    luaop.sleep(3600)
  end
end, { id = "d" })`)
	h.waitFlush()
	h.stop() // the backoff runs: not cancelled yet
	if n := h.waitFlush(); n != int64(2) {
		t.Fatalf("after the stop the daemon slept with n = %v, want 2", n)
	}
	h.mu.Lock()
	st := h.flushed[len(h.flushed)-1]["status"].(map[string]any)
	h.mu.Unlock()
	if !strings.Contains(st["err"].(string), "not found") {
		t.Errorf("the API call after the stop answered %v, want the server's answer", st["err"])
	}
	select {
	case <-h.flushes:
		t.Fatalf("the daemon went round again (n = %v): a sleep after the stop must sleep until the cancellation", h.lastN())
	case err := <-h.done:
		t.Fatalf("the daemon ended before its cancellation: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	h.cancel()
	if err := h.ended(); !errors.Is(err, causes.ErrDaemonCancelled) {
		t.Fatalf("the daemon ended with %v, want its cancellation", err)
	}
}

// Today's idiom keeps working: a loop on ctx.stopped() or on luaop.sleep's result
// ends by itself after its stop, and logs on its way out (ctx.logger is no
// cancellation point). A cleanup call after the loop needs cancellation_backoff:
// without it, the call ends the daemon.
func TestStoppedDaemonEndingByItselfAndCleaningUp(t *testing.T) {
	t.Run("loop on ctx.stopped", func(t *testing.T) {
		h := startCancelHarness(t, `
luaop.daemon("example.com/v1/things", function(ctx)
  ctx.patch.status.n = 1
  while not ctx.stopped() do luaop.sleep(3600) end
  ctx.logger.info("monitor stopped")
end, { id = "d" })`)
		h.waitFlush()
		h.stop()
		h.cancel()
		if err := h.ended(); err != nil {
			t.Fatalf("the daemon ended with %v, want its return", err)
		}
		h.logMu.Lock()
		defer h.logMu.Unlock()
		if !strings.Contains(h.logs.String(), "monitor stopped") {
			t.Errorf("no line logged on the way out:\n%s", h.logs.String())
		}
	})
	for _, backoff := range []bool{true, false} {
		name := map[bool]string{true: "cleanup within the backoff", false: "cleanup after the cancellation"}[backoff]
		t.Run(name, func(t *testing.T) {
			h := startCancelHarness(t, `
luaop.daemon("example.com/v1/things", function(ctx)
  ctx.patch.status.n = 1
  while luaop.sleep(3600) do end
  local _, err = luaop.kube.get("v1", "ConfigMap", "ns", "x")
  ctx.patch.status.cleanup = err
end, { id = "d" })`)
			h.waitFlush()
			h.stop()
			if !backoff {
				h.cancel()
			}
			err := h.ended()
			h.mu.Lock()
			st := h.flushed[len(h.flushed)-1]["status"].(map[string]any)
			h.mu.Unlock()
			if backoff && (err != nil || st["cleanup"] == nil) {
				t.Errorf("cleanup within the backoff: ended with %v, status %v; want the call answered and a return", err, st)
			}
			if !backoff && (!errors.Is(err, causes.ErrDaemonCancelled) || st["cleanup"] != nil) {
				t.Errorf("cleanup after the cancellation: ended with %v, status %v; want the cancellation at the call", err, st)
			}
		})
	}
}
