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

// detectedCause is a change cause plus the data change handlers receive with it.
type detectedCause struct {
	reason causes.Reason
	old    any // the stored essence (update), nil otherwise
	new    any // the current essence
	diff   state.Diff
	// diffBaseProblem is set when the stored diff-base could not be read; the object
	// is then treated as never handled (create), and the problem is reported.
	diffBaseProblem error
	// held are the field handlers' held-back values stored with the diff-base
	// (heldback.go); old is without them.
	held map[string]heldValue
}

// detectChangeCause applies kopf's rules in kopf's order to an object that exists
// (DELETED events become "gone" before this is called):
// deletion in progress without our finalizer -> free; deletion in progress -> delete;
// no stored diff-base -> create; no diff and noticed at startup and not handled since
// -> resume; no diff -> noop; else update. The diff-base is read from diffBase;
// extraFields are the fields that handlers name outside the essence (status.phase):
// kopf adds them to the essence, so that a handler on such a field does fire; they are
// read without luaop's own bookkeeping (its annotations, status.<statusField>).
func detectChangeCause(body map[string]any, prefix, statusField, finalizer string, diffBase state.DiffBaseStorage, facts objectFacts, extraFields [][]string) detectedCause {
	if deletionInProgress(body) {
		if !hasFinalizer(body, finalizer) {
			return detectedCause{reason: causes.Free}
		}
		return detectedCause{reason: causes.Delete}
	}
	essence := handling.Essence(body, prefix, statusField, extraFields)
	stored, found, err := diffBase.Fetch(body)
	if err != nil {
		return detectedCause{reason: causes.Create, new: essence, diff: state.Compare(nil, essence),
			diffBaseProblem: fmt.Errorf("the stored diff-base is unreadable, handling the object as new: %w", err)}
	}
	if !found {
		return detectedCause{reason: causes.Create, new: essence, diff: state.Compare(nil, essence)}
	}
	stored, held := splitHeldBack(stored, prefix)
	diff := state.Compare(stored, essence)
	if len(diff) == 0 {
		if facts.noticedByListing && !facts.resumeIsHandled {
			return detectedCause{reason: causes.Resume, old: stored, new: essence, held: held}
		}
		return detectedCause{reason: causes.Noop, old: stored, new: essence, held: held}
	}
	return detectedCause{reason: causes.Update, old: stored, new: essence, diff: diff, held: held}
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
