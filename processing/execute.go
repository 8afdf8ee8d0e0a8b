package processing

import (
	"fmt"
	"time"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// Outcome names how one handler attempt ended, for logs, events and metrics.
type Outcome string

const (
	OutcomeSuccess Outcome = "success"
	OutcomeRetry   Outcome = "retry"
	OutcomeFailure Outcome = "failure"
	OutcomeIgnored Outcome = "ignored" // failed, but errors=ignored counts it as done
)

// defaultBackoff is kopf's delay after an arbitrary error.
const defaultBackoff = 60 * time.Second

// exhausted checks, before an attempt, whether the handler ran out of time or tries
// (kopf checks these before the next attempt, so the last error stays visible).
func exhausted(spec causes.Spec, rec state.HandlerRecord, now time.Time) (string, bool) {
	if spec.Timeout > 0 && rec.Started != nil && now.Sub(*rec.Started) >= spec.Timeout {
		return fmt.Sprintf("handler %s timed out after %s (last error: %s)", spec.ID, spec.Timeout, rec.Message), true
	}
	if spec.Retries > 0 && rec.Retries >= spec.Retries {
		return fmt.Sprintf("handler %s exceeded its %d retries (last error: %s)", spec.ID, spec.Retries, rec.Message), true
	}
	return "", false
}

// foldOutcome turns one attempt's result into the handler's new progress record.
func foldOutcome(spec causes.Spec, rec state.HandlerRecord, now time.Time, err error) (state.HandlerRecord, Outcome) {
	if rec.Started == nil {
		rec.Started = &now
	}
	if err == nil {
		rec.Success, rec.Failure, rec.Delayed, rec.Stopped, rec.Message = true, false, nil, &now, ""
		return rec, OutcomeSuccess
	}
	rec.Message = err.Error()
	if tmp, ok := causes.AsTemporary(err); ok {
		return lookAhead(spec, retryAfter(rec, now, tmp.Delay), now)
	}
	if causes.IsPermanent(err) {
		rec.Failure, rec.Stopped, rec.Delayed = true, &now, nil
		return rec, OutcomeFailure
	}
	switch spec.Errors {
	case causes.ErrorsPermanent:
		rec.Failure, rec.Stopped, rec.Delayed = true, &now, nil
		return rec, OutcomeFailure
	case causes.ErrorsIgnored:
		rec.Success, rec.Stopped, rec.Delayed, rec.Message = true, &now, nil, ""
		return rec, OutcomeIgnored
	}
	backoff := spec.Backoff
	if backoff <= 0 {
		backoff = defaultBackoff
	}
	return lookAhead(spec, retryAfter(rec, now, backoff), now)
}

// lookAhead declares a handler failed at its last allowed attempt (kopf), instead of
// one backoff later: when no retry is left, or the next one would start after the
// handler's timeout.
func lookAhead(spec causes.Spec, rec state.HandlerRecord, now time.Time) (state.HandlerRecord, Outcome) {
	msg, failed := "", false
	switch {
	case spec.Retries > 0 && rec.Retries >= spec.Retries:
		msg, failed = fmt.Sprintf("handler %s exceeded its %d retries (last error: %s)", spec.ID, spec.Retries, rec.Message), true
	case spec.Timeout > 0 && rec.Started != nil && rec.Delayed != nil && !rec.Delayed.Before(rec.Started.Add(spec.Timeout)):
		msg, failed = fmt.Sprintf("handler %s timed out after %s (last error: %s)", spec.ID, spec.Timeout, rec.Message), true
	}
	if !failed {
		return rec, OutcomeRetry
	}
	rec.Failure, rec.Stopped, rec.Delayed, rec.Message = true, &now, nil, msg
	return rec, OutcomeFailure
}

func retryAfter(rec state.HandlerRecord, now time.Time, delay time.Duration) state.HandlerRecord {
	at := now.Add(delay)
	rec.Retries++
	rec.Delayed = &at
	return rec
}
