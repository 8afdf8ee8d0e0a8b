package processing

import (
	"fmt"

	"github.com/luaop/luaop/handling"
	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// objectFacts is what cause detection knows about one object besides its body.
type objectFacts struct {
	// noticedByListing: the object was in the informer's initial listing, i.e. it
	// existed before this operator started. Only such objects get resume causes.
	noticedByListing bool
	// resumeIsHandled: a resume (or any full) cause was handled for it since start.
	resumeIsHandled bool
}

// detectedCause is a change cause, as handling builds it (handling.ChangeCause),
// with what detection learnt on the way.
type detectedCause struct {
	causes.Cause
	// diffBaseProblem is set when the stored diff-base could not be read; the object
	// is then treated as never handled (create), and the problem is reported.
	diffBaseProblem error
	// held are the field handlers' held-back values stored with the diff-base
	// (heldback.go); Old is without them.
	held map[string]heldValue
}

// detectChangeCause applies kopf's rules in kopf's order to an object that exists
// (DELETED events become "gone" before this is called):
// deletion in progress without our finalizer -> free; deletion in progress -> delete;
// no stored diff-base -> create; no diff and noticed at startup and not handled since
// -> resume; no diff -> noop; else update. The diff-base is read from diffBase;
// extraFields are the fields that handlers name outside the essence (status.phase):
// kopf adds them to the essence, so that a handler on such a field does fire; they are
// read without luaop's own bookkeeping (its annotations, status.<statusField>). Every
// cause, a deletion's too, carries the stored and the current essence (kopf builds
// them before it tells the reason, kopf/_core/reactor/processing.py _detect_causes).
func detectChangeCause(body map[string]any, resource causes.Resource, prefix, statusField, finalizer string, diffBase state.DiffBaseStorage, facts objectFacts, extraFields [][]string) detectedCause {
	deleting := deletionInProgress(body)
	if deleting && !hasFinalizer(body, finalizer) {
		return detectedCause{Cause: handling.ChangeCause(causes.Free, resource, body, nil, nil)}
	}
	essence := handling.Essence(body, prefix, statusField, extraFields)
	detected := func(reason causes.Reason, stored any, held map[string]heldValue, problem error) detectedCause {
		return detectedCause{Cause: handling.ChangeCause(reason, resource, body, stored, essence), held: held, diffBaseProblem: problem}
	}
	stored, found, err := diffBase.Fetch(body)
	if err != nil {
		problem := fmt.Errorf("the stored diff-base is unreadable, handling the object as new: %w", err)
		if deleting {
			return detected(causes.Delete, nil, nil, problem)
		}
		return detected(causes.Create, nil, nil, problem)
	}
	// old stays a nil interface when nothing is stored (not a nil map).
	var old any
	var held map[string]heldValue
	if found {
		stored, held = splitHeldBack(stored, prefix)
		old = stored
	}
	switch {
	case deleting:
		return detected(causes.Delete, old, held, nil)
	case !found:
		return detected(causes.Create, nil, nil, nil)
	}
	c := detected(causes.Update, old, held, nil)
	if len(c.Diff) == 0 {
		c.Reason = causes.Noop
		if facts.noticedByListing && !facts.resumeIsHandled {
			c.Reason = causes.Resume
		}
	}
	return c
}

func deletionInProgress(body map[string]any) bool {
	meta, _ := body["metadata"].(map[string]any)
	ts, _ := meta["deletionTimestamp"].(string)
	return ts != ""
}

func finalizersOf(body map[string]any) []string {
	meta, _ := body["metadata"].(map[string]any)
	raw, _ := meta["finalizers"].([]any)
	out := make([]string, 0, len(raw))
	for _, f := range raw {
		if s, ok := f.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

func hasFinalizer(body map[string]any, finalizer string) bool {
	for _, f := range finalizersOf(body) {
		if f == finalizer {
			return true
		}
	}
	return false
}

// finalizersWith returns the finalizer list with ours added or removed, keeping the
// others in place (a merge patch replaces lists whole).
func finalizersWith(body map[string]any, finalizer string, present bool) []any {
	out := []any{}
	for _, f := range finalizersOf(body) {
		if f != finalizer {
			out = append(out, f)
		}
	}
	if present {
		out = append(out, finalizer)
	}
	return out
}
