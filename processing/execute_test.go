package processing

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

func TestExhausted(t *testing.T) {
	tests := []struct {
		name         string
		spec         causes.Spec
		rec          state.HandlerRecord
		want         bool
		wantContains []string
	}{
		{name: "no limits, many retries", spec: causes.Spec{ID: "h"},
			rec: state.HandlerRecord{Started: tp(t0.Add(-24 * time.Hour)), Retries: 1000}, want: false},
		{name: "never started, with a timeout", spec: causes.Spec{ID: "h", Timeout: time.Minute},
			rec: state.HandlerRecord{}, want: false},
		{name: "within the timeout", spec: causes.Spec{ID: "h", Timeout: 10 * time.Minute},
			rec: state.HandlerRecord{Started: tp(t0.Add(-9 * time.Minute)), Retries: 4}, want: false},
		{name: "timeout reached exactly", spec: causes.Spec{ID: "h", Timeout: 10 * time.Minute},
			rec:  state.HandlerRecord{Started: tp(t0.Add(-10 * time.Minute)), Message: "still broken"},
			want: true, wantContains: []string{"h", "timed out", "10m0s", "still broken"}},
		{name: "timeout long passed", spec: causes.Spec{ID: "create-db", Timeout: time.Minute},
			rec:  state.HandlerRecord{Started: tp(t0.Add(-time.Hour)), Retries: 1, Message: "connection refused"},
			want: true, wantContains: []string{"create-db", "timed out", "connection refused"}},
		{name: "fewer retries than the limit", spec: causes.Spec{ID: "h", Retries: 3},
			rec: state.HandlerRecord{Started: tp(t0), Retries: 2}, want: false},
		{name: "retries limit reached", spec: causes.Spec{ID: "h", Retries: 3},
			rec:  state.HandlerRecord{Started: tp(t0), Retries: 3, Message: "nope"},
			want: true, wantContains: []string{"h", "3 retries", "nope"}},
		{name: "retries limit exceeded", spec: causes.Spec{ID: "h", Retries: 1},
			rec: state.HandlerRecord{Started: tp(t0), Retries: 5}, want: true, wantContains: []string{"retries"}},
		{name: "zero retries means unlimited", spec: causes.Spec{ID: "h", Retries: 0},
			rec: state.HandlerRecord{Started: tp(t0), Retries: 99}, want: false},
		{name: "both limits set, neither reached", spec: causes.Spec{ID: "h", Retries: 5, Timeout: time.Hour},
			rec: state.HandlerRecord{Started: tp(t0.Add(-time.Minute)), Retries: 4}, want: false},
		{name: "both limits set, timeout reached first is reported", spec: causes.Spec{ID: "h", Retries: 5, Timeout: time.Minute},
			rec: state.HandlerRecord{Started: tp(t0.Add(-time.Hour)), Retries: 5}, want: true, wantContains: []string{"timed out"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg, got := exhausted(tt.spec, tt.rec, t0)
			if got != tt.want {
				t.Fatalf("exhausted = %v (%q), want %v", got, msg, tt.want)
			}
			if !got && msg != "" {
				t.Errorf("not exhausted but message %q", msg)
			}
			for _, s := range tt.wantContains {
				if !strings.Contains(msg, s) {
					t.Errorf("message %q does not mention %q", msg, s)
				}
			}
		})
	}
}

