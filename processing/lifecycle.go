package processing

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"time"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// Lifecycle chooses which of the ready handlers of a cause run in this cycle.
type Lifecycle string

const (
	// LifecycleAsap runs one handler per cycle, the one with the fewest retries first
	// (kopf's default): every outcome is persisted before the next handler starts.
	LifecycleAsap Lifecycle = "asap"
	// LifecycleAllAtOnce runs every ready handler in one cycle.
	LifecycleAllAtOnce Lifecycle = "all-at-once"
	// LifecycleOneByOne runs one handler per cycle in registration order.
	LifecycleOneByOne Lifecycle = "one-by-one"
	// LifecycleRandomized runs one handler per cycle, chosen at random (kopf's
	// randomized): handlers that must not depend on each other's order are seen
	// not to.
	LifecycleRandomized Lifecycle = "randomized"
	// LifecycleShuffled runs every ready handler in one cycle, in a random order
	// (kopf's shuffled).
	LifecycleShuffled Lifecycle = "shuffled"
)

// ParseLifecycle checks a lifecycle setting.
func ParseLifecycle(s string) (Lifecycle, error) {
	switch l := Lifecycle(s); l {
	case LifecycleAsap, LifecycleAllAtOnce, LifecycleOneByOne, LifecycleRandomized, LifecycleShuffled:
		return l, nil
	}
	return "", fmt.Errorf("unknown lifecycle %q: use asap, one-by-one, all-at-once, randomized or shuffled", s)
}

// handlerState pairs a handler with its persisted progress for the current cause.
type handlerState struct {
	spec   causes.Spec
	record state.HandlerRecord
	found  bool // the object holds a record of this handler for this cause
	// stored is the record the object holds, of this cause or another: kopf writes
	// a record only when it changed (progression.State.store, its _origin).
	stored state.HandlerRecord
}

// changed tells whether the record must be written: it differs from what the
// object holds for this cause, or the object holds none and the handler started.
func (h handlerState) changed() bool {
	if !h.found {
		return h.record.Started != nil
	}
	return !sameRecord(h.record, h.stored)
}

// sameRecord compares two records field by field, times by instant.
func sameRecord(a, b state.HandlerRecord) bool {
	sameTime := func(x, y *time.Time) bool {
		return x == nil && y == nil || x != nil && y != nil && x.Equal(*y)
	}
	return sameTime(a.Started, b.Started) && sameTime(a.Stopped, b.Stopped) && sameTime(a.Delayed, b.Delayed) &&
		a.Purpose == b.Purpose && a.Retries == b.Retries && a.Success == b.Success && a.Failure == b.Failure &&
		a.Message == b.Message && slices.Equal(a.Subrefs, b.Subrefs)
}

// selectToRun returns the handlers to run now: awake (not finished, not delayed into
// the future), chosen by the lifecycle. Order of the input is registration order.
func selectToRun(lifecycle Lifecycle, handlers []handlerState, now time.Time) []handlerState {
	return selectToRunWith(lifecycle, handlers, now, rand.IntN)
}

// selectToRunWith is selectToRun with the random choice of the randomized and
// shuffled lifecycles made by pick (an index below n).
func selectToRunWith(lifecycle Lifecycle, handlers []handlerState, now time.Time, pick func(n int) int) []handlerState {
	if lifecycle == LifecycleAsap || lifecycle == LifecycleOneByOne || lifecycle == "" {
		// One handler: the first awake one (one-by-one), or the first awake one
		// with the fewest retries (asap, a stable sort's first). One pass, no
		// copy: a parent with thousands of subhandlers selects one per cycle.
		best := -1
		for i := range handlers {
			if !handlers[i].record.Awake(now) {
				continue
			}
			if best < 0 || lifecycle != LifecycleOneByOne && handlers[i].record.Retries < handlers[best].record.Retries {
				best = i
			}
			if lifecycle == LifecycleOneByOne {
				break
			}
		}
		if best < 0 {
			return nil
		}
		return []handlerState{handlers[best]}
	}
	var awake []handlerState
	for _, h := range handlers {
		if h.record.Awake(now) {
			awake = append(awake, h)
		}
	}
	if len(awake) == 0 {
		return nil
	}
	switch lifecycle {
	case LifecycleAllAtOnce:
		return awake
	case LifecycleOneByOne:
		return awake[:1]
	case LifecycleRandomized:
		i := pick(len(awake))
		return awake[i : i+1]
	case LifecycleShuffled:
		for i := len(awake) - 1; i > 0; i-- { // Fisher-Yates
			j := pick(i + 1)
			awake[i], awake[j] = awake[j], awake[i]
		}
		return awake
	default:
		sort.SliceStable(awake, func(i, j int) bool { return awake[i].record.Retries < awake[j].record.Retries })
		return awake[:1]
	}
}

// allFinished tells whether every handler of the cause has succeeded or failed for good.
func allFinished(handlers []handlerState) bool {
	for _, h := range handlers {
		if !h.record.Finished() {
			return false
		}
	}
	return true
}

// earliestWakeup returns the soonest Delayed time among sleeping handlers.
func earliestWakeup(handlers []handlerState, now time.Time) (time.Time, bool) {
	var best time.Time
	for _, h := range handlers {
		if h.record.Sleeping(now) && (best.IsZero() || h.record.Delayed.Before(best)) {
			best = *h.record.Delayed
		}
	}
	return best, !best.IsZero()
}
