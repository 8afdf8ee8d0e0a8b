package handling

import (
	"fmt"
	"strings"
	"time"

	"github.com/luaop/luaop/processing/causes"
)

// DefaultBackoff is kopf's delay after an arbitrary error, when neither the
// handler nor the operator sets one.
const DefaultBackoff = 60 * time.Second

// Outcome names how one handler attempt ended, for logs, events and metrics.
type Outcome string

const (
	OutcomeSuccess Outcome = "success"
	OutcomeRetry   Outcome = "retry"
	OutcomeFailure Outcome = "failure"
	OutcomeIgnored Outcome = "ignored" // failed, but errors=ignored counts it as done
)

// ErrorClass is what an error of a handler means, decided once for every engine.
type ErrorClass int

const (
	// NoError: the attempt succeeded.
	NoError ErrorClass = iota
	// Retry: a TemporaryError, tried again after its own delay.
	Retry
	// Backoff: an arbitrary error in errors = "temporary" mode (the default), tried
	// again after the handler's backoff.
	Backoff
	// Permanent: a PermanentError, or any error in errors = "permanent" mode.
	Permanent
	// Ignored: an arbitrary error in errors = "ignored" mode, counted as a success.
	Ignored
)

// Classify tells what err means for a handler of spec, and after which delay it is
// tried again (Retry, Backoff). A TemporaryError is retried whatever the error mode
// (kopf); spec.Backoff <= 0 means DefaultBackoff (see WithBackoff for the
// operator's own default).
//
// A raw event handler's error is always ignored: kopf runs them with its errors
// mode IGNORED and keeps no progress to retry them by
// (kopf/_core/reactor/processing.py, process_watching_cause).
func Classify(spec causes.Spec, err error) (ErrorClass, time.Duration) {
	if err == nil {
		return NoError, 0
	}
	if spec.Kind == causes.KindEvent {
		return Ignored, 0
	}
	if tmp, ok := causes.AsTemporary(err); ok {
		return Retry, tmp.Delay
	}
	if causes.IsPermanent(err) || spec.Errors == causes.ErrorsPermanent {
		return Permanent, 0
	}
	if spec.Errors == causes.ErrorsIgnored {
		return Ignored, 0
	}
	return Backoff, BackoffOf(spec)
}

// BackoffOf is the delay after an arbitrary error of a handler of spec.
func BackoffOf(spec causes.Spec) time.Duration {
	if spec.Backoff > 0 {
		return spec.Backoff
	}
	return DefaultBackoff
}

// WithBackoff is spec with its backoff, or operatorDefault when it sets none (the
// operator's --default-backoff; 0 keeps DefaultBackoff).
func WithBackoff(spec causes.Spec, operatorDefault time.Duration) causes.Spec {
	if spec.Backoff <= 0 {
		spec.Backoff = operatorDefault
	}
	return spec
}

// Attempt is what is known of a handler's attempts when one ends (or, for
// Exhausted, before one starts).
type Attempt struct {
	// Retries is the number of failed attempts before this one (ctx.retry).
	Retries int
	// Runtime is the time since the first attempt started.
	Runtime time.Duration
}

// Verdict is the judgement of one attempt.
type Verdict struct {
	Outcome Outcome
	Class   ErrorClass
	// Delay is when to try again, for OutcomeRetry.
	Delay time.Duration
	// Retried: the error asked for another attempt (Retry, Backoff), so the attempt
	// counts as a retry even when the look-ahead fails the handler for good.
	Retried bool
	// Message is the handler's final message, for OutcomeFailure: the error's own
	// for a permanent one, else the retries or the timeout it ran out of.
	Message string
}

