package handling

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

func TestJudge(t *testing.T) {
	boom := errors.New("boom")
	temp := &causes.TemporaryError{Message: "later", Delay: 5 * time.Second}
	perm := &causes.PermanentError{Message: "broken"}
	spec := func(mod func(*causes.Spec)) causes.Spec {
		s := causes.Spec{ID: "h"}
		if mod != nil {
			mod(&s)
		}
		return s
	}
	for _, tc := range []struct {
		name string
		spec causes.Spec
		a    Attempt
		err  error
		want Verdict
	}{
		{"success", spec(nil), Attempt{}, nil, Verdict{Outcome: OutcomeSuccess}},
		{"temporary: its own delay", spec(nil), Attempt{}, temp, Verdict{Outcome: OutcomeRetry, Class: Retry, Delay: 5 * time.Second, Retried: true}},
		{"temporary whatever the error mode", spec(func(s *causes.Spec) { s.Errors = causes.ErrorsIgnored }), Attempt{}, temp,
			Verdict{Outcome: OutcomeRetry, Class: Retry, Delay: 5 * time.Second, Retried: true}},
		{"arbitrary: the default backoff", spec(nil), Attempt{}, boom, Verdict{Outcome: OutcomeRetry, Class: Backoff, Delay: DefaultBackoff, Retried: true}},
		{"arbitrary: the handler's backoff", spec(func(s *causes.Spec) { s.Backoff = 7 * time.Second }), Attempt{}, boom,
			Verdict{Outcome: OutcomeRetry, Class: Backoff, Delay: 7 * time.Second, Retried: true}},
		{"permanent", spec(nil), Attempt{}, perm, Verdict{Outcome: OutcomeFailure, Class: Permanent, Message: "broken"}},
		{"errors=permanent", spec(func(s *causes.Spec) { s.Errors = causes.ErrorsPermanent }), Attempt{}, boom,
			Verdict{Outcome: OutcomeFailure, Class: Permanent, Message: "boom"}},
		{"errors=ignored", spec(func(s *causes.Spec) { s.Errors = causes.ErrorsIgnored }), Attempt{}, boom, Verdict{Outcome: OutcomeIgnored, Class: Ignored}},
		{"a permanent error is not ignored", spec(func(s *causes.Spec) { s.Errors = causes.ErrorsIgnored }), Attempt{}, perm,
			Verdict{Outcome: OutcomeFailure, Class: Permanent, Message: "broken"}},
		{"retries left", spec(func(s *causes.Spec) { s.Retries = 3 }), Attempt{Retries: 1}, boom,
			Verdict{Outcome: OutcomeRetry, Class: Backoff, Delay: DefaultBackoff, Retried: true}},
		{"the last allowed attempt fails", spec(func(s *causes.Spec) { s.Retries = 3 }), Attempt{Retries: 2}, boom,
			Verdict{Outcome: OutcomeFailure, Class: Backoff, Retried: true, Message: "handler h exceeded its 3 retries (last error: boom)"}},
		{"the next attempt would be past the timeout", spec(func(s *causes.Spec) { s.Timeout = 10 * time.Second }), Attempt{Runtime: 6 * time.Second}, temp,
			Verdict{Outcome: OutcomeFailure, Class: Retry, Retried: true, Message: "handler h timed out after 10s (last error: later)"}},
		{"the next attempt within the timeout", spec(func(s *causes.Spec) { s.Timeout = 10 * time.Second }), Attempt{Runtime: 4 * time.Second}, temp,
			Verdict{Outcome: OutcomeRetry, Class: Retry, Delay: 5 * time.Second, Retried: true}},
		// kopf (execution.py) looks ahead at the timeout first, then at the retries.
		{"the timeout is judged before the retries", spec(func(s *causes.Spec) { s.Retries, s.Timeout = 1, time.Second }), Attempt{Runtime: time.Hour}, boom,
			Verdict{Outcome: OutcomeFailure, Class: Backoff, Retried: true, Message: "handler h timed out after 1s (last error: boom)"}},
		{"retries alone", spec(func(s *causes.Spec) { s.Retries, s.Timeout = 1, time.Hour }), Attempt{Runtime: time.Second}, boom,
			Verdict{Outcome: OutcomeFailure, Class: Backoff, Retried: true, Message: "handler h exceeded its 1 retries (last error: boom)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Judge(tc.spec, tc.a, tc.err); got != tc.want {
				t.Errorf("Judge = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestExhausted(t *testing.T) {
	for _, tc := range []struct {
		name      string
		spec      causes.Spec
		a         Attempt
		lastError string
		want      string
	}{
		{"no limits", causes.Spec{ID: "h"}, Attempt{Retries: 100, Runtime: time.Hour}, "x", ""},
		{"timed out", causes.Spec{ID: "h", Timeout: time.Minute}, Attempt{Runtime: time.Minute}, "x", "handler h timed out after 1m0s (last error: x)"},
		{"within the timeout", causes.Spec{ID: "h", Timeout: time.Minute}, Attempt{Runtime: time.Second}, "x", ""},
		{"out of retries", causes.Spec{ID: "h", Retries: 2}, Attempt{Retries: 2}, "", "handler h exceeded its 2 retries"},
		{"a retry left", causes.Spec{ID: "h", Retries: 2}, Attempt{Retries: 1}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, over := Exhausted(tc.spec, tc.a, tc.lastError)
			if got != tc.want || over != (tc.want != "") {
				t.Errorf("Exhausted = %q, %v; want %q", got, over, tc.want)
			}
		})
	}
}

func TestVerdictError(t *testing.T) {
	boom := errors.New("boom")
	v := Judge(causes.Spec{ID: "h", Retries: 1}, Attempt{}, boom)
	err := v.Error(boom)
	if err.Error() != "handler h exceeded its 1 retries (last error: boom)" || !errors.Is(err, boom) {
		t.Errorf("Error = %v (wraps boom: %v)", err, errors.Is(err, boom))
	}
	perm := &causes.PermanentError{Message: "broken"}
	if got := Judge(causes.Spec{ID: "h"}, Attempt{}, perm).Error(perm); got != error(perm) {
		t.Errorf("a permanent error's final error is itself, got %v", got)
	}
}

func TestWithBackoff(t *testing.T) {
	if got := WithBackoff(causes.Spec{}, 3*time.Second).Backoff; got != 3*time.Second {
		t.Errorf("the operator's default: %s", got)
	}
	if got := WithBackoff(causes.Spec{Backoff: time.Second}, 3*time.Second).Backoff; got != time.Second {
		t.Errorf("the handler's own: %s", got)
	}
	if got := BackoffOf(WithBackoff(causes.Spec{}, 0)); got != DefaultBackoff {
		t.Errorf("no default anywhere: %s", got)
	}
}

func TestView(t *testing.T) {
	old := map[string]any{"spec": map[string]any{"size": 1.0, "mode": "fast"}}
	new := map[string]any{"spec": map[string]any{"size": 2.0, "mode": "fast"}}
	body := map[string]any{"spec": map[string]any{"size": 3.0}}
	update := ChangeCause(causes.Update, causes.Resource{}, body, old, new)
	create := ChangeCause(causes.Create, causes.Resource{}, body, nil, new)
	// kopf's deletion cause carries the stored and the current essence.
	deletion := ChangeCause(causes.Delete, causes.Resource{}, body, old, new)
	size := causes.Spec{ID: "s", Field: []string{"spec", "size"}}
	mode := causes.Spec{ID: "m", Field: []string{"spec", "mode"}}
	missing := causes.Spec{ID: "x", Field: []string{"spec", "other"}}
	whole := causes.Spec{ID: "w"}
	for _, tc := range []struct {
		name                     string
		spec                     causes.Spec
		cause                    causes.Cause
		takesPart, changeOfField bool
		old, new                 any
		wholeOld, wholeNew       any
	}{
		{"a field that changed", size, update, true, true, 1.0, 2.0, old, new},
		{"a field that did not change", mode, update, false, false, nil, nil, nil, nil},
		{"a field created", size, create, true, true, nil, 2.0, nil, new},
		{"a field on deletion: present in the essences", size, deletion, true, false, 1.0, 2.0, old, new},
		{"a field on deletion that did not change: present", mode, deletion, true, false, "fast", "fast", old, new},
		{"a field absent on deletion", missing, deletion, false, false, nil, nil, nil, nil},
		{"the whole object", whole, update, true, false, old, new, nil, nil},
		{"the whole object, an update without a diff", whole, causes.Cause{Reason: causes.Update, Old: old, New: old}, false, false, nil, nil, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			view, takesPart, changeOfField := View(tc.spec, tc.cause, tc.cause.Old, tc.cause.Diff)
			if takesPart != tc.takesPart || changeOfField != tc.changeOfField {
				t.Fatalf("takesPart %v, changeOfField %v; want %v, %v", takesPart, changeOfField, tc.takesPart, tc.changeOfField)
			}
			if !takesPart {
				return
			}
			if !reflect.DeepEqual(view.Old, tc.old) || !reflect.DeepEqual(view.New, tc.new) {
				t.Errorf("old %v, new %v; want %v, %v", view.Old, view.New, tc.old, tc.new)
			}
			if !reflect.DeepEqual(view.WholeOld, tc.wholeOld) || !reflect.DeepEqual(view.WholeNew, tc.wholeNew) {
				t.Errorf("whole old %v, new %v; want %v, %v", view.WholeOld, view.WholeNew, tc.wholeOld, tc.wholeNew)
			}
		})
	}
}

func TestFieldChangeFromHeldBackOld(t *testing.T) {
	old := map[string]any{"spec": map[string]any{"size": 2.0}}
	new := map[string]any{"spec": map[string]any{"size": 2.0}}
	held := map[string]any{"spec": map[string]any{"size": 1.0}} // what the handler last handled
	cause := ChangeCause(causes.Update, causes.Resource{}, nil, old, new)
	view, changed := FieldChange(causes.Spec{Field: []string{"spec", "size"}}, cause, held, state.Compare(held, new))
	if !changed || view.Old != 1.0 || view.New != 2.0 || !reflect.DeepEqual(view.WholeOld, old) {
		t.Errorf("changed %v, old %v, new %v, whole old %v", changed, view.Old, view.New, view.WholeOld)
	}
}

func TestSubhandlerView(t *testing.T) {
	old := map[string]any{"spec": map[string]any{"size": 1.0, "mode": "slow"}}
	new := map[string]any{"spec": map[string]any{"size": 2.0, "mode": "fast"}}
	size := causes.Spec{ID: "p", Field: []string{"spec", "size"}}
	parentView, _ := FieldChange(size, ChangeCause(causes.Update, causes.Resource{}, nil, old, new), old, state.Compare(old, new))
	for _, tc := range []struct {
		name     string
		parent   causes.Spec
		cause    causes.Cause
		sub      causes.Spec
		old, new any
	}{
		{"the parent's field", size, parentView, causes.Spec{Field: size.Field}, 1.0, 2.0},
		{"another field of a field handler's", size, parentView, causes.Spec{Field: []string{"spec", "mode"}}, "slow", "fast"},
		{"no field under a field handler", size, parentView, causes.Spec{}, old, new},
		{"a field under a handler of the whole", causes.Spec{}, causes.Cause{Old: old, New: new}, causes.Spec{Field: []string{"spec", "mode"}}, "slow", "fast"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := SubhandlerView(tc.parent, tc.cause, tc.sub)
			if !reflect.DeepEqual(got.Old, tc.old) || !reflect.DeepEqual(got.New, tc.new) {
				t.Errorf("old %v, new %v; want %v, %v", got.Old, got.New, tc.old, tc.new)
			}
		})
	}
}

func TestNestedTooDeep(t *testing.T) {
	if _, deep := NestedTooDeep("a/b/c/d/e/f/g/h"); deep {
		t.Errorf("7 levels are allowed")
	}
	if msg, deep := NestedTooDeep("a/b/c/d/e/f/g/h/i"); !deep || msg != "subhandlers nested deeper than 8 levels" {
		t.Errorf("8 levels: %q, %v", msg, deep)
	}
}

func TestStoreResult(t *testing.T) {
	for _, tc := range []struct {
		kind  causes.Kind
		value any
		want  map[string]any
	}{
		{causes.KindChange, "done", map[string]any{"status": map[string]any{"p/child": "done"}}},
		{causes.KindTimer, 1.0, map[string]any{"status": map[string]any{"p/child": 1.0}}},
		{causes.KindEvent, true, map[string]any{"status": map[string]any{"p/child": true}}},
		{causes.KindChange, nil, map[string]any{}},
		// kopf delivers a daemon's result too (engines/daemons.py, _daemon).
		{causes.KindDaemon, "x", map[string]any{"status": map[string]any{"p/child": "x"}}},
		{causes.KindIndex, "x", map[string]any{}},
		{causes.KindStartup, "x", map[string]any{}},
	} {
		p := state.NewPatch()
		StoreResult(p, causes.Spec{ID: "p/child", Kind: tc.kind}, tc.value)
		if !reflect.DeepEqual(p.Map(), tc.want) {
			t.Errorf("%s %v: %v, want %v", tc.kind, tc.value, p.Map(), tc.want)
		}
	}
}

func TestEssenceAddsNamedFieldsWithoutTouchingTheBody(t *testing.T) {
	body := map[string]any{
		"metadata": map[string]any{"name": "a"},
		"spec":     map[string]any{"size": 1.0},
		"status":   map[string]any{"phase": "Ready", "luaop_dev": map[string]any{"x": 1.0}},
	}
	got := Essence(body, "luaop.dev", StatusField("luaop.dev"), [][]string{{"status", "phase"}, {"status", "luaop_dev"}})
	status, _ := got["status"].(map[string]any)
	if status["phase"] != "Ready" || status["luaop_dev"] != nil {
		t.Errorf("essence status %v: want phase, without the bookkeeping", status)
	}
	if _, ok := body["status"].(map[string]any)["luaop_dev"]; !ok {
		t.Errorf("the body was written")
	}
}

func TestChangeCause(t *testing.T) {
	old := map[string]any{"spec": map[string]any{"a": 1.0}}
	new := map[string]any{"spec": map[string]any{"a": 2.0}}
	for _, tc := range []struct {
		reason       causes.Reason
		hasOld, diff bool
		hasNew       bool
	}{
		{causes.Create, false, true, true},
		{causes.Update, true, true, true},
		{causes.Resume, true, false, true},
		{causes.Delete, true, true, true},
	} {
		c := ChangeCause(tc.reason, causes.Resource{}, nil, old, new)
		if tc.reason == causes.Resume {
			c = ChangeCause(tc.reason, causes.Resource{}, nil, new, new)
		}
		if (c.Old != nil) != tc.hasOld || (c.New != nil) != tc.hasNew || (len(c.Diff) > 0) != tc.diff {
			t.Errorf("%s: old %v, new %v, diff %v", tc.reason, c.Old, c.New, c.Diff)
		}
	}
	// A resume is a cause without a change: given no stored essence (luaop test
	// without old:), its old is the current one, as the core's is.
	if c := ChangeCause(causes.Resume, causes.Resource{}, nil, nil, new); !reflect.DeepEqual(c.Old, new) {
		t.Errorf("a resume without a stored essence: old %v, want the current essence %v", c.Old, new)
	}
}
