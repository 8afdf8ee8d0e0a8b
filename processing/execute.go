package processing

import (
	"time"

	"github.com/luaop/luaop/handling"
	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// Outcome names how one handler attempt ended, for logs, events and metrics
// (handling.Outcome: one vocabulary for every engine).
type Outcome = handling.Outcome

const (
	OutcomeSuccess = handling.OutcomeSuccess
	OutcomeRetry   = handling.OutcomeRetry
	OutcomeFailure = handling.OutcomeFailure
	OutcomeIgnored = handling.OutcomeIgnored // failed, but errors=ignored counts it as done
)

// exhausted checks, before an attempt, whether the handler ran out of time or tries
// (kopf checks these before the next attempt, so the last error stays visible).
func exhausted(spec causes.Spec, rec state.HandlerRecord, now time.Time) (string, bool) {
	return handling.Exhausted(spec, attemptOf(rec, now), rec.Message)
}

// attemptOf is what a progress record tells of a handler's attempts at now.
func attemptOf(rec state.HandlerRecord, now time.Time) handling.Attempt {
	a := handling.Attempt{Retries: rec.Retries}
	if rec.Started != nil {
		a.Runtime = now.Sub(*rec.Started)
	}
	return a
}

// foldOutcome turns one attempt's result into the handler's new progress record,
// by the verdict of handling.Judge.
func foldOutcome(spec causes.Spec, rec state.HandlerRecord, now time.Time, err error) (state.HandlerRecord, Outcome) {
	if rec.Started == nil {
		rec.Started = &now
	}
	if err == nil {
		rec.Success, rec.Failure, rec.Delayed, rec.Stopped, rec.Message = true, false, nil, &now, ""
		return rec, OutcomeSuccess
	}
	rec.Message = handling.ErrorMessage(err)
	v := handling.Judge(spec, attemptOf(rec, now), err)
	if v.Retried {
		rec.Retries++
	}
	switch v.Outcome {
	case OutcomeRetry:
		at := now.Add(v.Delay)
		rec.Delayed = &at
	case OutcomeIgnored:
		rec.Success, rec.Stopped, rec.Delayed, rec.Message = true, &now, nil, ""
	default:
		rec.Failure, rec.Stopped, rec.Delayed, rec.Message = true, &now, nil, v.Message
	}
	return rec, v.Outcome
}
