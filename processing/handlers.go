package processing

import (
	"context"

	"github.com/luaop/luaop/processing/causes"
)

// Handlers is what the processing core needs from the script runtime. Implementations
// must be safe for concurrent use: workers of different objects call them in parallel.
type Handlers interface {
	// Specs returns the handlers registered now. Reloads may replace the set at any
	// time; callers take a fresh snapshot per cycle. It must not block (a snapshot
	// behind an atomic pointer or a leaf lock): Refresh calls it under a leaf lock.
	// CodeHash and EvalHash of the specs that RevisitedOnReload must change whenever
	// what they evaluate does, or a reload leaves objects on the old handlers until
	// they change.
	Specs() []causes.Spec
	// Match evaluates the filters of a handler that live in the scripts (label,
	// annotation and `when` callbacks). Data-only filters are evaluated there too, so
	// that one place decides.
	Match(ctx context.Context, spec causes.Spec, cause causes.Cause) (bool, error)
	// Invoke runs one handler. The result's value, when not nil, is stored in
	// status.<handler id>. Errors classify as *causes.TemporaryError,
	// *causes.PermanentError or anything else (retried per the handler's error mode).
	Invoke(ctx context.Context, call causes.Call) (causes.Result, error)
	// Forget drops the per-object memory (memo) of an object that is gone.
	Forget(uid string)
}
