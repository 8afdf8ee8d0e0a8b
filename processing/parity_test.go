package processing

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/luaop/luaop/handling"
	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/scripttest"
	"github.com/luaop/luaop/state"
)

// parityCase is one case of TestLuaopTestRunsTheCoresRules: Lua handlers of widgets
// (R in the script), an object and the cause it gets, and what must come of it in
// both engines.
type parityCase struct {
	name   string
	script string
	cause  causes.Reason
	// spec is the object's spec; old the spec handled last (update, resume: the
	// core finds it as the stored diff-base, luaop test as the case's old).
	spec, old           map[string]any
	labels, annotations map[string]any
	// deleting: the object is being deleted, held by the operator's finalizer.
	deleting bool
	// handler: luaop test runs this handler only (handler: ID), the core every
	// handler of the object; the script's other handlers must not run in the core.
	handler string
	// oldOnlyInCore: the core finds old stored, luaop test is given no old: (a
	// resume: luaop test takes the object's essence as the stored one).
	oldOnlyInCore bool
	// holdsFinalizer: a timer or a daemon keeps the operator's finalizer on the
	// object in the core (luaop test has none).
	holdsFinalizer bool

	// ran are the top-level handlers that run; status what the object's status
	// holds afterwards (results at status.<id>, what ctx.patch wrote).
	ran    []string
	status map[string]any
	// failing is the handler whose error luaop test reports and the core records:
	// the outcome both must give it (retry or failure), the delay of a retry, a
	// substring of the message.
	failing string
	outcome handling.Outcome
	delay   time.Duration
	message string
}

const parityHeader = "local luaop = require(\"luaop\")\nlocal R = \"example.luaop.dev/v1/widgets\"\n"

