package operator

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/luaop/luaop/handling"
	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/scripttest"
)

// The operator's hooks and `luaop test` run one rule (handling): a startup hook's
// case (handler: ID, no object) reports the verdict the operator reaches on the
// hook's first attempt: a retry after the same delay, or a failure for good with
// the same message.
func TestLuaopTestRunsTheHooksRules(t *testing.T) {
	for _, tc := range []struct {
		name    string
		src     string
		outcome handling.Outcome
		delay   time.Duration
	}{
		{"success", `luaop.on.startup(function(ctx) end, {id = "s"})`, handling.OutcomeSuccess, 0},
		{"a temporary error", `luaop.on.startup(function(ctx) if ctx.retry < 1 then error(luaop.temporary_error("later", 3)) end end, {id = "s"})`, handling.OutcomeRetry, 3 * time.Second},
		{"an arbitrary error", `luaop.on.startup(function(ctx) if ctx.retry < 1 then error("boom") end end, {id = "s", backoff = 7})`, handling.OutcomeRetry, 7 * time.Second},
		{"a permanent error", `luaop.on.startup(function(ctx) error(luaop.permanent_error("misconfigured")) end, {id = "s"})`, handling.OutcomeFailure, 0},
		{"the last retry", `luaop.on.startup(function(ctx) error("nope") end, {id = "s", retries = 1})`, handling.OutcomeFailure, 0},
		{"the timeout ahead", `luaop.on.startup(function(ctx) error(luaop.temporary_error("slow", 10)) end, {id = "s", timeout = 5})`, handling.OutcomeFailure, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			src := "local luaop = require('luaop')\n" + tc.src
			if err := os.WriteFile(filepath.Join(dir, "hooks.lua"), []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			ex, err := scripttest.Execute(t.Context(), scripttest.Options{Scripts: dir}, scripttest.Case{Handler: "s"})
			if err != nil {
				t.Fatalf("luaop test: %v", err)
			}
			v := ex.Verdict
			if v.Outcome != tc.outcome || v.Delay != tc.delay {
				t.Errorf("luaop test's verdict: %s in %s (error %v), want %s in %s", v.Outcome, v.Delay, ex.Err, tc.outcome, tc.delay)
			}

			op := hookOperator(t, tc.src, Options{})
			waits := fakeHookClock(op)
			runErr := op.runHooks(t.Context(), causes.KindStartup)
			sleeps := waits()
			switch v.Outcome {
			case handling.OutcomeSuccess:
				if runErr != nil || len(sleeps) > 0 {
					t.Errorf("the operator: %v after waits %v; luaop test: a success", runErr, sleeps)
				}
			case handling.OutcomeRetry:
				if runErr != nil || fmt.Sprint(sleeps) != fmt.Sprint([]time.Duration{v.Delay}) {
					t.Errorf("the operator: %v after waits %v; luaop test: a retry in %s", runErr, sleeps, v.Delay)
				}
			case handling.OutcomeFailure:
				if runErr == nil || !strings.HasSuffix(runErr.Error(), v.Message) || len(sleeps) > 0 {
					t.Errorf("the operator: %v after waits %v; luaop test: a failure for good, %q", runErr, sleeps, v.Message)
				}
			}
		})
	}
}
