package scripttest

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/luaop/luaop/handling"
)

// luaop test judges an attempt with the operator's default backoff (luaop run
// --default-backoff, given to luaop test the same way): a handler with a timeout
// that fails with an arbitrary error is retried when the backoff fits in what is
// left of its timeout and fails for good at once when it does not.
func TestTheVerdictLooksAheadWithTheDefaultBackoff(t *testing.T) {
	dir := t.TempDir()
	src := "local luaop = require('luaop')\n" +
		`luaop.on.create("v1/configmaps", function(ctx) error("not yet") end, {id = "h", timeout = 30})`
	if err := os.WriteFile(filepath.Join(dir, "h.lua"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		backoff time.Duration
		want    handling.Outcome
		delay   time.Duration
	}{
		{0, handling.OutcomeFailure, 0}, // kopf's 60 s: past the 30 s timeout
		{10 * time.Second, handling.OutcomeRetry, 10 * time.Second},
		{45 * time.Second, handling.OutcomeFailure, 0},
	} {
		c := Case{Handler: "h", Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": "c", "namespace": "default"}}}
		ex, err := Execute(t.Context(), Options{Scripts: dir, DefaultBackoff: tc.backoff}, c)
		if err != nil {
			t.Fatal(err)
		}
		if v := ex.Verdict; v.Outcome != tc.want || v.Delay != tc.delay {
			t.Errorf("--default-backoff %s: %s in %s (%s), want %s in %s", tc.backoff, v.Outcome, v.Delay, v.Message, tc.want, tc.delay)
		}
	}
}