func parityCases() []parityCase {
	return []parityCase{{
		name: "create",
		script: `luaop.on.create(R, function(ctx) ctx.patch.status.made = ctx.spec.size; return "created" end, {id = "make"})
luaop.on.update(R, function(ctx) return "updated" end, {id = "change"})`,
		cause: causes.Create, spec: map[string]any{"size": 1},
		ran: []string{"make"}, status: map[string]any{"make": "created", "made": 1},
	}, {
		name: "update with old and new",
		script: `luaop.on.update(R, function(ctx) return {old = ctx.old.spec.size, new = ctx.new.spec.size, diff = #ctx.diff} end, {id = "change"})
luaop.on.create(R, function(ctx) return "created" end, {id = "make"})`,
		cause: causes.Update, old: map[string]any{"size": 1}, spec: map[string]any{"size": 2},
		ran: []string{"change"}, status: map[string]any{"change": map[string]any{"old": 1, "new": 2, "diff": 1}},
	}, {
		// The divergence issue 32 found: under the old rule luaop test gave a field
		// handler no whole old and new, and this subhandler never ran there.
		name: "field handler's subhandler with a value filter on another field",
		script: `luaop.on.field(R, "spec.size", function(ctx)
  ctx.subhandler(function(sub) return {mode = sub.spec.mode} end, {id = "fast", field = "spec.mode", value = "fast"})
  ctx.subhandler(function(sub) return "slow" end, {id = "slow", field = "spec.mode", value = "slow"})
  return {from = ctx.old, to = ctx.new}
end, {id = "sized"})`,
		cause: causes.Update, old: map[string]any{"size": 1, "mode": "fast"}, spec: map[string]any{"size": 2, "mode": "fast"},
		ran: []string{"sized"}, status: map[string]any{"sized": map[string]any{"from": 1, "to": 2}, "sized/fast": map[string]any{"mode": "fast"}},
	}, {
		name: "delete with the finalizer",
		script: `luaop.on.delete(R, function(ctx) ctx.patch.status.cleaned = ctx.spec.size; return "bye" end, {id = "cleanup"})
luaop.on.delete(R, function(ctx) return "optional too" end, {id = "optional_cleanup", optional = true})
luaop.on.create(R, function(ctx) return "created" end, {id = "make"})`,
		cause: causes.Delete, spec: map[string]any{"size": 3}, deleting: true,
		ran: []string{"cleanup", "optional_cleanup"}, status: map[string]any{"cleanup": "bye", "optional_cleanup": "optional too", "cleaned": 3},
	}, {
		name: "resume",
		script: `luaop.on.resume(R, function(ctx) return {seen = ctx.spec.size, old = ctx.old.spec.size} end, {id = "resumed"})
luaop.on.create(R, function(ctx) return "created" end, {id = "make"})`,
		cause: causes.Resume, old: map[string]any{"size": 4}, spec: map[string]any{"size": 4},
		ran: []string{"resumed"}, status: map[string]any{"resumed": map[string]any{"seen": 4, "old": 4}},
	}, {
		name: "temporary error: retried after its delay",
		script: `luaop.on.create(R, function(ctx)
  ctx.patch.status.tried = true
  error(luaop.temporary_error("not ready yet", 5))
end, {id = "waits"})`,
		cause: causes.Create, spec: map[string]any{"size": 1},
		ran: []string{"waits"}, status: map[string]any{"tried": true},
		failing: "waits", outcome: handling.OutcomeRetry, delay: 5 * time.Second, message: "not ready yet",
	}, {
		name:   "arbitrary error: retried after the handler's backoff",
		script: `luaop.on.create(R, function(ctx) error("boom") end, {id = "flaky", backoff = 7})`,
		cause:  causes.Create, spec: map[string]any{"size": 1},
		ran: []string{"flaky"}, status: map[string]any{},
		failing: "flaky", outcome: handling.OutcomeRetry, delay: 7 * time.Second, message: "boom",
	}, {
		name:   "permanent error",
		script: `luaop.on.create(R, function(ctx) error(luaop.permanent_error("broken for good")) end, {id = "broken"})`,
		cause:  causes.Create, spec: map[string]any{"size": 1},
		ran: []string{"broken"}, status: map[string]any{},
		failing: "broken", outcome: handling.OutcomeFailure, message: "broken for good",
	}, {
		name:   "timeout: the next attempt would start past it",
		script: `luaop.on.create(R, function(ctx) error(luaop.temporary_error("later", 10)) end, {id = "slow", timeout = 5})`,
		cause:  causes.Create, spec: map[string]any{"size": 1},
		ran: []string{"slow"}, status: map[string]any{},
		failing: "slow", outcome: handling.OutcomeFailure, message: "handler slow timed out after 5s (last error: later)",
	}, {
		name:   "retries: the last allowed attempt fails for good",
		script: `luaop.on.create(R, function(ctx) error("nope") end, {id = "once", retries = 1})`,
		cause:  causes.Create, spec: map[string]any{"size": 1},
		ran: []string{"once"}, status: map[string]any{},
		failing: "once", outcome: handling.OutcomeFailure, message: "handler once exceeded its 1 retries (last error: widgets.lua:3: nope)",
	}, {
		name: "result to status.<id>, a table and a subhandler's",
		script: `luaop.on.update(R, function(ctx)
  ctx.subhandler(function(sub) return {child = true} end, {id = "child"})
  return {size = ctx.spec.size, list = {1, 2}}
end, {id = "report"})`,
		cause: causes.Update, old: map[string]any{"size": 1}, spec: map[string]any{"size": 9},
		ran: []string{"report"}, status: map[string]any{"report": map[string]any{"size": 9, "list": []any{1, 2}}, "report/child": map[string]any{"child": true}},
	}, {
		name: "filters: labels, annotations, value, when",
		script: `luaop.on.create(R, function(ctx) return "web" end, {id = "label_match", labels = {app = "web"}})
luaop.on.create(R, function(ctx) return "db" end, {id = "label_mismatch", labels = {app = "db"}})
luaop.on.create(R, function(ctx) return "absent" end, {id = "label_absent", labels = {tier = luaop.ABSENT}})
luaop.on.create(R, function(ctx) return "team" end, {id = "annotation_present", annotations = {team = luaop.PRESENT}})
luaop.on.create(R, function(ctx) return "owner" end, {id = "annotation_mismatch", annotations = {owner = "someone"}})
luaop.on.create(R, function(ctx) return "one" end, {id = "value_match", field = "spec.size", value = 1})
luaop.on.create(R, function(ctx) return "two" end, {id = "value_mismatch", field = "spec.size", value = 2})
luaop.on.create(R, function(ctx) return "big" end, {id = "when_false", when = function(ctx) return ctx.spec.size > 5 end})
luaop.on.create(R, function(ctx) return "small" end, {id = "when_true", when = function(ctx) return ctx.spec.size < 5 end})`,
		cause: causes.Create, spec: map[string]any{"size": 1},
		labels: map[string]any{"app": "web"}, annotations: map[string]any{"team": "a"},
		ran:    []string{"annotation_present", "label_absent", "label_match", "value_match", "when_true"},
		status: map[string]any{"label_match": "web", "label_absent": "absent", "annotation_present": "team", "value_match": "one", "when_true": "small"},
	}, {
		// Issue 32's review: on a deletion a field handler's subhandler on another
		// field saw no whole object (the deletion carried no essence); kopf's
		// deletion cause carries the stored and the current one.
		name: "delete: a field handler and its subhandler on another field",
		script: `luaop.on.delete(R, function(ctx)
  ctx.subhandler(function(sub) return {mode = sub.spec.mode} end, {id = "fast", field = "spec.mode", value = "fast"})
  ctx.subhandler(function(sub) return "slow" end, {id = "slow", field = "spec.mode", value = "slow"})
  return {old = ctx.old, new = ctx.new}
end, {id = "sized_cleanup", field = "spec.size"})
luaop.on.delete(R, function(ctx) return "never" end, {id = "absent_cleanup", field = "spec.other"})
luaop.on.delete(R, function(ctx) return {old = ctx.old.spec.size, new = ctx.new.spec.size, diff = #ctx.diff} end, {id = "whole_cleanup"})`,
		cause: causes.Delete, old: map[string]any{"size": 2, "mode": "fast"}, spec: map[string]any{"size": 3, "mode": "fast"}, deleting: true,
		ran: []string{"sized_cleanup", "whole_cleanup"},
		status: map[string]any{"sized_cleanup": map[string]any{"old": 2, "new": 3}, "sized_cleanup/fast": map[string]any{"mode": "fast"},
			"whole_cleanup": map[string]any{"old": 2, "new": 3, "diff": 1}},
	}, {
		name: "resume: a field handler and its subhandler on another field",
		script: `luaop.on.resume(R, function(ctx)
  ctx.subhandler(function(sub) return {mode = sub.spec.mode} end, {id = "fast", field = "spec.mode", value = "fast"})
  return {old = ctx.old, new = ctx.new}
end, {id = "sized", field = "spec.size"})
luaop.on.resume(R, function(ctx) return "never" end, {id = "absent", field = "spec.other"})`,
		cause: causes.Resume, old: map[string]any{"size": 4, "mode": "fast"}, spec: map[string]any{"size": 4, "mode": "fast"},
		ran: []string{"sized"}, status: map[string]any{"sized": map[string]any{"old": 4, "new": 4}, "sized/fast": map[string]any{"mode": "fast"}},
	}, {
		// luaop test given no old: for a resume takes the object's essence as the
		// stored one, as the core's resume cause carries it.
		name:   "resume without old: in luaop test",
		script: `luaop.on.resume(R, function(ctx) return {old = ctx.old.spec.size, new = ctx.new.spec.size, diff = #ctx.diff} end, {id = "resumed"})`,
		cause:  causes.Resume, old: map[string]any{"size": 4}, spec: map[string]any{"size": 4}, oldOnlyInCore: true,
		ran: []string{"resumed"}, status: map[string]any{"resumed": map[string]any{"old": 4, "new": 4, "diff": 0}},
	}, {
		name: "handler: an update handler, by its id",
		script: `luaop.on.update(R, function(ctx) return {old = ctx.old.spec.size, new = ctx.new.spec.size} end, {id = "change"})
luaop.on.create(R, function(ctx) return "created" end, {id = "make"})`,
		handler: "change", cause: causes.Update, old: map[string]any{"size": 1}, spec: map[string]any{"size": 2},
		ran: []string{"change"}, status: map[string]any{"change": map[string]any{"old": 1, "new": 2}},
	}, {
		name:    "handler: a field handler, by its id, with a retry",
		script:  `luaop.on.field(R, "spec.size", function(ctx) ctx.patch.status.saw = ctx.new; error(luaop.temporary_error("wait", 3)) end, {id = "sized"})`,
		handler: "sized", cause: causes.Update, old: map[string]any{"size": 1}, spec: map[string]any{"size": 2},
		ran: []string{"sized"}, status: map[string]any{"saw": 2},
		failing: "sized", outcome: handling.OutcomeRetry, delay: 3 * time.Second, message: "wait",
	}, {
		name:    "handler: a field handler failing for good at its last retry",
		script:  `luaop.on.field(R, "spec.size", function(ctx) error("nope") end, {id = "sized", retries = 1})`,
		handler: "sized", cause: causes.Update, old: map[string]any{"size": 1}, spec: map[string]any{"size": 2},
		ran: []string{"sized"}, status: map[string]any{},
		failing: "sized", outcome: handling.OutcomeFailure, message: "handler sized exceeded its 1 retries (last error: widgets.lua:3: nope)",
	}, {
		name:    "handler: an event handler",
		script:  `luaop.on.event(R, function(ctx) return {seen = ctx.spec.size, typed = ctx.type ~= nil} end, {id = "watch"})`,
		handler: "watch", cause: causes.Create, spec: map[string]any{"size": 5},
		ran: []string{"watch"}, status: map[string]any{"watch": map[string]any{"seen": 5, "typed": true}},
	}, {
		// kopf ignores a raw event handler's error (errors mode IGNORED, no retry).
		name:    "handler: an event handler's error is ignored",
		script:  `luaop.on.event(R, function(ctx) ctx.patch.status.tried = true; error("bad event") end, {id = "watch"})`,
		handler: "watch", cause: causes.Create, spec: map[string]any{"size": 5},
		ran: []string{"watch"}, status: map[string]any{"tried": true},
		failing: "watch", outcome: handling.OutcomeIgnored, message: "bad event",
	}, {
		name:    "handler: a timer",
		script:  `luaop.timer(R, function(ctx) ctx.patch.status.ticked = true; return {size = ctx.spec.size} end, {id = "tick", interval = 3600})`,
		handler: "tick", cause: causes.Create, spec: map[string]any{"size": 6}, holdsFinalizer: true,
		ran: []string{"tick"}, status: map[string]any{"tick": map[string]any{"size": 6}, "ticked": true},
	}, {
		// kopf delivers a daemon's result after its run (engines/daemons.py).
		name:    "handler: a daemon that returns",
		script:  `luaop.daemon(R, function(ctx) ctx.patch.status.watched = true; return {done = ctx.name} end, {id = "watcher"})`,
		handler: "watcher", cause: causes.Create, spec: map[string]any{"size": 1}, holdsFinalizer: true,
		ran: []string{"watcher"}, status: map[string]any{"watcher": map[string]any{"done": "w1"}, "watched": true},
	}, {
		// One resource, two spellings: the core merges them (resources.go), luaop
		// test too, and the field one names is in the essence the other sees.
		name: "alias spellings: the kind and the plural",
		script: `local K = "example.luaop.dev/v1/Widget"
luaop.on.field(K, "spec.size", function(ctx) return {from = ctx.old, to = ctx.new} end, {id = "by_kind"})
luaop.on.update(R, function(ctx) return {size = ctx.new.spec.size} end, {id = "by_plural"})
luaop.on.create(K, function(ctx) return "created" end, {id = "make"})`,
		cause: causes.Update, old: map[string]any{"size": 1}, spec: map[string]any{"size": 2},
		ran: []string{"by_kind", "by_plural"}, status: map[string]any{"by_kind": map[string]any{"from": 1, "to": 2}, "by_plural": map[string]any{"size": 2}},
	}, {
		name: "optional delete handler: no finalizer for it, the create handler runs",
		script: `luaop.on.delete(R, function(ctx) return "gone" end, {id = "forget", optional = true})
luaop.on.create(R, function(ctx) return "created" end, {id = "make"})`,
		cause: causes.Create, spec: map[string]any{"size": 1},
		ran: []string{"make"}, status: map[string]any{"make": "created"},
	}}
}