func TestFoldOutcome(t *testing.T) {
	earlier := t0.Add(-5 * time.Minute)
	plain := errors.New("database unreachable")
	temp := &causes.TemporaryError{Message: "not ready", Delay: 30 * time.Second}
	perm := &causes.PermanentError{Message: "invalid spec"}
	retried := state.HandlerRecord{Started: tp(earlier), Retries: 2, Delayed: tp(t0.Add(-time.Second)), Message: "old error", Purpose: "create"}

	never := time.Duration(-1) // wantDelay: no delay expected
	tests := []struct {
		name string
		spec causes.Spec
		rec  state.HandlerRecord
		err  error

		want         Outcome
		wantRetries  int
		wantDelay    time.Duration // Delayed - now; never: Delayed is nil
		wantSuccess  bool
		wantFailure  bool
		wantStarted  time.Time
		wantMessage  string
		checkMessage bool
	}{
		{name: "success on the first attempt", spec: causes.Spec{ID: "h"}, err: nil,
			want: OutcomeSuccess, wantDelay: never, wantSuccess: true, wantStarted: t0, wantMessage: "", checkMessage: true},
		{name: "success after retries keeps started and clears delay and message", spec: causes.Spec{ID: "h"}, rec: retried, err: nil,
			want: OutcomeSuccess, wantRetries: 2, wantDelay: never, wantSuccess: true, wantStarted: earlier, wantMessage: "", checkMessage: true},

		{name: "temporary error retries after its delay", spec: causes.Spec{ID: "h"}, err: temp,
			want: OutcomeRetry, wantRetries: 1, wantDelay: 30 * time.Second, wantStarted: t0, wantMessage: temp.Message, checkMessage: true},
		{name: "temporary error counts on top of earlier retries", spec: causes.Spec{ID: "h"}, rec: retried, err: temp,
			want: OutcomeRetry, wantRetries: 3, wantDelay: 30 * time.Second, wantStarted: earlier, wantMessage: temp.Message, checkMessage: true},
		{name: "wrapped temporary error is recognised", spec: causes.Spec{ID: "h"}, err: fmt.Errorf("lua: %w", temp),
			want: OutcomeRetry, wantRetries: 1, wantDelay: 30 * time.Second, wantStarted: t0},
		{name: "temporary error with no delay is due at once", spec: causes.Spec{ID: "h"}, err: &causes.TemporaryError{Message: "again"},
			want: OutcomeRetry, wantRetries: 1, wantDelay: 0, wantStarted: t0},
		{name: "temporary error wins over errors=permanent", spec: causes.Spec{ID: "h", Errors: causes.ErrorsPermanent}, err: temp,
			want: OutcomeRetry, wantRetries: 1, wantDelay: 30 * time.Second, wantStarted: t0},
		{name: "temporary error wins over errors=ignored", spec: causes.Spec{ID: "h", Errors: causes.ErrorsIgnored}, err: temp,
			want: OutcomeRetry, wantRetries: 1, wantDelay: 30 * time.Second, wantStarted: t0},
		{name: "temporary error delay is not the handler's backoff", spec: causes.Spec{ID: "h", Backoff: time.Hour}, err: temp,
			want: OutcomeRetry, wantRetries: 1, wantDelay: 30 * time.Second, wantStarted: t0},

		{name: "permanent error fails for good", spec: causes.Spec{ID: "h"}, err: perm,
			want: OutcomeFailure, wantDelay: never, wantFailure: true, wantStarted: t0, wantMessage: "invalid spec", checkMessage: true},
		{name: "permanent error after retries keeps started and retries", spec: causes.Spec{ID: "h"}, rec: retried, err: perm,
			want: OutcomeFailure, wantRetries: 2, wantDelay: never, wantFailure: true, wantStarted: earlier, wantMessage: "invalid spec", checkMessage: true},
		{name: "wrapped permanent error is recognised", spec: causes.Spec{ID: "h"}, err: fmt.Errorf("lua: %w", perm),
			want: OutcomeFailure, wantDelay: never, wantFailure: true, wantStarted: t0},
		{name: "permanent error wins over errors=ignored", spec: causes.Spec{ID: "h", Errors: causes.ErrorsIgnored}, err: perm,
			want: OutcomeFailure, wantDelay: never, wantFailure: true, wantStarted: t0},

		{name: "arbitrary error, default mode, default backoff 60s", spec: causes.Spec{ID: "h"}, err: plain,
			want: OutcomeRetry, wantRetries: 1, wantDelay: 60 * time.Second, wantStarted: t0, wantMessage: plain.Error(), checkMessage: true},
		{name: "arbitrary error, temporary, handler backoff", spec: causes.Spec{ID: "h", Errors: causes.ErrorsTemporary, Backoff: 5 * time.Second}, err: plain,
			want: OutcomeRetry, wantRetries: 1, wantDelay: 5 * time.Second, wantStarted: t0},
		{name: "arbitrary error, temporary, zero backoff means 60s", spec: causes.Spec{ID: "h", Errors: causes.ErrorsTemporary, Backoff: 0}, err: plain,
			want: OutcomeRetry, wantRetries: 1, wantDelay: 60 * time.Second, wantStarted: t0},
		{name: "arbitrary error, temporary, after retries", spec: causes.Spec{ID: "h", Errors: causes.ErrorsTemporary, Backoff: 10 * time.Second}, rec: retried, err: plain,
			want: OutcomeRetry, wantRetries: 3, wantDelay: 10 * time.Second, wantStarted: earlier, wantMessage: plain.Error(), checkMessage: true},
		{name: "arbitrary error, permanent mode fails for good", spec: causes.Spec{ID: "h", Errors: causes.ErrorsPermanent, Backoff: 5 * time.Second}, err: plain,
			want: OutcomeFailure, wantDelay: never, wantFailure: true, wantStarted: t0, wantMessage: plain.Error(), checkMessage: true},
		{name: "arbitrary error, ignored mode counts as done", spec: causes.Spec{ID: "h", Errors: causes.ErrorsIgnored}, err: plain,
			want: OutcomeIgnored, wantDelay: never, wantSuccess: true, wantStarted: t0},
		{name: "arbitrary error, ignored mode after retries", spec: causes.Spec{ID: "h", Errors: causes.ErrorsIgnored}, rec: retried, err: plain,
			want: OutcomeIgnored, wantRetries: 2, wantDelay: never, wantSuccess: true, wantStarted: earlier},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, outcome := foldOutcome(tt.spec, tt.rec, t0, tt.err)
			if outcome != tt.want {
				t.Fatalf("outcome = %q, want %q (record %+v)", outcome, tt.want, got)
			}
			if got.Retries != tt.wantRetries {
				t.Errorf("retries = %d, want %d", got.Retries, tt.wantRetries)
			}
			switch {
			case tt.wantDelay == never && got.Delayed != nil:
				t.Errorf("delayed = %v, want none", *got.Delayed)
			case tt.wantDelay != never && got.Delayed == nil:
				t.Errorf("delayed = none, want now+%v", tt.wantDelay)
			case tt.wantDelay != never && !got.Delayed.Equal(t0.Add(tt.wantDelay)):
				t.Errorf("delayed = now+%v, want now+%v", got.Delayed.Sub(t0), tt.wantDelay)
			}
			if got.Success != tt.wantSuccess || got.Failure != tt.wantFailure {
				t.Errorf("success, failure = %v, %v; want %v, %v", got.Success, got.Failure, tt.wantSuccess, tt.wantFailure)
			}
			if got.Started == nil || !got.Started.Equal(tt.wantStarted) {
				t.Errorf("started = %v, want %v", got.Started, tt.wantStarted)
			}
			finished := tt.wantSuccess || tt.wantFailure
			if got.Finished() != finished {
				t.Errorf("finished = %v, want %v", got.Finished(), finished)
			}
			if finished && (got.Stopped == nil || !got.Stopped.Equal(t0)) {
				t.Errorf("stopped = %v, want %v", got.Stopped, t0)
			}
			if !finished && got.Stopped != nil {
				t.Errorf("stopped = %v, want none while retrying", *got.Stopped)
			}
			if tt.checkMessage && got.Message != tt.wantMessage {
				t.Errorf("message = %q, want %q", got.Message, tt.wantMessage)
			}
			if got.Purpose != tt.rec.Purpose {
				t.Errorf("purpose = %q, want it kept as %q", got.Purpose, tt.rec.Purpose)
			}
			// The caller's record is left as it was.
			if tt.rec.Started != nil && !tt.rec.Started.Equal(earlier) ||
				tt.rec.Delayed != nil && !tt.rec.Delayed.Equal(t0.Add(-time.Second)) ||
				tt.rec.Retries != 0 && tt.rec.Retries != retried.Retries {
				t.Errorf("foldOutcome changed its input record: %+v", tt.rec)
			}
		})
	}
}

