package processing

import (
	"context"
	"log/slog"
	"time"
)

// objectAttrs are the log fields that name an object, each a field of its own so
// that JSON logs can be queried by any of them: resource (as the scripts spell it,
// group/version/plural), kind, namespace (absent for cluster-scoped objects), name
// and uid (absent while unknown), then more.
func objectAttrs(key objectKey, kind, uid string, more ...any) []any {
	attrs := make([]any, 0, 10+len(more))
	attrs = append(attrs, "resource", key.resource.String())
	if kind != "" {
		attrs = append(attrs, "kind", kind)
	}
	if key.namespace != "" {
		attrs = append(attrs, "namespace", key.namespace)
	}
	attrs = append(attrs, "name", key.name)
	if uid != "" {
		attrs = append(attrs, "uid", uid)
	}
	return append(attrs, more...)
}

// kindOf is the kind of a resource's objects, "" while unknown.
func (o *Reactor) kindOf(key objectKey) string {
	if info := o.resourceInfo(key.resource); info != nil {
		return info.kind
	}
	return ""
}

// logOutcome writes the line of one handler attempt's outcome, for every kind of
// handler alike (kopf logs "Handler 'x' succeeded." and its failures for each):
// "handler succeeded" at successLevel, "handler will be retried" (a warning),
// "handler failed for good" (an error), "handler failed; ignored as configured
// (errors=ignored)" (a warning), each with the fields handler, reason (create,
// update, delete, resume, event, timer, daemon, index, startup, cleanup, probe) and
// took_ms, then error when there is one, then more.
func logOutcome(log *slog.Logger, successLevel slog.Level, id, reason string, outcome Outcome, took time.Duration, err error, more ...any) {
	if outcome == OutcomeSuccess && !log.Enabled(context.Background(), successLevel) {
		return // the common case in production (successes at debug): nothing built
	}
	attrs := make([]any, 0, 8+len(more))
	attrs = append(attrs, "handler", id, "reason", reason, "took_ms", tookMs(took))
	if err != nil {
		attrs = append(attrs, "error", err)
	}
	attrs = append(attrs, more...)
	switch outcome {
	case OutcomeSuccess:
		log.Log(context.Background(), successLevel, "handler succeeded", attrs...)
	case OutcomeRetry:
		log.Warn("handler will be retried", attrs...)
	case OutcomeFailure:
		log.Error("handler failed for good", attrs...)
	case OutcomeIgnored:
		log.Warn("handler failed; ignored as configured (errors=ignored)", attrs...)
	}
}