// TestLuaopTestRunsTheCoresRules runs one table of cases through `luaop test`'s
// engine (scripttest) and through the processing core on client-go's fake dynamic
// client, with the same Lua scripts (luabind), and demands the same of both: the
// same handlers run, the object ends the same (what they wrote into ctx.patch and
// returned to status.<id>), and the progress record of a failing handler is the
// verdict of the core's rule (handling.Judge) on the error luaop test reports.
func TestLuaopTestRunsTheCoresRules(t *testing.T) {
	for _, tc := range parityCases() {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			script := parityHeader + tc.script + "\n"
			if err := os.WriteFile(filepath.Join(dir, "widgets.lua"), []byte(script), 0o644); err != nil {
				t.Fatal(err)
			}
			viaTest := runThroughLuaopTest(t, dir, tc)
			viaCore := runThroughCore(t, script, tc)

			if !slices.Equal(viaTest.ran, tc.ran) || !slices.Equal(viaCore.ran, tc.ran) {
				t.Errorf("handlers run: luaop test %v, the core %v, want %v", viaTest.ran, viaCore.ran, tc.ran)
			}
			if !reflect.DeepEqual(viaTest.object, viaCore.object) {
				t.Errorf("the objects differ:\n luaop test: %s\n   the core: %s", asJSON(viaTest.object), asJSON(viaCore.object))
			}
			if status := viaCore.object["status"]; !reflect.DeepEqual(status, jsonValue(tc.status)) {
				t.Errorf("status: got %s, want %s", asJSON(status), asJSON(tc.status))
			}
			if tc.failing == "" {
				if viaTest.err != nil {
					t.Errorf("luaop test reports an error: %v", viaTest.err)
				}
				return
			}
			checkVerdict(t, tc, viaTest, viaCore)
		})
	}
}