// Judge is kopf's verdict on one attempt that ended with err (nil: a success): an
// ignored error counts as a success; a permanent one fails the handler for good; a
// TemporaryError or an arbitrary error is retried after its delay, unless kopf's
// look-ahead sees that no retry is left or that the next attempt would start past
// the handler's timeout: the last allowed attempt then fails for good, instead of
// one backoff later.
func Judge(spec causes.Spec, a Attempt, err error) Verdict {
	class, delay := Classify(spec, err)
	switch class {
	case NoError:
		return Verdict{Outcome: OutcomeSuccess, Class: class}
	case Ignored:
		return Verdict{Outcome: OutcomeIgnored, Class: class}
	case Permanent:
		return Verdict{Outcome: OutcomeFailure, Class: class, Message: err.Error()}
	}
	v := Verdict{Outcome: OutcomeRetry, Class: class, Delay: delay, Retried: true}
	// kopf looks ahead at the timeout first, then at the retries.
	switch {
	case spec.Timeout > 0 && a.Runtime+delay >= spec.Timeout:
		v.Outcome, v.Delay, v.Message = OutcomeFailure, 0, timeoutMessage(spec, ErrorMessage(err))
	case spec.Retries > 0 && a.Retries+1 >= spec.Retries:
		v.Outcome, v.Delay, v.Message = OutcomeFailure, 0, retriesMessage(spec, ErrorMessage(err))
	}
	return v
}

// Exhausted is kopf's strict check before an attempt: the handler's timeout since
// its first attempt, or its retries, ran out meanwhile (kopf checks before the next
// attempt, so that the last error stays visible: lastError, "" when none is known).
func Exhausted(spec causes.Spec, a Attempt, lastError string) (string, bool) {
	if spec.Timeout > 0 && a.Runtime >= spec.Timeout {
		return timeoutMessage(spec, lastError), true
	}
	if spec.Retries > 0 && a.Retries >= spec.Retries {
		return retriesMessage(spec, lastError), true
	}
	return "", false
}

// ErrorMessage is what a handler's error says, without the retry a TemporaryError
// asks for (its delay is the record's, and a final failure is retried no more):
// the message a progress record keeps and a final failure quotes as its last error
// (kopf's str() of the error).
func ErrorMessage(err error) string {
	if err == nil {
		return ""
	}
	if tmp, ok := causes.AsTemporary(err); ok {
		// A wrapper's text holds the TemporaryError's own, before or after what the
		// wrapper adds ("%w: detail" too); a wrapper that does not quote it keeps
		// its text.
		return strings.Replace(err.Error(), tmp.Error(), tmp.Message, 1)
	}
	return err.Error()
}

// Failed is the error of a handler of spec that failed for good with err after
// the verdict v, naming the handler once: the verdict's message when it names it
// already (it ran out of retries or time), else "handler <id> failed: <err>".
func Failed(spec causes.Spec, v Verdict, err error) error {
	if final := v.Error(err); final != err {
		return final
	}
	return fmt.Errorf("handler %s failed: %w", spec.ID, err)
}

// Error is the handler's final error for a failed verdict: err itself when the
// verdict's message is err's, else the message wrapping err.
func (v Verdict) Error(err error) error {
	if err == nil || v.Message == "" || v.Message == err.Error() {
		return err
	}
	return &finalError{message: v.Message, err: err}
}

type finalError struct {
	message string
	err     error
}

func (e *finalError) Error() string { return e.message }
func (e *finalError) Unwrap() error { return e.err }

// The one form of a handler's messages when it runs out of tries or time.
func retriesMessage(spec causes.Spec, lastError string) string {
	return fmt.Sprintf("handler %s exceeded its %d retries", spec.ID, spec.Retries) + lastErrorSuffix(lastError)
}

func timeoutMessage(spec causes.Spec, lastError string) string {
	return fmt.Sprintf("handler %s timed out after %s", spec.ID, spec.Timeout) + lastErrorSuffix(lastError)
}

func lastErrorSuffix(lastError string) string {
	if lastError == "" {
		return ""
	}
	return " (last error: " + lastError + ")"
}
