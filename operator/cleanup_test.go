package operator

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// Cleanup handlers run when the operator stops, but not when it was told to stop
// writing at once (a lost shard membership): they write through luaop.kube while
// the other replicas take its objects.
func TestCleanupIsSkippedWhenToldToStopWritingAtOnce(t *testing.T) {
	for _, atOnce := range []bool{false, true} {
		var mu sync.Mutex
		var buf strings.Builder
		log := slog.New(slog.NewJSONHandler(lockedBuilder{&mu, &buf}, &slog.HandlerOptions{Level: slog.LevelDebug}))
		opts := Options{Logger: log}
		if atOnce {
			stop := make(chan struct{})
			close(stop)
			opts.Processing.StopAtOnce = stop
		}
		op := hookOperator(t, `luaop.on.cleanup(function(ctx) end, {id = "tidy"})`, opts)
		op.runCleanup(t.Context())
		mu.Lock()
		out := buf.String()
		mu.Unlock()
		ran := strings.Contains(out, `"msg":"handler succeeded"`) && strings.Contains(out, `"handler":"tidy"`)
		if ran == atOnce {
			t.Errorf("told to stop writing at once: %v; the cleanup handler ran: %v\n%s", atOnce, ran, out)
		}
		if atOnce && !strings.Contains(out, "cleanup handlers not run") {
			t.Errorf("the skipped cleanup is not in the log:\n%s", out)
		}
	}
}