// parityRun is what one engine did with a case.
type parityRun struct {
	ran    []string       // top-level handlers that ran, sorted
	object map[string]any // labels, annotations, spec and status, without bookkeeping
	err    error          // luaop test: the error reported
	// verdict is luaop test's report of the operator's verdict on err.
	verdict handling.Verdict
	spec    causes.Spec // the core: the failing handler's spec
	record  state.HandlerRecord
	run     HandlerRun // the core: the failing handler's last run
	now     time.Time
}

func runThroughLuaopTest(t *testing.T, dir string, tc parityCase) parityRun {
	t.Helper()
	obj := parityObject(tc, tc.spec)
	c := scripttest.Case{Cause: string(tc.cause), Object: obj.Object}
	if tc.handler != "" {
		c.Cause, c.Handler = "", tc.handler
	}
	if tc.old != nil && !tc.oldOnlyInCore {
		c.Old = parityObject(tc, tc.old).Object
	}
	ex, err := scripttest.Execute(t.Context(), scripttest.Options{Scripts: dir}, c)
	if err != nil {
		t.Fatalf("luaop test: %v", err)
	}
	ran := slices.Clone(ex.Ran)
	slices.Sort(ran)
	return parityRun{ran: ran, object: comparable(ex.Object), err: ex.Err, verdict: ex.Verdict}
}