// A handler with retries=N is attempted exactly N times, then fails for good with the
// last error visible; with a timeout it stops once the time since the first attempt is up.
func TestRetryLimitsOverSeveralAttempts(t *testing.T) {
	tests := []struct {
		name         string
		spec         causes.Spec
		step         time.Duration // time between attempts
		wantAttempts int
		wantMessage  string
	}{
		{name: "retries=3 allows three attempts", spec: causes.Spec{ID: "h", Retries: 3, Backoff: time.Second}, step: time.Second,
			wantAttempts: 3, wantMessage: "exceeded its 3 retries"},
		{name: "retries=1 allows one attempt", spec: causes.Spec{ID: "h", Retries: 1, Backoff: time.Second}, step: time.Second,
			wantAttempts: 1, wantMessage: "exceeded its 1 retries"},
		{name: "timeout 10s with attempts every 4s", spec: causes.Spec{ID: "h", Timeout: 10 * time.Second, Backoff: 4 * time.Second}, step: 4 * time.Second,
			wantAttempts: 3, wantMessage: "timed out"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var rec state.HandlerRecord
			now := t0
			attempts := 0
			for i := 0; i < 100; i++ {
				if msg, ex := exhausted(tt.spec, rec, now); ex {
					if !strings.Contains(msg, tt.wantMessage) || !strings.Contains(msg, "flaky backend") {
						t.Errorf("exhausted message %q, want it to contain %q and the last error", msg, tt.wantMessage)
					}
					break
				}
				if !rec.Awake(now) {
					t.Fatalf("attempt %d at %v: handler is asleep until %v", attempts+1, now, rec.Delayed)
				}
				attempts++
				rec, _ = foldOutcome(tt.spec, rec, now, errors.New("flaky backend"))
				now = now.Add(tt.step)
			}
			if attempts != tt.wantAttempts {
				t.Errorf("attempts = %d, want %d", attempts, tt.wantAttempts)
			}
			if rec.Started == nil || !rec.Started.Equal(t0) {
				t.Errorf("started = %v, want the first attempt %v", rec.Started, t0)
			}
		})
	}
}