func runThroughCore(t *testing.T, script string, tc parityCase) parityRun {
	t.Helper()
	rt := luabind.New(luabind.Options{Shards: 1, LogEvents: "none", Logger: slog.New(slog.NewTextHandler(testLogOutput(), nil))})
	t.Cleanup(rt.Close)
	if _, err := rt.Load(t.Context(), []luabind.Script{{Name: "widgets.lua", Source: []byte(script)}}); err != nil {
		t.Fatal(err)
	}
	obj := parityObject(tc, tc.spec)
	prefix := "luaop.dev"
	if tc.old != nil {
		// The state the last cause left: its essence stored as the diff-base.
		essence := handling.Essence(parityObject(tc, tc.old).Object, prefix, handling.StatusField(prefix), handling.ChangeFields(rt.Specs()))
		p := state.NewPatch()
		if err := state.NewAnnotationsDiffBase(prefix).Store(obj.Object, p, essence); err != nil {
			t.Fatal(err)
		}
		obj.SetAnnotations(mergedStrings(obj.GetAnnotations(), p.Map()))
	}
	if tc.deleting {
		obj.SetFinalizers([]string{Finalizer(prefix)})
		obj.Object["metadata"].(map[string]any)["deletionTimestamp"] = "2026-11-30T12:00:00Z"
	}
	var mu sync.Mutex
	ranSet := map[string]bool{}
	var failingRun HandlerRun
	opts := Options{ProgressStorage: StorageAnnotations, DiffBaseStorage: StorageAnnotations,
		OnHandlerRun: func(r HandlerRun) {
			mu.Lock()
			defer mu.Unlock()
			if !strings.Contains(r.HandlerID, "/") {
				ranSet[r.HandlerID] = true
			}
			if r.HandlerID == tc.failing {
				failingRun = r
			}
		}}
	e := startEnvOn(t, rt, opts, "", nil, obj)
	ran := func() []string {
		mu.Lock()
		defer mu.Unlock()
		var ids []string
		for id := range ranSet {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		return ids
	}
	e.eventually("the handlers "+strings.Join(tc.ran, ", ")+" ran", func() bool {
		got := e.get("w1")
		done := tc.failing != "" || !tc.deleting || !slices.Contains(got.GetFinalizers(), Finalizer(prefix))
		return done && len(ran()) >= len(tc.ran)
	})
	e.settleIn(widgetsGVR, "w1")
	got := e.get("w1")
	if tc.deleting && slices.Contains(got.GetFinalizers(), Finalizer(prefix)) {
		t.Errorf("the core kept its finalizer after the delete handlers")
	}
	if !tc.deleting && !tc.holdsFinalizer && slices.Contains(got.GetFinalizers(), Finalizer(prefix)) {
		t.Errorf("finalizers %v: no handler of the case needs one (an optional delete handler does not)", got.GetFinalizers())
	}
	out := parityRun{ran: ran(), object: comparable(got.Object), now: e.clock.Now()}
	if tc.failing != "" {
		for _, s := range rt.Specs() {
			if s.ID == tc.failing {
				out.spec = s
			}
		}
		// A retrying handler's record stays on the object; a failed one's goes with
		// the cause it ended, and its run says how.
		out.record, _ = state.NewAnnotationsProgress(prefix).Fetch(got.Object, tc.failing)
		mu.Lock()
		out.run = failingRun
		mu.Unlock()
	}
	return out
}

// checkVerdict compares the verdict luaop test reports on the failing handler's
// error with what the core recorded of it, and both with the case.
func checkVerdict(t *testing.T, tc parityCase, viaTest, viaCore parityRun) {
	t.Helper()
	if viaTest.err == nil {
		t.Fatalf("luaop test reports no error of %s", tc.failing)
	}
	v := viaTest.verdict
	if v.Outcome != tc.outcome {
		t.Errorf("luaop test's verdict on %v: %s, want %s", viaTest.err, v.Outcome, tc.outcome)
	}
	rec, run := viaCore.record, viaCore.run
	if run.Outcome != v.Outcome {
		t.Errorf("the core's run of %s: %s, luaop test's verdict: %s", tc.failing, run.Outcome, v.Outcome)
	}
	message := ""
	if run.Err != nil {
		message = run.Err.Error()
	}
	switch v.Outcome {
	case handling.OutcomeRetry:
		if rec.Finished() || rec.Retries != 1 || rec.Delayed == nil || rec.Delayed.Sub(viaCore.now) != v.Delay || v.Delay != tc.delay {
			t.Errorf("the core's record %+v: want a retry in %s (luaop test: %s), retries 1", rec, tc.delay, v.Delay)
		}
		if rec.Message != handling.ErrorMessage(viaTest.err) {
			t.Errorf("the core's message %q, luaop test's error %q", rec.Message, handling.ErrorMessage(viaTest.err))
		}
	case handling.OutcomeFailure:
		if message != v.Message {
			t.Errorf("the core's failure %q, luaop test's %q", message, v.Message)
		}
	}
	if !strings.Contains(message, tc.message) {
		t.Errorf("the core's message %q, want it to contain %q", message, tc.message)
	}
}

// parityObject is the case's widget with a spec.
func parityObject(tc parityCase, spec map[string]any) *unstructured.Unstructured {
	u := widgetObject("w1", "uid-w1", jsonValue(spec).(map[string]any))
	meta := u.Object["metadata"].(map[string]any)
	if tc.labels != nil {
		meta["labels"] = jsonValue(tc.labels)
	}
	if tc.annotations != nil {
		meta["annotations"] = jsonValue(tc.annotations)
	}
	return u
}

// comparable is what both engines must agree on of an object: its labels,
// annotations, spec and status, without the operator's bookkeeping (annotations
// of its prefix, status.luaop_dev), the test's barrier and what only the API server
// keeps (resourceVersion, finalizers, deletion).
func comparable(obj map[string]any) map[string]any {
	obj = jsonValue(obj).(map[string]any)
	out := map[string]any{"spec": obj["spec"]}
	meta, _ := obj["metadata"].(map[string]any)
	if l, ok := meta["labels"]; ok {
		out["labels"] = l
	}
	if a, _ := meta["annotations"].(map[string]any); len(a) > 0 {
		kept := map[string]any{}
		for k, v := range a {
			if !strings.HasPrefix(k, "luaop.dev/") {
				kept[k] = v
			}
		}
		if len(kept) > 0 {
			out["annotations"] = kept
		}
	}
	status, _ := obj["status"].(map[string]any)
	kept := map[string]any{}
	for k, v := range status {
		if k != "luaop_dev" && k != "testBarrier" {
			kept[k] = v
		}
	}
	out["status"] = kept
	return out
}

func mergedStrings(into map[string]string, patch map[string]any) map[string]string {
	if into == nil {
		into = map[string]string{}
	}
	meta, _ := patch["metadata"].(map[string]any)
	ann, _ := meta["annotations"].(map[string]any)
	for k, v := range ann {
		if s, ok := v.(string); ok {
			into[k] = s
		}
	}
	return into
}

// jsonValue is v as JSON decodes it (numbers float64).
func jsonValue(v any) any {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	var out any
	if err := json.Unmarshal(data, &out); err != nil {
		panic(err)
	}
	return out
}

func asJSON(v any) string {
	data, _ := json.Marshal(v)
	return string(data)
}
